"""Nesting a rank's slices as they are stored: depth, parent and self time on each thread, kept
flat on device streams, and the repairs counted when clocks disagree."""

from __future__ import annotations

import pyarrow as pa

from dlprof.store.nesting import innermost_containing, nest_slices, nest_window
from tests.builders import slice_table


def by_name(table: pa.Table) -> dict[str, dict[str, object]]:
    return {row["name"]: row for row in table.to_pylist()}


def test_nesting_sets_depth_parent_and_self_time() -> None:
    table = slice_table([
        (3, 7, "op", "child2", 150, 40),
        (1, 7, "step", "step", 100, 100),
        (2, 7, "op", "child1", 110, 30),
        (4, 7, "op", "grandchild", 115, 10),
        (5, 8, "op", "other-thread", 120, 5),
    ])
    nested, report = nest_slices(table)
    rows = by_name(nested)
    assert rows["step"]["depth"] == 0 and rows["step"]["parent_id"] is None
    assert rows["child1"]["parent_id"] == 1 and rows["child2"]["parent_id"] == 1
    assert rows["grandchild"]["parent_id"] == 2 and rows["grandchild"]["depth"] == 2
    assert rows["step"]["self_ns"] == 100 - 30 - 40
    assert rows["child1"]["self_ns"] == 20
    assert rows["other-thread"]["depth"] == 0, "threads nest separately"
    assert report.clipped_to_parent == 0


def test_nesting_clips_overrunning_child_and_counts_it() -> None:
    nested, report = nest_slices(slice_table([(1, 1, "op", "parent", 0, 100), (2, 1, "op", "late", 60, 50)]))
    rows = by_name(nested)
    assert rows["late"]["parent_id"] == 1
    assert (rows["late"]["start_ns"], rows["late"]["dur_ns"]) == (60, 40)
    assert report.clipped_to_parent == 1 and report.extended_over_parent == 0


def test_a_slice_mostly_after_the_one_it_started_in_is_extended_to_contain_it() -> None:
    # A layer's backward, timed by dlprof, starts inside the autograd op it runs (timed by
    # torch) and ends long after it: the op is the layer's, so the layer contains it.
    nested, report = nest_slices(slice_table([
        (1, 1, "step", "step", 0, 10_000),
        (2, 1, "op", "evaluate_function: AddmmBackward0", 1_000, 300),
        (3, 1, "module", "fc backward", 1_060, 5_000),
        (4, 1, "op", "evaluate_function: TBackward0", 2_000, 1_000),
        (5, 1, "op", "aten::mm", 1_100, 100),
    ]))
    rows = by_name(nested)
    assert (rows["fc backward"]["start_ns"], rows["fc backward"]["dur_ns"]) == (1_000, 5_060)
    assert rows["fc backward"]["parent_id"] == 1 and rows["fc backward"]["depth"] == 1
    assert rows["evaluate_function: AddmmBackward0"]["parent_id"] == 3
    assert rows["aten::mm"]["parent_id"] == 2 and rows["aten::mm"]["depth"] == 3
    assert rows["evaluate_function: TBackward0"]["parent_id"] == 3
    assert rows["fc backward"]["self_ns"] == 5_060 - 300 - 1_000
    assert rows["step"]["self_ns"] == 10_000 - 5_060
    assert report.extended_over_parent == 1 and report.clipped_to_parent == 0


def test_identical_timestamps_put_outer_kind_first() -> None:
    nested, _ = nest_slices(slice_table([(1, 1, "op", "op", 0, 50), (2, 1, "region", "region", 0, 50),
                                    (3, 1, "step", "step", 0, 50)]))
    rows = by_name(nested)
    assert rows["step"]["depth"] == 0
    assert rows["region"]["parent_id"] == 3
    assert rows["op"]["parent_id"] == 2


def test_zero_duration_slices_do_not_swallow_followers() -> None:
    nested, _ = nest_slices(slice_table([(1, 1, "op", "a", 10, 0), (2, 1, "op", "b", 10, 0),
                                    (3, 1, "op", "outer", 20, 10), (4, 1, "op", "inside", 25, 0)]))
    rows = by_name(nested)
    assert rows["a"]["depth"] == 0 and rows["b"]["depth"] == 0
    assert rows["inside"]["parent_id"] == 3


