"""The window queries that find ancestors agree with walking the parent links, on real runs."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import dlprof
from dlprof.analysis.ancestry import nearest_ancestor, nested_in_same
from dlprof.store.reader import Run


def walked(run: Run, wanted: pd.Series) -> dict[int, int | None]:
    """Each CPU slice's innermost wanted ancestor, by following parent_id up."""
    slices = run.slices
    parent = dict(zip(slices["id"].tolist(), slices["parent_id"].tolist(), strict=True))
    is_wanted = dict(zip(slices["id"].tolist(), wanted.tolist(), strict=True))
    found: dict[int, int | None] = {}
    for slice_id, device in zip(slices["id"].tolist(), slices["device"].tolist(), strict=True):
        if device != "cpu":
            continue
        up = parent[slice_id]
        while up is not pd.NA and up is not None and not is_wanted[up]:
            up = parent[up]
        found[slice_id] = None if up is pd.NA or up is None else int(up)
    return found


@pytest.mark.parametrize("fixture", ["cnn_run", "gpu_run", "two_rank_gloo_run"])
@pytest.mark.parametrize("kind", ["op", "module", "step"])
def test_nearest_ancestor_is_the_walk_up(fixture: str, kind: str, request: pytest.FixtureRequest) -> None:
    run = dlprof.load(request.getfixturevalue(fixture))
    expected = walked(run, run.slices["kind"] == kind)
    answers = run.sql(nearest_ancestor(run.engine.dialect, f"kind = '{kind}'"))
    got = {int(i): (None if pd.isna(a) else int(a))
           for i, a in zip(answers["id"], answers["ancestor_id"], strict=True)}
    assert got == expected
    assert any(v is not None for v in expected.values()) or kind != "op"


def test_nested_in_same_name_is_the_walk_up(trace_diff_runs: tuple[Path, Path]) -> None:
    run = dlprof.load(trace_diff_runs[0])
    slices = run.slices
    by_id = slices.set_index("id")
    expected = {}
    for slice_id, name, device in zip(slices["id"], slices["name"], slices["device"], strict=True):
        up, inside = by_id.at[slice_id, "parent_id"], False
        while device == "cpu" and not pd.isna(up):
            if by_id.at[up, "name"] == name:
                inside = True
                break
            up = by_id.at[up, "parent_id"]
        expected[int(slice_id)] = inside
    got = run.sql(nested_in_same("name"))
    assert dict(zip(got["id"].astype(int), got["nested"].astype(bool), strict=True)) == expected
    assert any(expected.values())
