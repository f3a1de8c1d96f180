"""TAU's flat profile per thread: values on hand-built runs with known nesting, and a real run.

Hand-built runs go through the real store (chunk, compact, manifest) so that nesting, parents and
self times are the store's own, not made up by the test.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

import dlprof
from dlprof.analysis.tau_profile import (
    OTHERS,
    PROFILE_COLUMNS,
    SummaryKind,
    fold_others,
    folded_inclusive,
    function_summaries,
    tau_profiles,
)
from dlprof.keys import RunStatus, StoreTable
from dlprof.store.manifest import Manifest
from dlprof.store.writer import RankWriter
from tests.builders import MS, NESTED, SEVERAL_TRACKS, Span, write_span_run


def rows(functions: pd.DataFrame) -> dict[str, dict[str, float]]:
    """A pprof table as {name: {column: value}}, times in milliseconds."""
    result = {}
    for record in functions.to_dict("records"):
        result[str(record["name"])] = {
            "excl": record["exclusive_ns"] / MS,
            "incl": record["inclusive_ns"] / MS,
            "calls": record["calls"],
            "subrs": record["subrs"],
            "pct": round(record["time_pct"], 3),
            "per_call": record["inclusive_per_call_ns"] / MS,
        }
    return result


@pytest.fixture()
def nested_run(tmp_path: Path) -> dlprof.Run:
    return dlprof.load(write_span_run(tmp_path / "nested", NESTED))


def test_inclusive_exclusive_calls_and_subrs_follow_nesting(nested_run: dlprof.Run) -> None:
    (profile,) = tau_profiles(nested_run)
    table = rows(profile.functions)
    assert table["main"] == {
        "excl": 45.0, "incl": 100.0, "calls": 1, "subrs": 3, "pct": 66.667, "per_call": 100.0,
    }
    assert table["a"] == {
        "excl": 40.0, "incl": 50.0, "calls": 2, "subrs": 1, "pct": 33.333, "per_call": 25.0,
    }
    assert table["b"] == {
        "excl": 10.0, "incl": 10.0, "calls": 1, "subrs": 0, "pct": 6.667, "per_call": 10.0,
    }
    assert table["c"]["incl"] == 5.0 and table["c"]["subrs"] == 0
    assert table["late"] == {
        "excl": 30.0, "incl": 30.0, "calls": 1, "subrs": 0, "pct": 20.0, "per_call": 30.0,
    }
    assert list(profile.functions.columns) == PROFILE_COLUMNS


def test_time_is_a_share_of_the_thread_wall_time_not_of_its_longest_slice(
    nested_run: dlprof.Run,
) -> None:
    (profile,) = tau_profiles(nested_run)
    assert profile.wall_ns == 150 * MS
    # main is the outermost slice, yet the thread ran 50 ms outside it.
    assert profile.functions.iloc[0]["time_pct"] == pytest.approx(100 * 100 / 150)
    # Exclusive times of all names add up to the time covered by slices (150 - 20 ms idle).
    assert profile.functions["exclusive_ns"].sum() == 130 * MS


def test_rows_are_sorted_by_inclusive_time_then_name(tmp_path: Path) -> None:
    spans = [*NESTED, Span("aa_tie", 200, 30)]  # ties "late" at 30 ms: name breaks the tie
    (profile,) = tau_profiles(dlprof.load(write_span_run(tmp_path / "run", spans)))
    assert profile.functions["name"].tolist() == ["main", "a", "aa_tie", "late", "b", "c"]


def test_direct_recursion_counts_the_outermost_activation_only(tmp_path: Path) -> None:
    spans = [Span("f", 0, 100), Span("f", 10, 50), Span("f", 20, 20), Span("g", 30, 5)]
    (profile,) = tau_profiles(dlprof.load(write_span_run(tmp_path / "run", spans)))
    f = rows(profile.functions)["f"]
    # Summing every activation would give 170 ms; the inner two lie within the outer one.
    assert f["incl"] == 100.0
    assert f["calls"] == 3
    assert f["subrs"] == 3  # each f called one thing: f, f, g
    assert f["excl"] == 95.0  # everything but g
    assert f["per_call"] == pytest.approx(100 / 3)
    assert f["pct"] == 100.0


def test_indirect_recursion_through_another_name_is_not_double_counted(tmp_path: Path) -> None:
    spans = [
        Span("f", 0, 100), Span("h", 10, 80), Span("f", 20, 40),  # f -> h -> f
        Span("f", 200, 10),  # a second, separate outermost activation
    ]
    (profile,) = tau_profiles(dlprof.load(write_span_run(tmp_path / "run", spans)))
    table = rows(profile.functions)
    assert table["f"]["incl"] == 110.0
    assert table["f"]["calls"] == 3
    assert table["h"]["incl"] == 80.0
    assert table["h"]["excl"] == 40.0


def test_a_name_nested_under_a_different_name_twice_counts_both(tmp_path: Path) -> None:
    # Siblings of one name are not recursion: both add to the inclusive time.
    spans = [Span("outer", 0, 100), Span("x", 10, 20), Span("x", 40, 20)]
    (profile,) = tau_profiles(dlprof.load(write_span_run(tmp_path / "run", spans)))
    assert rows(profile.functions)["x"]["incl"] == 40.0


def test_one_profile_per_rank_and_thread_cpu_threads_first(tmp_path: Path) -> None:
    profiles = tau_profiles(dlprof.load(write_span_run(tmp_path / "run", SEVERAL_TRACKS)))
    found = [(p.rank, p.thread, p.tid, p.device, p.wall_ns // MS) for p in profiles]
    # As TAU numbers them: CPU threads by first activity, then GPU streams, though the stream
    # started before the second thread.
    assert found == [
        (0, 0, 1, "cpu", 30),
        (0, 1, 2, "cpu", 30),
        (0, 2, 7, "cuda:0", 4),
        (1, 0, 1, "cpu", 50),
    ]
    stream = profiles[2]
    assert stream.functions["name"].tolist() == ["kernel"]


def test_rank_selects_one_rank(tmp_path: Path) -> None:
    run = dlprof.load(write_span_run(tmp_path / "run", SEVERAL_TRACKS))
    (only,) = tau_profiles(run, rank=1)
    assert (only.rank, only.thread) == (1, 0)
    assert tau_profiles(run, rank=5) == []


def test_total_and_mean_summaries_merge_threads_by_name(tmp_path: Path) -> None:
    profiles = tau_profiles(dlprof.load(write_span_run(tmp_path / "run", SEVERAL_TRACKS)))
    total, mean = function_summaries(profiles)
    assert (total.kind, mean.kind) == (SummaryKind.TOTAL, SummaryKind.MEAN)
    assert total.threads == mean.threads == 4
    assert total.wall_ns == (30 + 4 + 30 + 50) * MS
    x_total, x_mean = rows(total.functions)["x"], rows(mean.functions)["x"]
    assert x_total["incl"] == 10 + 30 + 50 and x_total["calls"] == 3
    # As TAU does, the mean divides by every thread, including the stream x never ran on.
    assert x_mean["incl"] == pytest.approx(90 / 4)
    assert x_mean["calls"] == pytest.approx(3 / 4)
    assert rows(mean.functions)["kernel"]["incl"] == pytest.approx(4 / 4)
    assert x_total["pct"] == x_mean["pct"] == round(100 * 90 / 114, 3)
    assert total.functions["name"].tolist() == ["x", "y", "kernel"]


def test_summaries_of_nothing_are_empty() -> None:
    assert function_summaries([]) == []


def test_head_folds_the_remaining_rows_into_others(nested_run: dlprof.Run) -> None:
    (profile,) = tau_profiles(nested_run)
    cut = profile.head(2)
    table = rows(cut.functions)
    assert list(table) == ["main", "a", OTHERS]
    assert table[OTHERS]["incl"] == 30 + 10 + 5  # late, b, c
    assert table[OTHERS]["calls"] == 3
    assert table[OTHERS]["per_call"] == 15.0
    assert table[OTHERS]["pct"] == 30.0
    assert cut.functions.dtypes.to_dict() == profile.functions.dtypes.to_dict()
    # One row kept: a (nesting b) is folded too, so exclusive and inclusive sums differ.
    assert rows(profile.head(1).functions)[OTHERS] == {
        "excl": 40 + 30 + 10 + 5, "incl": 50 + 30 + 10 + 5, "calls": 5, "subrs": 1,
        "pct": round(100 * 95 / 150, 3), "per_call": 95 / 5,
    }
    assert profile.head(0).functions is profile.functions
    assert profile.head(None).functions is profile.functions
    assert fold_others(profile.functions, 10, profile.wall_ns) is profile.functions


def test_repeated_ids_within_a_rank_are_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    table = pa.table(
        {
            "id": pa.array([5, 5], pa.int64()),
            "pid": pa.array([1, 1], pa.int64()),
            "tid": pa.array([1, 1], pa.int64()),
            "device": ["cpu", "cpu"],
            "kind": ["op", "op"],
            "name": ["p", "q"],
            "start_ns": pa.array([0, 10], pa.int64()),
            "dur_ns": pa.array([100, 5], pa.int64()),
        }
    )
    writer = RankWriter(run_dir, 0)
    writer.write_chunk(StoreTable.SLICES, table, "test")
    writer.compact()
    Manifest(name="dup", command=["x"], status=RunStatus.COMPLETE).write(run_dir)
    with pytest.raises(ValueError, match="slice id 5 is used twice"):
        tau_profiles(dlprof.load(run_dir))


def test_a_run_without_slices_has_no_profiles(tmp_path: Path) -> None:
    assert tau_profiles(dlprof.load(write_span_run(tmp_path / "empty", []))) == []


def test_real_cnn_run_tables_agree_with_its_slices(cnn_run: Path) -> None:
    run = dlprof.load(cnn_run)
    slices = run.slices
    profiles = tau_profiles(run)
    tracks = slices.groupby(["rank", "pid", "tid", "device"]).size()
    assert len(profiles) == len(tracks)
    for profile in profiles:
        mine = slices[
            (slices["rank"] == profile.rank) & (slices["pid"] == profile.pid)
            & (slices["tid"] == profile.tid) & (slices["device"] == profile.device)
        ]
        functions = profile.functions
        assert functions["calls"].sum() == len(mine)
        assert functions["exclusive_ns"].sum() == mine["self_ns"].sum()
        assert functions["subrs"].sum() == mine["parent_id"].notna().sum()
        assert functions["name"].is_unique
        assert set(functions["name"]) == set(mine["name"])
        inclusive = functions["inclusive_ns"].tolist()
        assert inclusive == sorted(inclusive, reverse=True)
        assert (functions["inclusive_ns"] >= functions["exclusive_ns"]).all()
        assert (functions["time_pct"] <= 100.0).all()
        wall = (mine["start_ns"] + mine["dur_ns"]).max() - mine["start_ns"].min()
        assert profile.wall_ns == wall
    main = profiles[0]
    assert (main.rank, main.thread) == (0, 0)
    train_step = main.functions.set_index("name").loc["train_step"]
    # The fixture runs six steps, each inside one train_step region.
    assert train_step["calls"] == 6
    assert train_step["inclusive_ns"] == slices.loc[slices["name"] == "train_step", "dur_ns"].sum()


def test_others_fold_the_users_time_not_dlprofs_pauses(tmp_path: Path) -> None:
    """The -others- row's inclusive time, as every row's, leaves out dlprof's pauses inside the
    slices it folds."""
    # A pause inside late (120-150 ms), which is folded below.
    run = dlprof.load(write_span_run(tmp_path / "paused", [*NESTED, Span("dlprof::save", 130, 10, kind="profiler")]))
    profiles = tau_profiles(run)
    per_thread, total = folded_inclusive(run, profiles, 2)
    # main and a kept; late (30 ms, 10 of them paused), b and c folded; the pause inside late.
    assert list(per_thread.values()) == [(20 + 10 + 5) * MS] and total == (20 + 10 + 5) * MS
    assert rows(profiles[0].functions)["late"]["incl"] == 20.0, "the table's own row, the same user time"