def test_innermost_containing_finds_deepest_interval() -> None:
    import numpy as np

    starts = np.array([0, 10, 12, 50])
    ends = np.array([100, 20, 15, 60])
    found = innermost_containing(starts, ends, np.array([13, 11, 30, 55, 100, -1]))
    assert found.tolist() == [2, 1, 0, 3, -1, -1]


def test_device_streams_stay_flat_and_overlaps_are_counted() -> None:
    table = slice_table([(1, 7, "kernel", "k1", 0, 100), (2, 7, "kernel", "k2", 50, 100), (3, 7, "kernel", "k3", 300, 10)])
    table = table.set_column(table.schema.get_field_index("device"), "device",
                             pa.array(["cuda:0"] * 3).dictionary_encode())
    nested, report = nest_slices(table)
    rows = by_name(nested)
    assert [rows[k]["depth"] for k in ("k1", "k2", "k3")] == [0, 0, 0]
    assert rows["k2"]["dur_ns"] == 100 and rows["k2"]["self_ns"] == 100, "device time is never clipped"
    assert report.overlapping_on_device == 1 and report.clipped_to_parent == 0


def test_a_slice_that_began_late_in_the_one_before_comes_after_it() -> None:
    # Two layers' backward slices from hooks on one autograd node: the later layer's start is
    # read a moment before the earlier layer's end.
    nested, report = nest_slices(slice_table([
        (1, 1, "module", "relu backward", 1_000, 2_000),
        (2, 1, "module", "conv backward", 2_950, 3_000),
    ]))
    rows = by_name(nested)
    assert (rows["conv backward"]["start_ns"], rows["conv backward"]["dur_ns"]) == (3_000, 2_950)
    assert rows["conv backward"]["parent_id"] is None and rows["conv backward"]["depth"] == 0
    assert rows["relu backward"]["self_ns"] == 2_000
    assert report.moved_past_parent == 1 and report.extended_over_parent == 0


def _anchors(rows: list[tuple[int, str, str, int]]) -> pa.Table:
    """Slices still open at a save: (id, kind, name, start_ns) on pid 1, thread 1."""
    ids, kinds, names, starts = zip(*rows, strict=True)
    return pa.table({"id": pa.array(ids, pa.int64()), "pid": pa.array([1] * len(rows), pa.int64()),
                     "tid": pa.array([1] * len(rows), pa.int64()), "kind": pa.array(kinds),
                     "name": pa.array(names), "start_ns": pa.array(starts, pa.int64())})


def test_a_step_first_open_at_a_save_ends_the_region_it_began_late_in() -> None:
    """The next step begins late inside an epoch region that ends soon after (the epoch's last
    batch) and is open at the save: it cannot move, and stretched back over the epoch it would
    swallow the steps before; the epoch ends where the step began, also one open at an earlier
    save (its children there all ended before this step began)."""
    cases = [
        (frozenset(), [(1, 1, "step", "ProfilerStep#0", 0, 100), (2, 1, "region", "epoch", 40, 140)], (0, 150)),
        (frozenset({2}), [(2, 1, "region", "epoch", 40, 120)], (40, 110)),
    ]
    for open_before, rows, (start, dur) in cases:
        table = slice_table([*rows, (3, 1, "region", "tail", 155, 3)])
        nested, report, times = nest_window(table, _anchors([(9, "step", "ProfilerStep#1", 150)]), open_before)
        got = by_name(nested)
        assert (got["epoch"]["start_ns"], got["epoch"]["dur_ns"]) == (start, dur)
        assert got["tail"]["parent_id"] == 9, "what follows the boundary is the next step's"
        assert times.starts_ns == {} and report.ended_at_open_slice == 1


def test_a_step_open_at_an_earlier_save_is_stretched_back_as_before() -> None:
    """The rule above is for a step first open at this save: one open at an earlier save had the
    body around it there, so it keeps that order."""
    rows = slice_table([(2, 1, "region", "body", 40, 70)])
    _, report, times = nest_window(rows, _anchors([(9, "step", "ProfilerStep#1", 100)]), frozenset({2, 9}))
    assert report.ended_at_open_slice == 0 and times.starts_ns == {9: 40}
