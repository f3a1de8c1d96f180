"""Nesting of slices within one thread: depth, parent, self time, computed once.

Every table the views print is then a group-by, not a tree walk. Real traces break nesting
(overlapping kernels on one stream, a child a few nanoseconds longer than its parent, identical
timestamps); this is the one place that decides, and it counts what it decided so the manifest
can say so: a CPU slice that overruns its parent a little is clipped to it; one that lies mostly
after the slice it started in (two sources timing neighbouring work) starts at that slice's end
if it began late in it, or is extended back to contain it if it began early in it (a layer's
backward starting inside the autograd op it runs); slices on a device stream
never nest (a stream runs one piece of work after another), so overlaps there are kept and only
counted.

A run is nested one save at a time (:func:`nest_window`). A slice still open when its save was
made (a region around the whole training loop) takes part as an *anchor*: a placeholder with
its id and start and no end yet, so that the slices of that save nest under it as they would in
the whole run; its own row comes with a later save, and the time of its children in earlier
saves is handed back so that its self time can be made whole. An anchor cannot move, so
where a step first open at a save began late inside a region (the epoch's last batch), the
region ends there rather than the step being stretched back over it. A row that outlives the
slice it began in (a loop body begun late in a first step that holds start-up, ended after the
step by the optimizer's hook) ends with that slice: stretched back over it, the children it
took in the earlier save, which lie inside that slice too, would cross it.

dlprof's own pauses of the program (slices of kind ``profiler``: a save, a profiler cycle's stop
and start) nest inside whatever was open on the thread they held; each slice's ``pause_ns`` is
the time of the pauses inside it at any depth, computed here once, so that every analysis can
leave them out of the user's time (``dur_ns - pause_ns``; its self time already does, a pause
being a child). An anchor's pauses in a window are handed back like its children's time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dlprof.keys import NESTING_ORDER, Kind
from dlprof.store.backward_layers import align_backward_layers

_UNRANKED = max(NESTING_ORDER.values()) + 1
# A step open at a save ends a region (or a data wait) it began late in; layers and ops, timed
# by other sources, are left to the usual rules.
_REGION_RANK = NESTING_ORDER[Kind.REGION]
# Where an anchor (a slice still open) ends: after anything recorded.
_OPEN_END_NS = 1 << 62
# Passes that may move slices before the last, which only clips.
_ADJUSTING_PASSES = 3


@dataclass
class NestingReport:
    """What :func:`nest_slices` changed to make the slices nest."""

    clipped_to_parent: int = 0
    # CPU slices mostly after the slice they started in: started at its end when they began
    # late in it, extended back to contain it when they began early in it.
    moved_past_parent: int = 0
    extended_over_parent: int = 0
    # Regions ended where a step first open at the save began late inside them (an epoch's last
    # batch, a loop body the step boundary falls in).
    ended_at_open_slice: int = 0
    negative_durations: int = 0
    # Backward layers whose hook-timed start or end was moved to the edge of the autograd node
    # it fell in (dlprof.store.backward_layers), before nesting: none of them needs repairs.
    aligned_to_autograd: int = 0
    # Device slices starting before the previous one on their stream ends (kept as they are).
    overlapping_on_device: int = 0

    def as_counts(self) -> dict[str, int]:
        return {k: v for k, v in self.__dict__.items() if v}


@dataclass
class _Tracks:
    """Slices sorted so that each track's slices come in start order, outer before inner."""

    order: np.ndarray
    track_change: np.ndarray = field(repr=False)
    on_device: np.ndarray = field(repr=False)
    rank_of_kind: np.ndarray = field(repr=False)  # NESTING_ORDER of each, in that order


