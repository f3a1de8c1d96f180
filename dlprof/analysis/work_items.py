"""A run's work as items with FLOPs, bytes and time: what the roofline and estimates rest on.

    items = work_items(run)             # one row per kernel, memcpy, memset (a GPU run)
    items.table[["name", "op_name", "flops", "bytes", "time_ns", "mode"]]

On a GPU run an item is one device slice, tied to the CPU op whose runtime call launched it (the
innermost slice enclosing the launch). Its FLOPs come from the run's instruction counters where
the run has them (an FMA counts two), else from the op's FLOPs (torch's formulas over the input
shapes, or the trace's own figure) shared among the op's kernels by their time. Its bytes come
from DRAM counters where present, else a copy's or memset's own size, else the op's compulsory
traffic (:mod:`dlprof.analysis.traffic`) shared the same way. On a CPU run an item is an op that
has FLOPs, timed by its duration; every op's self time makes the whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import pandas as pd

from dlprof.analysis.math_modes import dtype_precision, math_mode
from dlprof.analysis.sql import DEVICE_KINDS_SQL, ON_CPU, launch_calls, rank_condition
from dlprof.analysis.traffic import op_bytes, parse_list
from dlprof.keys import PROFILER_RANGE, Kind
from dlprof.store.reader import Run

# Instruction counters that count FLOPs: (counter, FLOPs per instruction).
FLOP_COUNTERS: dict[str, int] = {
    f"cupti:smsp__sass_thread_inst_executed_op_{p}{op}_pred_on.sum": 2 if op == "fma" else 1
    for p in ("d", "f", "h") for op in ("add", "mul", "fma")
}
DRAM_COUNTERS = ("cupti:dram__bytes_read.sum", "cupti:dram__bytes_write.sum")
DRAM_TOTAL = "cupti:dram__bytes.sum"


class Source(StrEnum):
    """Where an item's FLOPs (or bytes) came from."""

    COUNTERS = "counters"
    SHAPES = "shapes"
    SIZE = "size"  # a copy's or memset's own byte count
    NONE = "none"


@dataclass(frozen=True)
class WorkItems:
    """The items of one run and what they cover."""

    table: pd.DataFrame
    on_gpu: bool  # items are device slices (else CPU ops)
    total_ns: int  # all device time (GPU), or all ops' self time (CPU)


def _counter_sums() -> str:
    flops = " + ".join(f"coalesce({n} * sum(CASE WHEN metric = '{c}' THEN value END), 0)"
                       for c, n in FLOP_COUNTERS.items())
    reads = " + ".join(f"coalesce(sum(CASE WHEN metric = '{c}' THEN value END), 0)" for c in DRAM_COUNTERS)
    counted = ", ".join(f"'{c}'" for c in (*FLOP_COUNTERS, *DRAM_COUNTERS, DRAM_TOTAL))
    return (
        f"SELECT rank, slice_id, {flops} AS counted_flops, "
        f"coalesce(sum(CASE WHEN metric = '{DRAM_TOTAL}' THEN value END), "
        f"CASE WHEN count(CASE WHEN metric IN ('{DRAM_COUNTERS[0]}', '{DRAM_COUNTERS[1]}') THEN 1 END) > 0 "
        f"THEN {reads} END) AS counted_bytes, "
        f"count(CASE WHEN metric IN ({', '.join(repr(c) for c in FLOP_COUNTERS)}) THEN 1 END) AS flop_counters "
        f"FROM metrics WHERE metric IN ({counted}) GROUP BY rank, slice_id"
    )


# Items in a fixed order on every engine, as they ran.
_IN_TIME_ORDER = " ORDER BY {t}.rank, {t}.start_ns, {t}.id"


def _layer_of_op(layers_sql: str) -> tuple[str, str]:
    """The ``layer`` column and the joins that find it for the op ``o`` (none without layers)."""
    if not layers_sql:
        return "CAST(NULL AS STRING) AS layer", ""
    return "m.name AS layer", (f" LEFT JOIN ({layers_sql}) AS a ON a.rank = o.rank AND a.id = o.id "
                               "LEFT JOIN slices m ON m.rank = a.rank AND m.id = a.ancestor_id")


def _gpu_query(rank: int | None, layers_sql: str) -> str:
    layer, layer_join = _layer_of_op(layers_sql)
    return (
        f"SELECT w.rank, w.id, w.kind, w.name, w.device, w.start_ns, "
        f"CASE WHEN w.kind = '{PROFILER_RANGE}' THEN NULL ELSE w.dur_ns END AS time_ns, "
        f"w.grid, w.block, w.registers, w.shared_memory, w.blocks_per_sm, w.bytes AS slice_bytes, "
        f"o.id AS op_id, o.name AS op_name, o.input_shapes, o.input_dtypes, o.flops AS op_flops, {layer}, "
        f"c.start_ns AS launch_ns, k.counted_flops, k.counted_bytes, k.flop_counters "
        f"FROM slices w LEFT JOIN ({launch_calls()}) AS c ON w.rank = c.rank AND w.correlation_id = c.correlation_id "
        f"LEFT JOIN slices o ON o.rank = c.rank AND o.id = c.parent_id{layer_join} "
        f"LEFT JOIN ({{counters}}) AS k ON k.rank = w.rank AND k.slice_id = w.id "
        f"WHERE (w.kind IN {DEVICE_KINDS_SQL} OR w.kind = '{PROFILER_RANGE}'){rank_condition(rank, 'w.rank')}"
        f"{_IN_TIME_ORDER.format(t='w')}"
    )


