"""What every run must agree on however it was saved: each CPU slice inside its parent, one level
below it, no two slices of a thread crossing, and self times that are durations less children's.
Shared by the tests of saves and of dlprof's pauses."""

from __future__ import annotations

import pandas as pd

import dlprof


def assert_well_nested(run: dlprof.Run) -> None:
    """Every CPU slice lies inside its parent and is one level below it: what every window of
    the run must agree on (the engine's ancestor queries rely on it)."""
    slices = run.slices[run.slices.device == "cpu"]
    parents = slices[["id", "start_ns", "dur_ns", "depth"]].rename(
        columns={"id": "parent_id", "start_ns": "p_start", "dur_ns": "p_dur", "depth": "p_depth"})
    children = slices.dropna(subset=["parent_id"]).merge(parents, on="parent_id", how="left")
    assert children.p_start.notna().all(), "every parent is a slice of the run"
    inside = (children.start_ns >= children.p_start) & (
        children.start_ns + children.dur_ns <= children.p_start + children.p_dur)
    assert inside.all(), children[~inside][["name", "parent_id"]].head().to_string()
    one_below = children.depth == children.p_depth + 1
    assert one_below.all(), children[~one_below][["id", "name", "depth", "parent_id", "p_depth"]].head().to_string()
    assert (slices[slices.parent_id.isna()].depth == 0).all()
    # No two slices of a thread cross: in track order, a slice's parent is the innermost earlier
    # one not yet ended (what the engine's ancestor queries compute instead of walking up).
    crossing = []
    ordered = slices.assign(neg_dur=-slices.dur_ns).sort_values(["rank", "pid", "tid", "start_ns", "neg_dur", "depth", "id"])
    for _, thread in ordered.groupby(["rank", "pid", "tid"], sort=False):
        open_ends: list[tuple[int, int]] = []  # (end, id), innermost last
        for slice_id, start, dur, parent in zip(thread.id, thread.start_ns, thread.dur_ns, thread.parent_id,
                                                strict=True):
            while open_ends and start >= open_ends[-1][0]:
                open_ends.pop()
            innermost = open_ends[-1][1] if open_ends else None
            if (None if pd.isna(parent) else int(parent)) != innermost:
                crossing.append((int(slice_id), parent, innermost))
            if dur > 0:
                open_ends.append((start + dur, int(slice_id)))
    assert not crossing, f"{len(crossing)} slices cross a neighbour (id, parent, innermost open): {crossing[:5]}"


def assert_self_time_is_what_children_leave(run: dlprof.Run) -> None:
    """Every CPU slice's self time is its duration less its children's (none below zero)."""
    slices = run.slices[run.slices.device == "cpu"].set_index("id")
    children = slices.dropna(subset=["parent_id"]).groupby("parent_id").dur_ns.sum()
    expected = (slices.dur_ns - children.reindex(slices.index).fillna(0)).clip(lower=0)
    wrong = slices.self_ns != expected
    assert not wrong.any(), slices[wrong][["name", "self_ns"]].assign(expected=expected[wrong]).head().to_string()