def _sort(table: pa.Table) -> _Tracks:
    pid = table.column("pid").to_numpy(zero_copy_only=False)
    tid = table.column("tid").to_numpy(zero_copy_only=False)
    device, cpu_code = _codes(table.column("device"), "cpu")
    start = table.column("start_ns").to_numpy(zero_copy_only=False)
    dur = table.column("dur_ns").to_numpy(zero_copy_only=False)
    kinds = table.column("kind").combine_chunks()
    if isinstance(kinds, pa.DictionaryArray):
        rank_of_kind = np.array(
            [NESTING_ORDER.get(k, _UNRANKED) for k in kinds.dictionary.to_pylist()] or [0],
            dtype=np.int8,
        )
        priority = rank_of_kind[kinds.indices.fill_null(0).to_numpy(zero_copy_only=False)]
    else:
        priority = np.array([NESTING_ORDER.get(k, _UNRANKED) for k in kinds.to_pylist()])
    order = np.lexsort((priority, -dur, start, tid, device, pid))
    keys = np.stack([pid[order], device[order], tid[order]])
    change = np.ones(len(order), dtype=bool)
    if len(order) > 1:
        change[1:] = np.any(keys[:, 1:] != keys[:, :-1], axis=0)
    return _Tracks(order=order, track_change=change, on_device=device[order] != cpu_code,
                   rank_of_kind=np.asarray(priority)[order])


def track_order(table: pa.Table) -> np.ndarray:
    """The row order that puts ``table``'s slices in track order (pid, device, tid, start, outer
    before inner), as parts are stored."""
    return _sort(table).order


def _codes(column: pa.ChunkedArray, value: str) -> tuple[np.ndarray, int]:
    """Integer codes for a string column (equal strings, equal codes), and the code of ``value``."""
    values = column.combine_chunks()
    if isinstance(values, pa.DictionaryArray):
        values = values.dictionary_decode()
    encoded = pc.dictionary_encode(values.fill_null("cpu"))
    dictionary = encoded.dictionary.to_pylist()
    code = dictionary.index(value) if value in dictionary else -1
    return np.asarray(encoded.indices), code


def nest_slices(table: pa.Table) -> tuple[pa.Table, NestingReport]:
    """Compute depth, parent_id and self_ns for every slice, clipping children to their parent.

    Args:
        table: slices of any number of processes, threads and streams, in any order; ``id``,
            ``pid``, ``tid``, ``device``, ``kind``, ``start_ns`` and ``dur_ns`` must be set.

    Returns:
        The same slices sorted by (pid, device, tid, start), with ``dur_ns`` clipped to the
        parent's end where a CPU child overran it a little (``start_ns`` moved where it lay
        mostly after the slice it began in: see the module's docstring), and ``depth``,
        ``parent_id``, ``self_ns`` set (device slices: depth 0, no parent, self time their
        duration); and a report of what was changed or found.
    """
    nested, report, _ = nest_window(table)
    return nested, report


@dataclass
class OpenSliceTimes:
    """What one window said of the slices still open at its save, by id."""

    # The time of each one's direct children in this window.
    children_ns: dict[int, int] = field(default_factory=dict)
    # Where nesting moved one's start to (it began inside a slice that ended here and was
    # extended back over it); the slice's row, written with a later save, starts there too.
    starts_ns: dict[int, int] = field(default_factory=dict)
    # Each one's depth here: what its descendants here count theirs from.
    depths: dict[int, int] = field(default_factory=dict)
    # Each one's parent here (another open slice), where it has one: where its children here
    # go if a later save stretches it back over that parent (see :class:`dlprof.recording.saves.Saver`).
    parents: dict[int, int] = field(default_factory=dict)
    # The time of dlprof's pauses inside each one here (only those with any).
    pause_ns: dict[int, int] = field(default_factory=dict)