def _cpu_query(rank: int | None, layers_sql: str) -> str:
    layer, layer_join = _layer_of_op(layers_sql)
    return (
        f"SELECT o.rank, o.id, o.kind, o.name, 'cpu' AS device, o.start_ns, o.dur_ns AS time_ns, "
        f"CAST(NULL AS STRING) AS grid, CAST(NULL AS STRING) AS block, CAST(NULL AS INTEGER) AS registers, "
        f"CAST(NULL AS BIGINT) AS shared_memory, CAST(NULL AS FLOAT) AS blocks_per_sm, "
        f"CAST(NULL AS BIGINT) AS slice_bytes, o.id AS op_id, o.name AS op_name, o.input_shapes, "
        f"o.input_dtypes, o.flops AS op_flops, {layer}, o.start_ns AS launch_ns, CAST(NULL AS DOUBLE) AS counted_flops, "
        f"CAST(NULL AS DOUBLE) AS counted_bytes, 0 AS flop_counters "
        f"FROM slices o{layer_join} WHERE o.kind = '{Kind.OP}' AND o.flops IS NOT NULL AND {ON_CPU.replace('device', 'o.device')}"
        f"{rank_condition(rank, 'o.rank')}{_IN_TIME_ORDER.format(t='o')}"
    )


def work_items(run: Run, rank: int | None = None, with_layers: bool = False) -> WorkItems:
    """The run's work items with FLOPs, bytes, time and math mode.

    Args:
        run: the loaded run.
        rank: only this rank (None: every rank).
        with_layers: add ``layer``, the innermost module around each item's op (one more sort).

    Returns:
        Items with columns ``rank``, ``id``, ``kind``, ``name``, ``device``, ``time_ns`` (None
        where the trace holds a placeholder), the launch configuration, ``op_id``, ``op_name``,
        ``input_shapes``, ``layer``, ``launch_ns`` (when the CPU launched it), ``flops``, ``flops_source``, ``bytes``, ``bytes_source``,
        ``mode`` (a :class:`~dlprof.analysis.math_modes.MathMode`).
    """
    from dlprof.analysis.ancestry import nearest_ancestor

    on_gpu = bool(run.query(f"SELECT 1 FROM slices WHERE kind IN {DEVICE_KINDS_SQL} OR kind = '{PROFILER_RANGE}' "
                            "LIMIT 1").rows)
    layers = nearest_ancestor(run.engine.dialect, f"kind = '{Kind.MODULE}'", rank) if with_layers else ""
    if on_gpu:
        table = run.sql(_gpu_query(rank, layers).replace("{counters}", _counter_sums()))
        total = run.query(f"SELECT coalesce(sum(dur_ns), 0) FROM slices WHERE kind IN {DEVICE_KINDS_SQL}"
                          f"{rank_condition(rank)}").rows[0][0]
    else:
        table = run.sql(_cpu_query(rank, layers))
        total = run.query(f"SELECT coalesce(sum(self_ns), 0) FROM slices WHERE kind = '{Kind.OP}' AND {ON_CPU}"
                          f"{rank_condition(rank)}").rows[0][0]
    return WorkItems(_with_amounts(table), on_gpu, int(total))


def _with_amounts(table: pd.DataFrame) -> pd.DataFrame:
    """Add each item's FLOPs and bytes with their sources, and its math mode."""
    time = table["time_ns"].astype("float64")
    # Each op's FLOPs and bytes are shared among the items it launched by their time.
    op_time = time.groupby(table["op_id"]).transform("sum")
    share = (time / op_time).where(op_time > 0)
    per_op_bytes = [op_bytes(n, s, d) if isinstance(n, str) else None
                    for n, s, d in zip(table["op_name"], table["input_shapes"], table["input_dtypes"], strict=True)]
    shape_bytes = pd.Series(per_op_bytes, index=table.index, dtype="float64") * share
    copies = table["kind"].isin([str(Kind.MEMCPY), str(Kind.MEMSET)])
    counted = table["flop_counters"].fillna(0) > 0
    flops = np.where(counted, table["counted_flops"], np.where(copies, np.nan, table["op_flops"] * share))
    table["flops"] = flops
    table["flops_source"] = np.where(counted, str(Source.COUNTERS),
                                     np.where(pd.notna(flops), str(Source.SHAPES), str(Source.NONE)))
    has_dram = table["counted_bytes"].notna()
    table["bytes"] = np.where(has_dram, table["counted_bytes"],
                              np.where(copies, table["slice_bytes"], shape_bytes))
    table["bytes_source"] = np.where(has_dram, str(Source.COUNTERS), np.where(
        copies, str(Source.SIZE), np.where(shape_bytes.notna(), str(Source.SHAPES), str(Source.NONE))))
    table["mode"] = [math_mode(str(name), dtype_precision([str(t) for t in parse_list(dtypes)]))
                     for name, dtypes in zip(table["name"], table["input_dtypes"], strict=True)]
    return table
