"""Where memory goes: each device's peak, what was live at it, and what each layer added.

    run = dlprof.load("dlprof-runs/20261122-101500-train")
    peaks = memory_peaks(run)                                  # one row per process and device
    live = live_at_peak(run, MemoryGroup.LAYER, limit=10)      # what held the peak, per layer
    layers = layer_peaks(run)                                  # what each layer added at its height

Definitions (bytes and nanoseconds throughout), over the memory table's rows of one process on
one device (each process numbers its own addresses and keeps its own totals):

- The peak is the highest ``total_allocated`` the allocator reported, at the first row that
  reached it; the reserved peak is the highest ``total_reserved`` (missing where the source
  reports none, as the CPU allocators do).
- A recorded allocation is live at the peak when it was made at or before the peak and the next
  row of the same address (its free, or a new allocation there that shows it was freed) came
  after it. ``untraced_bytes`` is the rest of the peak: memory allocated before recording began
  (parameters, inputs made before profiling), or allocations recorded without an address.
- The op of a live block is the slice that allocated it (``slice_id``); its layer is the
  innermost module slice enclosing that op; its category is the source's where it says one
  (raw memory timelines do), else inferred: an allocation inside a layer's forward holds an
  activation, inside its backward a gradient.
- A layer call's added memory is the highest total reached by the allocations made inside it
  (on its thread, nested calls included) minus the total when it began; a layer's row holds
  the largest over its calls.
"""

from __future__ import annotations

from enum import StrEnum

import pandas as pd

from dlprof.analysis.ancestry import nearest_ancestor, open_levels
from dlprof.analysis.sql import rank_condition, steps_sql
from dlprof.engine.dialect import Dialect
from dlprof.keys import Kind
from dlprof.store.reader import Run


class MemoryGroup(StrEnum):
    """What the blocks live at the peak are grouped by."""

    OP = "op"  # the op that allocated the block
    LAYER = "layer"  # the innermost layer (module) around that op
    CATEGORY = "category"  # parameter, activation, gradient... where the source or the layer tells


class CategoryBasis(StrEnum):
    """Where a live block's category comes from."""

    RECORDED = "recorded"  # the source wrote it (torch's raw memory timeline)
    INFERRED = "inferred"  # from the layer around the allocating op: forward or backward
    UNKNOWN = "unknown"  # neither


# Names of live blocks that have no op or no layer.
NO_OP = "(no op recorded)"
NO_LAYER = "(outside any layer)"
UNKNOWN_CATEGORY = "unknown"

KEYS = ["rank", "pid", "device"]
PEAK_COLUMNS = [
    *KEYS, "peak_bytes", "peak_ns", "first_ns", "reserved_peak_bytes", "live_bytes", "live_blocks", "untraced_bytes",
    "allocations", "frees", "unmatched_frees", "step", "op",
]
LAYER_PEAK_COLUMNS = [*KEYS, "layer", "calls", "added_bytes", "mean_added_bytes", "high_bytes"]
_IS_LAYER = f"kind = '{Kind.MODULE}'"
_UPTO = "ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW"
_BEFORE = "ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING"
_SAME_BLOCK = "PARTITION BY rank, pid, device, addr ORDER BY ts_ns, bytes"


def _memory_sql(dialect: Dialect, rank: int | None, device: str | None) -> str:
    """The allocations and frees taken into account (a zero-byte row changes nothing)."""
    where = f"bytes IS NOT NULL AND bytes <> 0{rank_condition(rank)}"
    if device is not None:
        where += f" AND device = {dialect.literal(device)}"
    return ("SELECT rank, pid, tid, device, ts_ns, bytes, total_allocated, total_reserved, addr, slice_id, "
            f"category FROM memory WHERE {where}")


def _peaks_sql() -> str:
    """Each (rank, pid, device)'s peak: ``peak_bytes``, ``peak_ns``, ``peak_slice`` (needs ``mem``)."""
    ranked = (f"SELECT {', '.join(KEYS)}, ts_ns, total_allocated, slice_id, row_number() OVER (PARTITION BY "
              f"{', '.join(KEYS)} ORDER BY total_allocated DESC, ts_ns, bytes DESC, slice_id) AS place "
              "FROM mem WHERE total_allocated IS NOT NULL")
    return (f"SELECT {', '.join(KEYS)}, ts_ns AS peak_ns, total_allocated AS peak_bytes, slice_id AS peak_slice "
            f"FROM ({ranked}) AS ranked WHERE place = 1")