def nest_window(
    table: pa.Table, anchors: pa.Table | None = None, open_before: frozenset[int] = frozenset()
) -> tuple[pa.Table, NestingReport, OpenSliceTimes]:
    """Nest the slices of one save under the slices still open when it was made.

    Args:
        table: the slices, as for :func:`nest_slices`.
        anchors: slices still open at the save (``id``, ``pid``, ``tid``, ``kind``, ``name``,
            ``start_ns``), on a CPU thread: the slices of ``table`` inside them take them as
            parents and count their depth from theirs. They are not returned.
        open_before: ids of slices (rows of ``table`` or anchors) that were anchors of earlier
            saves.

    An anchor may be extended back over a slice it began in, never moved later: its children in
    that save were nested under its start. A slice that was an anchor of an earlier save is
    neither: it ends with the slice it began in (which was open at that save too, so the
    children it had there lie inside both).

    Returns:
        The nested slices (as :func:`nest_slices` gives them), the report, and per anchor the
        time of its direct children here (which its own self time must leave out) and its start
        where nesting moved it.
    """
    report = NestingReport()
    n = table.num_rows
    if n == 0:
        return table, report, OpenSliceTimes()
    table, report.aligned_to_autograd = align_backward_layers(table)
    if anchors is not None and anchors.num_rows:
        table = pa.concat_tables([table, _open_rows(anchors, table.schema)])
    total = table.num_rows
    keep_start = np.arange(total) >= n
    clip_only = np.zeros(total, dtype=bool)
    fresh = keep_start.copy()  # anchors first open at this save
    if open_before:
        was_open = pc.is_in(table.column("id"), pa.array(list(open_before), pa.int64())).to_numpy(
            zero_copy_only=False)
        clip_only = was_open & ~keep_start
        fresh &= ~was_open
    dur_in = table.column("dur_ns").to_numpy(zero_copy_only=False).copy()
    negative = dur_in < 0
    report.negative_durations = int(negative.sum())
    dur_in[negative] = 0
    table = table.set_column(table.schema.get_field_index("dur_ns"), "dur_ns", pa.array(dur_in))
    # A slice moved to start elsewhere changes the order the next ones are nested in: nest
    # again until nothing moves (a few passes at most), the last pass clipping only.
    for attempt in range(_ADJUSTING_PASSES + 1):
        moves = report.moved_past_parent + report.extended_over_parent + report.ended_at_open_slice
        order, start, end, parent, depth = _nest_in_order(
            table, report, extend=attempt < _ADJUSTING_PASSES, keep_start=keep_start, clip_only=clip_only,
            fresh=fresh,
        )
        if report.moved_past_parent + report.extended_over_parent + report.ended_at_open_slice == moves:
            break
        starts, durs = np.empty(total, dtype=np.int64), np.empty(total, dtype=np.int64)
        starts[order] = start
        durs[order] = np.asarray(end, dtype=np.int64) - np.asarray(start, dtype=np.int64)
        table = table.set_column(table.schema.get_field_index("start_ns"), "start_ns", pa.array(starts))
        table = table.set_column(table.schema.get_field_index("dur_ns"), "dur_ns", pa.array(durs))

    sorted_table = table.take(pa.array(order))
    dur = np.asarray(end, dtype=np.int64) - np.asarray(start, dtype=np.int64)
    parent_pos = np.asarray(parent, dtype=np.int64)
    has_parent = parent_pos >= 0
    child_total = np.zeros(total, dtype=np.int64)
    np.add.at(child_total, parent_pos[has_parent], dur[has_parent])
    self_ns = np.maximum(dur - child_total, 0)
    ids = sorted_table.column("id").to_numpy(zero_copy_only=False)
    parent_id = pa.array(np.where(has_parent, ids[np.maximum(parent_pos, 0)], 0), mask=~has_parent)
    pause_ns = _pause_time(sorted_table.column("kind"), parent_pos, dur)
    if "pause_ns" not in sorted_table.column_names:
        sorted_table = sorted_table.append_column("pause_ns", pa.nulls(total, pa.int64()))

    for name, values in (
        ("start_ns", pa.array(np.asarray(start, dtype=np.int64))),
        ("dur_ns", pa.array(dur)),
        ("depth", pa.array(np.asarray(depth, dtype=np.int16))),
        ("parent_id", parent_id),
        ("self_ns", pa.array(self_ns)),
        ("pause_ns", pa.array(pause_ns, mask=pause_ns == 0)),
    ):
        sorted_table = sorted_table.set_column(
            sorted_table.schema.get_field_index(name), name, values.cast(sorted_table.schema.field(name).type)
        )
    if total == n:
        return sorted_table, report, OpenSliceTimes()
    is_anchor = np.asarray(order) >= n
    anchor_ids = ids[is_anchor].tolist()
    # An open slice's open children count where they end, not here (they have no end yet).
    closed_child = has_parent & ~is_anchor
    closed_total = np.zeros(total, dtype=np.int64)
    np.add.at(closed_total, parent_pos[closed_child], dur[closed_child])
    anchor_parents = np.where(has_parent, ids[np.maximum(parent_pos, 0)], -1)[is_anchor].tolist()
    times = OpenSliceTimes(
        children_ns=dict(zip(anchor_ids, closed_total[is_anchor].tolist(), strict=True)),
        depths=dict(zip(anchor_ids, np.asarray(depth)[is_anchor].tolist(), strict=True)),
        parents={a: p for a, p in zip(anchor_ids, anchor_parents, strict=True) if p >= 0},
        pause_ns={a: p for a, p in zip(anchor_ids, pause_ns[is_anchor].tolist(), strict=True) if p},
    )
    given = dict(zip(anchors.column("id").to_pylist(), anchors.column("start_ns").to_pylist(), strict=True)) \
        if anchors is not None else {}
    for slice_id, begins in zip(anchor_ids, np.asarray(start, dtype=np.int64)[is_anchor].tolist(), strict=True):
        if begins != given.get(slice_id, begins):
            times.starts_ns[slice_id] = begins
    return sorted_table.filter(pa.array(~is_anchor)), report, times


