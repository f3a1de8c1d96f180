"""Flat profiles: slices grouped by name (or name and shape), as tfprof's and TAU's tables show.

Queries on the run's engine; only the grouped rows come back. :func:`top_rows` gives them as
plain values (what ``dlprof top`` prints, without loading pandas); :func:`top` as a DataFrame.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

from dlprof.analysis.ancestry import nearest_ancestor
from dlprof.analysis.device_time import grouped_device_time_sql
from dlprof.analysis.sql import (
    DEVICE_KINDS_SQL,
    IS_PAUSE,
    launch_calls,
    launches_sql,
    rank_condition,
    scope_layer_calls_sql,
    user_time,
)
from dlprof.engine.rows import Rows
from dlprof.keys import DEVICE_KINDS, GroupKey, Kind, SortKey
from dlprof.store.reader import Run

if TYPE_CHECKING:
    import pandas as pd

# The columns of a top table, in order; times in nanoseconds.
TOP_COLUMNS = [
    "name",
    "calls",
    "total_ns",
    "self_ns",
    "self_pct",
    "cum_pct",
    "avg_ns",
    "min_ns",
    "max_ns",
    "bytes",
    "flops",
]
DEVICE_COLUMN = "device_ns"  # inclusive: the device work launched inside the row's slices
DEVICE_SELF_COLUMN = "self_device_ns"  # outside the slices of the same kind inside them
# Metrics from CPU counters measured over step and region slices: shown as extra top columns.
# (Per-kernel GPU metrics stay with `dlprof metrics`, where they are derived and explained.)
COUNTER_METRIC_PREFIXES = ("perf:", "papi:")
# Added by top(per_rank=True): how a row's total time spreads over the ranks.
PER_RANK_COLUMNS = ["rank_min_ns", "rank_median_ns", "rank_max_ns", "max_rank"]
UNATTRIBUTED = "(no launching op)"

# The column each sort key orders rows by (tables keep it however narrow the terminal).
SORT_COLUMN = {
    SortKey.MICROS: "total_ns",
    SortKey.SELF: "self_ns",
    SortKey.CALLS: "calls",
    SortKey.BYTES: "bytes",
    SortKey.FLOPS: "flops",
    SortKey.DEVICE: DEVICE_COLUMN,
}
_SUMMED = ("total_ns", "self_ns", "bytes", "flops")


def has_device_activity(run: Run) -> bool:
    """Whether the run holds any kernel, memcpy or memset."""
    return bool(run.query(f"SELECT 1 FROM slices WHERE kind IN {DEVICE_KINDS_SQL} LIMIT 1").rows)


def launches(run: Run) -> pd.DataFrame:
    """Each device slice (kernel, memcpy, memset) with the CPU op that launched it.

    A device slice is linked to the runtime call that launched it by correlation id (per rank);
    the call's parent is the op.

    Returns:
        Columns ``id`` (the device slice), ``dur_ns`` and ``launcher_id`` (the op; missing when
        the trace links none).
    """
    return run.sql(f"SELECT id, dur_ns, launcher_id FROM ({launches_sql()}) AS launches")


def default_sort(run: Run) -> SortKey:
    """What a top table is sorted by when no key is asked for: device time on a run with device
    work (where the host's time is mostly launching it), else total time."""
    return SortKey.DEVICE if has_device_activity(run) else SortKey.TOTAL


def kinds_present(run: Run, rank: int | None = None) -> list[str]:
    """The kinds of slice the run (or one rank of it) holds, most frequent first."""
    counted = run.query(f"SELECT kind, count(*) AS n FROM slices WHERE TRUE{rank_condition(rank)} "
                        "GROUP BY kind ORDER BY n DESC, kind")
    return [str(kind) for kind, _ in counted if kind is not None]


def _keys(group_by: GroupKey) -> list[str]:
    return ["name", "input_shapes"] if group_by is GroupKey.SHAPE else ["name"]


def _selection(run: Run, kind: str, group_by: GroupKey, rank: int | None, within: str | None = None,
               leaves: bool = False) -> str:
    """A query of the slices one top table aggregates: its group keys and the measures.

    A layer's self time is its time outside the layers inside it (its own ops included), as a
    TAU timer's exclusive time is its time outside other timers: the time of the slices directly
    in it would be the hooks' and Python's time between the ops. Total times are the user's
    (:func:`user_time`), and a layer's self time leaves out dlprof's pauses directly in it too.

    ``call_key`` tells the calls apart: each slice is a call, except a layer derived from
    TensorFlow name scopes, whose pieces in one step are one call (one batch).
    """
    d = run.engine.dialect
    name = "s.name"
    self_ns = "s.self_ns"
    call_key = "s.id"
    joins = ""
    conditions = ""
    if group_by is GroupKey.OP and kind in DEVICE_KINDS:
        joins += (f" LEFT JOIN ({launch_calls()}) AS c ON s.rank = c.rank AND s.correlation_id = c.correlation_id"
                  " LEFT JOIN slices p ON p.rank = c.rank AND p.id = c.parent_id")
        name = f"coalesce(p.name, {d.literal(UNATTRIBUTED)})"
    elif group_by is GroupKey.TYPE:
        name = "coalesce(s.op_type, s.name)"
    if kind == Kind.MODULE:
        is_layer = f"kind = {d.literal(str(Kind.MODULE))}"
        # The layers directly inside each layer, and dlprof's pauses directly in it (not in one of them).
        inner = (f"SELECT rank, ancestor_id AS id, sum(dur_ns) AS inner_ns, "
                 "count(CASE WHEN is_wanted THEN 1 END) AS layers FROM "
                 f"({nearest_ancestor(d, is_layer, rank, among=f'{is_layer} OR {IS_PAUSE}')}) AS layers "
                 "WHERE ancestor_id IS NOT NULL GROUP BY rank, ancestor_id")
        joins += f" LEFT JOIN ({inner}) AS inner_layers ON inner_layers.rank = s.rank AND inner_layers.id = s.id"
        self_ns = "greatest(s.dur_ns - coalesce(inner_layers.inner_ns, 0), 0)"
        joins += (f" LEFT JOIN ({scope_layer_calls_sql(d, rank)}) AS scope_calls "
                  "ON scope_calls.rank = s.rank AND scope_calls.id = s.id")
        call_key = "coalesce(scope_calls.call_key, s.id)"
        if leaves:
            conditions += " AND coalesce(inner_layers.layers, 0) = 0"
    if within is not None:
        enclosing = f"name = {d.literal(within)}"
        joins += (f" JOIN ({nearest_ancestor(d, enclosing, rank)}) AS within_ "
                  "ON within_.rank = s.rank AND within_.id = s.id AND within_.ancestor_id IS NOT NULL")
    return (
        f"SELECT s.id, s.rank, {name} AS name, coalesce(s.input_shapes, '') AS input_shapes, "
        f"{user_time('s')} AS dur_ns, "
        f"{self_ns} AS self_ns, s.bytes, s.flops, {call_key} AS call_key FROM slices s{joins} "
        f"WHERE s.kind = {d.literal(str(kind))}{rank_condition(rank, 's.rank')}{conditions}"
    )


def _launched_device_time(run: Run, selection: str, keys: list[str], kind: str,
                          rank: int | None) -> dict[tuple[Any, ...], tuple[int, int]] | None:
    """Inclusive and self device time per group of the selected slices
    (:mod:`dlprof.analysis.device_time`); None on a run without device work."""
    if not has_device_activity(run):
        return None
    found = run.query(grouped_device_time_sql(run.engine.dialect, selection, keys, kind, rank))
    return {tuple(row[:-2]): (int(row[-2] or 0), int(row[-1] or 0)) for row in found}


def top_rows(
    run: Run,
    kind: str = Kind.OP,
    by: SortKey = SortKey.MICROS,
    group_by: GroupKey = GroupKey.NAME,
    limit: int | None = 15,
    rank: int | None = None,
    per_rank: bool = False,
    within: str | None = None,
    leaves: bool = False,
) -> Rows:
    """:func:`top`'s table as plain values (see there); what ``dlprof top`` prints."""
    if leaves and kind != Kind.MODULE:
        raise ValueError(f"--leaves: the layers with no layer inside them; not for kind {kind!r}")
    keys = _keys(group_by)
    selection = _selection(run, kind, group_by, rank, within, leaves)
    launched = None if kind in DEVICE_KINDS else _launched_device_time(run, selection, keys, kind, rank)
    device = kind in DEVICE_KINDS or launched is not None
    if by is SortKey.DEVICE and not device:
        raise ValueError("--by device: this run has no device activity")
    measures = ("dur_ns", "self_ns", "bytes", "flops")
    calls = selection
    if kind == Kind.MODULE:
        # The pieces of one call first: a layer from TensorFlow name scopes is several slices.
        calls = (f"SELECT {', '.join(keys)}, call_key, " + ", ".join(f"sum({c}) AS {c}" for c in measures)
                 + f" FROM ({selection}) AS selected GROUP BY {', '.join(keys)}, call_key")
    grouped = run.query(
        f"SELECT {', '.join(keys)}, count(*) AS calls, "
        + ", ".join(f"CAST(coalesce(sum({c}), 0) AS BIGINT) AS {c}" for c in measures)
        + ", CAST(min(dur_ns) AS BIGINT) AS min_ns, CAST(max(dur_ns) AS BIGINT) AS max_ns"
        + f" FROM ({calls}) AS per_call GROUP BY {', '.join(keys)}"
    )
    if not grouped.rows:
        return Rows(tuple(TOP_COLUMNS))
    table = [dict(zip(grouped.columns, row, strict=True)) for row in grouped]
    for row in table:
        row["total_ns"] = row.pop("dur_ns")
        if kind in DEVICE_KINDS:
            row[DEVICE_COLUMN] = row[DEVICE_SELF_COLUMN] = row["total_ns"]
        elif launched is not None:
            row[DEVICE_COLUMN], row[DEVICE_SELF_COLUMN] = launched.get(tuple(row[k] for k in keys), (0, 0))
    metrics = _counter_metrics(run, selection, keys, table)
    all_self = sum(row["self_ns"] for row in table)
    for row in table:
        row["avg_ns"] = row["total_ns"] // max(row["calls"], 1)
        row["self_pct"] = 100.0 * row["self_ns"] / all_self if all_self else 0.0
    sort_column = SORT_COLUMN[by]
    table.sort(key=lambda row: tuple(row[k] for k in keys[1:]))
    table.sort(key=lambda row: row["name"])
    if by is SortKey.DEVICE:  # rows that launched nothing, by their own time
        table.sort(key=lambda row: row["total_ns"], reverse=True)
    table.sort(key=lambda row: row[sort_column], reverse=True)
    cumulative = 0.0
    for row in table:
        cumulative += row["self_pct"]
        row["cum_pct"] = cumulative
    columns = list(TOP_COLUMNS)
    if group_by is GroupKey.SHAPE:
        columns.insert(1, "input_shapes")
    if device:
        columns += [DEVICE_COLUMN, DEVICE_SELF_COLUMN]
    columns.extend(metrics)
    table = table[:limit] if limit else table
    if per_rank:
        columns.extend(PER_RANK_COLUMNS)
        _add_rank_spread(run, selection, keys, table, [rank] if rank is not None else run.ranks())
    return Rows(tuple(columns), [tuple(row[c] for c in columns) for row in table])


def top(
    run: Run,
    kind: str = Kind.OP,
    by: SortKey = SortKey.MICROS,
    group_by: GroupKey = GroupKey.NAME,
    limit: int | None = 15,
    rank: int | None = None,
    per_rank: bool = False,
    within: str | None = None,
    leaves: bool = False,
) -> pd.DataFrame:
    """Aggregate the slices of one kind into a table, sorted and cut to ``limit`` rows.

    Args:
        run: the run.
        kind: which slices (``op``, ``module``, ``region``, ``step``, ``kernel``...).
        by: what the rows are sorted by, descending.
        group_by: one row per name, per (name, input shapes), per type (the op's logical type,
            else its name), or, for device kinds, per name of the CPU op that launched the work.
        limit: at most this many rows (None: all).
        rank: only this rank's slices.
        per_rank: add how each row's total time spreads over the ranks (:data:`PER_RANK_COLUMNS`).
        within: only slices inside a slice of this name (a region such as ``eval``, a step).
        leaves: layers only (kind ``module``): only those with no layer inside them.

    Returns:
        One row per group with :data:`TOP_COLUMNS`, plus ``device_ns`` and ``self_device_ns``
        (inclusive and self device time, :mod:`dlprof.analysis.device_time`) when the run has
        device activity, plus ``input_shapes`` when grouped by shape, plus one column per CPU counter
        metric (``perf:task-clock``...) measured over these slices, summed per group.
        Percentages are of the total self time of the kind; ``cum_pct`` accumulates them down
        the sorted table. With ``per_rank``, :data:`PER_RANK_COLUMNS` come last: the least,
        median and most total time one rank spent in the row (a rank without it counts zero),
        and the rank that spent the most (the lowest on a tie).

    Raises:
        ValueError: sorting by device time in a run without device activity.
    """
    rows = top_rows(run, kind, by, group_by, limit, rank, per_rank, within, leaves)
    return rows.to_pandas({"calls": "int64", "total_ns": "int64", "self_ns": "int64", "avg_ns": "int64",
                           "min_ns": "int64", "max_ns": "int64", "bytes": "int64", "flops": "int64",
                           "self_pct": "float64", "cum_pct": "float64", DEVICE_COLUMN: "int64",
                           DEVICE_SELF_COLUMN: "int64",
                           "rank_median_ns": "float64", "max_rank": "int64", "rank_min_ns": "int64",
                           "rank_max_ns": "int64"})


def _counter_metrics(run: Run, selection: str, keys: list[str], table: list[dict[str, Any]]) -> list[str]:
    """Add each CPU counter metric measured over the selected slices, summed per group, to the
    rows (0 where a group has none); returns the metric names, sorted."""
    d = run.engine.dialect
    prefixes = " OR ".join(f"m.metric LIKE {d.literal(p + '%')}" for p in COUNTER_METRIC_PREFIXES)
    if not run.query(f"SELECT 1 FROM metrics m WHERE {prefixes} LIMIT 1").rows:
        return []
    key_list = ", ".join(f"s.{k}" for k in keys)
    sums = run.query(
        f"SELECT {key_list}, m.metric, sum(m.value) AS value FROM metrics m "
        f"JOIN ({selection}) AS s ON m.rank = s.rank AND m.slice_id = s.id WHERE {prefixes} "
        f"GROUP BY {key_list}, m.metric"
    )
    names = sorted({str(row[len(keys)]) for row in sums})
    found = {(tuple(row[: len(keys)]), str(row[len(keys)])): float(row[-1]) for row in sums}
    for row in table:
        key = tuple(row[k] for k in keys)
        for name in names:
            row[name] = round(found.get((key, name), 0.0))
    return names


def _add_rank_spread(run: Run, selection: str, keys: list[str], table: list[dict[str, Any]],
                     ranks: list[int]) -> None:
    """Add :data:`PER_RANK_COLUMNS` to each row: its total time per rank, spread."""
    key_list = ", ".join(keys)
    totals = run.query(
        f"SELECT {key_list}, rank, CAST(sum(dur_ns) AS BIGINT) AS ns FROM ({selection}) AS s "
        f"GROUP BY {key_list}, rank"
    )
    per_rank: dict[tuple[Any, ...], dict[int, int]] = {}
    for row in totals:
        per_rank.setdefault(tuple(row[: len(keys)]), {})[int(row[-2])] = int(row[-1])
    for row in table:
        spent = per_rank.get(tuple(row[k] for k in keys), {})
        values = [spent.get(r, 0) for r in ranks]
        most = max(values)
        row.update(rank_min_ns=min(values), rank_median_ns=float(statistics.median(values)),
                   rank_max_ns=most, max_rank=ranks[values.index(most)])


def op_types(slices: pd.DataFrame) -> pd.Series:
    """Each slice's logical type (``MatMul``) where the source recorded one, else its name
    (PyTorch records none: ``aten::mm`` is both)."""
    return slices["op_type"].astype(object).fillna(slices["name"].astype(object)).astype(str)