def _matched_sql() -> str:
    """Each row with the next and previous row of its address (needs ``mem``): an allocation's
    ``next_ns`` is when it was freed, a free with no allocation before it is unmatched."""
    return (f"SELECT *, lead(ts_ns) OVER ({_SAME_BLOCK}) AS next_ns, lag(bytes) OVER ({_SAME_BLOCK}) AS prev_bytes "
            "FROM mem")


def _live_sql() -> str:
    """The recorded blocks live at their device's peak (needs ``mem``, ``peaks``, ``matched``)."""
    joined = " AND ".join(f"m.{k} = p.{k}" for k in KEYS)
    return (f"SELECT m.*, p.peak_bytes FROM matched m JOIN peaks p ON {joined} "
            "WHERE m.bytes > 0 AND m.addr IS NOT NULL AND m.ts_ns <= p.peak_ns "
            "AND (m.next_ns IS NULL OR m.next_ns > p.peak_ns)")


def _with(dialect: Dialect, rank: int | None, device: str | None) -> str:
    return (f"WITH mem AS ({_memory_sql(dialect, rank, device)}), peaks AS ({_peaks_sql()}), "
            f"matched AS ({_matched_sql()}), live AS ({_live_sql()})")


def memory_peaks(run: Run, rank: int | None = None, device: str | None = None) -> pd.DataFrame:
    """Each device's peak of allocated memory, when it happened, and how much of it is explained.

    Args:
        run: the run.
        rank: only this rank.
        device: only this device (``cpu``, ``cuda:0``).

    Returns:
        :data:`PEAK_COLUMNS`, one row per rank, process and device, in that order: the peak and
        its time (``peak_ns``), the time of the device's first row (``first_ns``), the reserved
        peak (missing where the source reports none), the bytes and blocks of recorded
        allocations live at the peak and the rest (``untraced_bytes``), the allocation and free
        rows, the frees whose allocation was not recorded, and the step and op during which the
        peak was reached (missing when none).
    """
    keys = ", ".join(KEYS)
    on = " AND ".join(f"{{a}}.{k} = p.{k}" for k in KEYS)
    steps = ("SELECT p.rank, p.pid, p.device, s.name, row_number() OVER (PARTITION BY p.rank, p.pid, p.device "
             "ORDER BY s.start_ns DESC, s.name) AS place FROM peaks p JOIN steps s ON s.rank = p.rank "
             "AND s.start_ns <= p.peak_ns AND p.peak_ns < s.end_ns")
    table = run.sql(
        f"{_with(run.engine.dialect, rank, device)}, steps AS ({steps_sql(rank)}), "
        f"at_step AS (SELECT * FROM ({steps}) AS placed WHERE place = 1), "
        f"counted AS (SELECT {keys}, max(total_reserved) AS reserved, min(ts_ns) AS first_ns, "
        "sum(CASE WHEN bytes > 0 THEN 1 ELSE 0 END) AS allocations, "
        "sum(CASE WHEN bytes < 0 THEN 1 ELSE 0 END) AS frees, "
        "sum(CASE WHEN bytes < 0 AND (prev_bytes IS NULL OR prev_bytes < 0) THEN 1 ELSE 0 END) AS unmatched "
        f"FROM matched GROUP BY {keys}), "
        f"held AS (SELECT {keys}, sum(bytes) AS live_bytes, count(*) AS live_blocks FROM live GROUP BY {keys}) "
        f"SELECT p.rank, p.pid, p.device, p.peak_bytes, p.peak_ns, c.first_ns, "
        "CASE WHEN c.reserved > 0 THEN c.reserved END AS reserved_peak_bytes, "
        "coalesce(h.live_bytes, 0) AS live_bytes, coalesce(h.live_blocks, 0) AS live_blocks, "
        "p.peak_bytes - coalesce(h.live_bytes, 0) AS untraced_bytes, c.allocations, c.frees, "
        "c.unmatched AS unmatched_frees, st.name AS step, o.name AS op "
        f"FROM peaks p JOIN counted c ON {on.format(a='c')} LEFT JOIN held h ON {on.format(a='h')} "
        f"LEFT JOIN at_step st ON {on.format(a='st')} "
        "LEFT JOIN slices o ON o.rank = p.rank AND o.id = p.peak_slice "
        f"ORDER BY {keys}"
    )
    integers = [c for c in PEAK_COLUMNS if c not in ("device", "step", "op", "reserved_peak_bytes")]
    table = table.astype({c: "int64" for c in integers})
    table["reserved_peak_bytes"] = table["reserved_peak_bytes"].astype("Int64")
    return table[PEAK_COLUMNS]