def _pause_time(kinds: pa.ChunkedArray, parent_pos: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Per slice (in nesting order), the time of the ``profiler`` slices inside it at any depth:
    each pause's length added up its chain of parents (pauses are few; chains are short)."""
    total = np.zeros(len(dur), dtype=np.int64)
    values = kinds.combine_chunks()
    if isinstance(values, pa.DictionaryArray):
        names = values.dictionary.to_pylist()
        if Kind.PROFILER not in names:
            return total
        codes = values.indices.fill_null(-1).to_numpy(zero_copy_only=False)
        is_pause = np.isin(codes, [i for i, name in enumerate(names) if name == Kind.PROFILER])
    else:
        is_pause = pc.equal(values, str(Kind.PROFILER)).fill_null(False).to_numpy(zero_copy_only=False)
    parents = parent_pos.tolist()
    for pause in np.flatnonzero(is_pause).tolist():
        length = int(dur[pause])
        above = parents[pause]
        while above >= 0:
            total[above] += length
            above = parents[above]
    return total


def _open_rows(anchors: pa.Table, schema: pa.Schema) -> pa.Table:
    """Anchors as rows of ``schema`` lasting until after anything recorded."""
    start = anchors.column("start_ns").to_numpy(zero_copy_only=False)
    given = {
        "id": anchors.column("id"), "pid": anchors.column("pid"), "tid": anchors.column("tid"),
        "kind": anchors.column("kind"), "name": anchors.column("name"),
        "device": pa.chunked_array([pa.array(["cpu"] * anchors.num_rows)]),
        "start_ns": pa.chunked_array([pa.array(start, pa.int64())]),
        "dur_ns": pa.chunked_array([pa.array(_OPEN_END_NS - start, pa.int64())]),
    }
    columns = [given[f.name].cast(f.type) if f.name in given else pa.nulls(anchors.num_rows, f.type)
               for f in schema]
    return pa.Table.from_arrays(columns, schema=schema)


def _nest_in_order(
    table: pa.Table, report: NestingReport, extend: bool, keep_start: np.ndarray | None = None,
    clip_only: np.ndarray | None = None, fresh: np.ndarray | None = None,
) -> tuple[np.ndarray, list[int], list[int], list[int], list[int]]:
    """One nesting pass over the slices in track order; adds what it changed to ``report``.

    ``keep_start`` marks slices (by position in ``table``) whose start must not move later:
    slices open at this save, whose children in it were nested under their start.
    ``clip_only`` marks slices that must not move at all, only end with the slice they began
    in: slices open at an earlier save (see :func:`nest_window`). ``fresh`` marks the slices
    of ``keep_start`` first open at this save (none of their children lie in earlier saves).

    Returns:
        The order (positions in ``table``), and per position in that order: start, end (both
        as adjusted), parent position (-1: none) and depth.
    """
    tracks = _sort(table)
    order = tracks.order
    starts = table.column("start_ns").to_numpy(zero_copy_only=False)
    start = starts[order].tolist()
    end = (starts + table.column("dur_ns").to_numpy(zero_copy_only=False))[order].tolist()
    change = tracks.track_change.tolist()
    on_device = tracks.on_device.tolist()
    n = len(start)
    fixed = keep_start[order].tolist() if keep_start is not None else [False] * n
    unmovable = clip_only[order].tolist() if clip_only is not None else [False] * n
    kind_rank = tracks.rank_of_kind.tolist()
    first_open = fresh[order].tolist() if fresh is not None else [False] * n
    parent = [-1] * n
    depth = [0] * n
    overlapping = 0
    stack: list[int] = []
    stream_end = 0
    for i in range(n):
        if change[i]:
            stack.clear()
            stream_end = start[i]
        if on_device[i]:
            # Work on a stream never contains other work: overlaps are the source's timing,
            # kept (clipping would lose device time) and counted.
            if start[i] < stream_end:
                overlapping += 1
            stream_end = max(stream_end, end[i])
            continue
        while True:
            while stack and start[i] >= end[stack[-1]]:
                stack.pop()
            if not stack or end[i] <= end[stack[-1]]:
                break
            top = stack[-1]
            if not extend or unmovable[i] or end[i] - end[top] <= end[top] - start[i]:
                end[i] = end[top]  # mostly inside its parent (or bound to it): clip the overrun
                report.clipped_to_parent += 1
                break
            # Mostly after the slice it started in: two sources timed neighbouring work with
            # their own clocks and hooks.
            late = 2 * (start[i] - start[top]) >= end[top] - start[top]
            if late and first_open[i] and kind_rank[i] < kind_rank[top] <= _REGION_RANK and not fixed[top]:
                # A step first open at this save (begun by the optimizer inside the loop body, or
                # in an epoch's last batch) cannot move: the region it began in ends there (all
                # of that region's children in earlier saves ended before).
                end[top] = start[i]
                stack.pop()
                report.ended_at_open_slice += 1
                continue
            if late and not fixed[i]:
                # It began late in that slice (a layer timed from a hook that started inside
                # the previous layer's last moment, or inside the clock read that timed it):
                # it comes after it.
                start[i] = end[top]
                report.moved_past_parent += 1
            else:
                # It began early in it (a layer's backward starting inside the autograd op it
                # runs): that slice is part of it.
                start[i] = start[top]
                stack.pop()
                report.extended_over_parent += 1
        if stack:
            parent[i] = stack[-1]
            depth[i] = len(stack)
        stack.append(i)
    report.overlapping_on_device = overlapping
    return order, start, end, parent, depth


def innermost_containing(
    starts: np.ndarray, ends: np.ndarray, points: np.ndarray
) -> np.ndarray:
    """For each point in time, the index of the innermost interval that contains it, or -1.

    The intervals must nest (as they do on one thread after :func:`nest_slices`).

    Args:
        starts: interval starts.
        ends: interval ends (exclusive).
        points: the instants to place.

    Returns:
        An array as long as ``points`` of indices into ``starts``.
    """
    result = np.full(len(points), -1, dtype=np.int64)
    if len(starts) == 0 or len(points) == 0:
        return result
    interval_order = np.lexsort((-(ends - starts), starts)).tolist()
    point_order = np.argsort(points, kind="stable").tolist()
    start_list = starts.tolist()
    end_list = ends.tolist()
    point_list = points.tolist()
    stack: list[int] = []
    j = 0
    n_intervals = len(interval_order)
    for p in point_order:
        t = point_list[p]
        while j < n_intervals and start_list[interval_order[j]] <= t:
            k = interval_order[j]
            while stack and start_list[k] >= end_list[stack[-1]]:
                stack.pop()
            stack.append(k)
            j += 1
        while stack and t >= end_list[stack[-1]]:
            stack.pop()
        if stack:
            result[p] = stack[-1]
    return result