def _grouping_sql(dialect: Dialect, by: MemoryGroup, rank: int | None) -> tuple[str, str, list[str]]:
    """The joins that name each live block's group, the group's expression, and extra key columns."""
    op = "LEFT JOIN slices o ON o.rank = l.rank AND o.id = l.slice_id"
    if by is MemoryGroup.OP:
        return op, f"coalesce(o.name, {dialect.literal(NO_OP)})", []
    enclosing = (f"LEFT JOIN ({nearest_ancestor(dialect, _IS_LAYER, rank)}) AS a "
                 "ON a.rank = l.rank AND a.id = l.slice_id LEFT JOIN slices y ON y.rank = a.rank AND y.id = a.own_id")
    layer = (f"CASE WHEN l.slice_id IS NULL THEN {dialect.literal(NO_OP)} WHEN y.name IS NULL "
             f"THEN {dialect.literal(NO_LAYER)} ELSE y.name END")
    if by is MemoryGroup.LAYER:
        return enclosing, layer, []
    inferred = ("CASE WHEN y.name LIKE '% backward' THEN 'gradient' WHEN y.name LIKE '% forward' "
                f"THEN 'activation' ELSE {dialect.literal(UNKNOWN_CATEGORY)} END")
    basis = (f"CASE WHEN l.category IS NOT NULL THEN '{CategoryBasis.RECORDED}' WHEN y.name LIKE '% backward' "
             f"OR y.name LIKE '% forward' THEN '{CategoryBasis.INFERRED}' ELSE '{CategoryBasis.UNKNOWN}' END")
    return enclosing, f"coalesce(l.category, {inferred})", [f"{basis} AS basis"]


def live_at_peak(run: Run, by: MemoryGroup = MemoryGroup.OP, rank: int | None = None,
                 device: str | None = None, limit: int | None = None) -> pd.DataFrame:
    """The recorded blocks live at each device's peak, grouped by op, layer or category.

    Args:
        run: the run.
        by: what to group the live blocks by.
        rank: only this rank.
        device: only this device.
        limit: at most this many groups per device, the largest (None: all).

    Returns:
        Columns ``rank``, ``pid``, ``device``, then the group (``op``, ``layer`` or ``category``,
        the last followed by ``basis``: :class:`CategoryBasis`), ``bytes``, ``blocks`` and
        ``peak_pct`` (of the device's peak); per device the largest groups first. The groups'
        bytes add up to the peak less :func:`memory_peaks`' ``untraced_bytes``.
    """
    dialect = run.engine.dialect
    joins, group, extra = _grouping_sql(dialect, by, rank)
    keys = ", ".join(KEYS)
    extra_names = [e.rpartition(" AS ")[2] for e in extra]
    grouped_keys = ", ".join([*KEYS, "grp", *extra_names])
    named = (f"SELECT l.rank, l.pid, l.device, l.bytes, l.peak_bytes, {group} AS grp"
             + "".join(f", {e}" for e in extra) + f" FROM live l {joins}")
    sums = (f"SELECT {grouped_keys}, sum(bytes) AS bytes, count(*) AS blocks, max(peak_bytes) AS peak_bytes "
            f"FROM named GROUP BY {grouped_keys}")
    ordered = (f"SELECT *, row_number() OVER (PARTITION BY {keys} ORDER BY bytes DESC, grp"
               + "".join(f", {n}" for n in extra_names) + ") AS place FROM sums")
    cut = f" AND place <= {int(limit)}" if limit else ""
    table = run.sql(
        f"{_with(dialect, rank, device)}, named AS ({named}), sums AS ({sums}), ordered AS ({ordered}) "
        f"SELECT {keys}, grp AS {by.value}" + "".join(f", {n}" for n in extra_names)
        + ", bytes, blocks, 100.0 * bytes / peak_bytes AS peak_pct "
        f"FROM ordered WHERE TRUE{cut} ORDER BY {keys}, place"
    )
    return table.astype({"rank": "int64", "pid": "int64", "bytes": "int64", "blocks": "int64",
                         "peak_pct": "float64"})


def layer_peaks(run: Run, rank: int | None = None, device: str | None = None,
                limit: int | None = None) -> pd.DataFrame:
    """What each layer added to its device's allocated memory at its height, over its calls.

    Each allocation on a thread is placed in every layer call around it on that thread (for each
    nesting level of layers, the last call of that level started at or before it, if not yet
    ended: layers nest, so that is the one), a fixed number of window passes whatever the depth.

    Args:
        run: the run.
        rank: only this rank.
        device: only this device.
        limit: at most this many layers per device, those that added the most (None: all).

    Returns:
        :data:`LAYER_PEAK_COLUMNS`: per device and layer name, the calls that allocated, the most
        one call added (``added_bytes``) and the mean, and the highest total reached inside it
        (``high_bytes``); per device the layers that added the most first.
    """
    dialect = run.engine.dialect
    last_found, last_end = dialect.last_non_null("found"), dialect.last_non_null("found_end")
    last_total = dialect.last_non_null("total")
    mods = (f"SELECT rank, pid, tid, id, start_ns, start_ns + dur_ns AS end_ns, level "
            f"FROM ({open_levels(_IS_LAYER, rank)}) AS levels WHERE candidate")
    marks = (
        "SELECT rank, pid, tid, level AS seeks, start_ns AS t, 0 AS is_row, id AS found, end_ns AS found_end, "
        "CAST(NULL AS BIGINT) AS total, CAST(NULL AS STRING) AS device FROM mods "
        "UNION ALL SELECT m.rank, m.pid, m.tid, d.level, m.ts_ns, 1, CAST(NULL AS BIGINT), CAST(NULL AS BIGINT), "
        "m.total_allocated, m.device FROM mem m CROSS JOIN (SELECT DISTINCT level FROM mods) AS d "
        "WHERE m.total_allocated IS NOT NULL AND m.tid IS NOT NULL"
    )
    frame = f"OVER (PARTITION BY rank, pid, tid, seeks ORDER BY t, is_row, found {_UPTO})"
    placed = (f"SELECT rank, pid, device, t, is_row, total, {last_found} {frame} AS module_id, "
              f"{last_end} {frame} AS module_end FROM marks")
    highs = ("SELECT rank, pid, device, module_id, max(total) AS high FROM placed "
             "WHERE is_row = 1 AND module_id IS NOT NULL AND t < module_end GROUP BY rank, pid, device, module_id")
    # The device's total just before each call began: its starts among the device's rows in time order.
    sweep = (
        "SELECT h.rank, h.pid, h.device, mo.start_ns AS t, 0 AS is_row, 0 AS bytes, h.module_id, "
        "CAST(NULL AS BIGINT) AS total FROM highs h JOIN mods mo ON mo.rank = h.rank AND mo.id = h.module_id "
        "UNION ALL SELECT rank, pid, device, ts_ns, 1, bytes, CAST(NULL AS BIGINT), total_allocated FROM mem "
        "WHERE total_allocated IS NOT NULL"
    )
    befores = (f"SELECT * FROM (SELECT rank, pid, device, module_id, is_row, {last_total} OVER (PARTITION BY "
               f"rank, pid, device ORDER BY t, is_row, bytes, module_id {_BEFORE}) AS before FROM sweep) AS swept "
               "WHERE is_row = 0")
    # Before the device's first row: what was allocated then (its total less that row's bytes).
    firsts = ("SELECT rank, pid, device, total_allocated - bytes AS baseline FROM (SELECT *, row_number() OVER ("
              "PARTITION BY rank, pid, device ORDER BY ts_ns, bytes DESC) AS place FROM mem "
              "WHERE total_allocated IS NOT NULL) AS ordered WHERE place = 1")
    same = " AND ".join(f"{{a}}.{k} = h.{k}" for k in KEYS)
    calls = (
        "SELECT h.rank, h.pid, h.device, s.name AS layer, h.high, "
        "h.high - coalesce(b.before, f.baseline) AS added FROM highs h "
        f"JOIN befores b ON {same.format(a='b')} AND b.module_id = h.module_id "
        f"JOIN firsts f ON {same.format(a='f')} JOIN slices s ON s.rank = h.rank AND s.id = h.module_id"
    )
    keys = ", ".join(KEYS)
    per_layer = (f"SELECT {keys}, layer, count(*) AS calls, max(added) AS added_bytes, "
                 f"avg(CAST(added AS DOUBLE)) AS mean_added_bytes, max(high) AS high_bytes, "
                 f"row_number() OVER (PARTITION BY {keys} ORDER BY max(added) DESC, layer) AS place "
                 f"FROM calls GROUP BY {keys}, layer")
    cut = f" AND place <= {int(limit)}" if limit else ""
    table = run.sql(
        f"WITH mem AS ({_memory_sql(dialect, rank, device)}), mods AS ({mods}), marks AS ({marks}), "
        f"placed AS ({placed}), highs AS ({highs}), sweep AS ({sweep}), befores AS ({befores}), "
        f"firsts AS ({firsts}), calls AS ({calls}), per_layer AS ({per_layer}) "
        f"SELECT {', '.join(LAYER_PEAK_COLUMNS)} FROM per_layer WHERE TRUE{cut} ORDER BY {keys}, place"
    )
    return table.astype({"rank": "int64", "pid": "int64", "calls": "int64", "added_bytes": "int64",
                         "mean_added_bytes": "float64", "high_bytes": "int64"})
