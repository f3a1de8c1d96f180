"""tfprof's op view: ops grouped by their type, with memory, time and occurrence, as
``tfprof> op -select micros,bytes,occurrence -order_by micros`` prints them.

    table = op_view(dlprof.load("dlprof-runs/20261122-101500-train"), by=SortKey.MICROS)
    table[["name", "total_ns", "total_pct", "total_cum_pct", "occurrence"]]

What each op costs (:func:`op_costs`), following tfprof's definitions (its "Profile Time" and
"Profile Memory" guides):

- CPU time is the op's own time on its thread: its duration less the ops nested in it (a PyTorch
  ``aten::conv2d`` calls ``aten::convolution``), so no time is counted twice. Runtime calls it
  makes (``cudaLaunchKernel``) are part of it.
- Accelerator time is the device time (kernels, memcpy, memset) of the work the op launched.
- Total execution time is the sum of the two, as tfprof's ``exec_micros``.
- Requested bytes are the bytes the op allocated (frees are not subtracted), from the memory
  table's rows attributed to it or to a non-op slice inside it.
- The type is the op's logical type (``MatMul`` for TensorFlow's ``_MklMatMul``) where the source
  records one, otherwise its name (``aten::mm``).

Each measure comes with two percentages, as tfprof prints ``1.37sec (100.00%, 36.44%)``: the
row's share of the whole (``*_pct``), and the share of this row and every row after it in the
sort order (``*_cum_pct``, 100% on the first row, falling down the table). The shares are of all
types, also those a ``limit`` leaves out.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pandas as pd

from dlprof.analysis.aggregate import has_device_activity
from dlprof.analysis.ancestry import nearest_ancestor
from dlprof.analysis.sql import DEVICE_KINDS_SQL, launch_calls, rank_condition
from dlprof.keys import Kind, SortKey
from dlprof.store.reader import Run

# The measures of the op view, in tfprof's column order; each also gets *_pct and *_cum_pct.
MEASURES = ("bytes", "total_ns", "device_ns", "cpu_ns", "occurrence", "flops")

# The measure each sort key orders op types by.
SORT_COLUMN = {
    SortKey.MICROS: "total_ns",
    SortKey.SELF: "cpu_ns",  # an op type's own time: its ops less the ops nested in them
    SortKey.CALLS: "occurrence",
    SortKey.BYTES: "bytes",
    SortKey.FLOPS: "flops",
    SortKey.DEVICE: "device_ns",
}
IS_OP = f"kind = '{Kind.OP}'"


def percent_columns(measure: str) -> tuple[str, str]:
    """The share and cumulative-share columns of a measure: ``total_ns`` -> ``total_pct``,
    ``total_cum_pct``."""
    stem = measure.removesuffix("_ns")
    return f"{stem}_pct", f"{stem}_cum_pct"


OP_VIEW_COLUMNS = ["name", *(c for m in MEASURES for c in (m, *percent_columns(m)))]


@contextmanager
def kept_op_costs(run: Run, rank: int | None = None) -> Iterator[str]:
    """What each op cost, by tfprof's definitions (see the module's docstring), kept on the
    engine for the block's queries (each op's innermost op ancestor is computed once).

    Args:
        run: the run.
        rank: only this rank's ops (None: every rank).

    Yields:
        The name of a table with one row per op: ``rank``, ``id``, ``type``, ``cpu_ns``,
        ``device_ns``, ``exec_ns`` (their sum), ``bytes`` (requested) and ``flops`` (0 where
        unknown).
    """
    with run.kept("dlprof_op_ancestry", nearest_ancestor(run.engine.dialect, IS_OP, rank)) as ancestry, \
            run.kept("dlprof_op_costs", _costs_sql(ancestry, rank)) as costs:
        yield costs


def _costs_sql(ancestry: str, rank: int | None) -> str:
    # Work launched, and memory allocated, by a slice counts for the op it is or lies in.
    return (
        f"WITH nested AS (SELECT rank, ancestor_id AS id, sum(dur_ns) AS ns FROM {ancestry} "
        "WHERE is_wanted AND ancestor_id IS NOT NULL GROUP BY rank, ancestor_id), "
        f"launched AS (SELECT a.rank, a.own_id AS id, sum(w.dur_ns) AS ns FROM slices w "
        f"JOIN ({launch_calls()}) AS c ON w.rank = c.rank AND w.correlation_id = c.correlation_id "
        f"JOIN {ancestry} a ON a.rank = c.rank AND a.id = c.parent_id "
        f"WHERE w.kind IN {DEVICE_KINDS_SQL} AND a.own_id IS NOT NULL GROUP BY a.rank, a.own_id), "
        f"requested AS (SELECT a.rank, a.own_id AS id, sum(m.bytes) AS bytes FROM memory m "
        f"JOIN {ancestry} a ON a.rank = m.rank AND a.id = m.slice_id "
        "WHERE m.bytes > 0 AND a.own_id IS NOT NULL GROUP BY a.rank, a.own_id), "
        "costs AS (SELECT s.rank, s.id, coalesce(s.op_type, s.name) AS type, "
        "CAST(greatest(s.dur_ns - coalesce(n.ns, 0), 0) AS BIGINT) AS cpu_ns, "
        "CAST(coalesce(l.ns, 0) AS BIGINT) AS device_ns, CAST(coalesce(r.bytes, 0) AS BIGINT) AS bytes, "
        "CAST(coalesce(s.flops, 0) AS BIGINT) AS flops FROM slices s "
        "LEFT JOIN nested n ON n.rank = s.rank AND n.id = s.id "
        "LEFT JOIN launched l ON l.rank = s.rank AND l.id = s.id "
        "LEFT JOIN requested r ON r.rank = s.rank AND r.id = s.id "
        f"WHERE s.{IS_OP}{rank_condition(rank, 's.rank')}) "
        "SELECT rank, id, type, cpu_ns, device_ns, cpu_ns + device_ns AS exec_ns, bytes, flops FROM costs"
    )


def op_costs(run: Run, rank: int | None = None) -> pd.DataFrame:
    """What each op cost, by tfprof's definitions (see the module's docstring).

    Args:
        run: the run.
        rank: only this rank's ops (None: every rank).

    Returns:
        One row per op: ``id``, ``type``, ``cpu_ns``, ``device_ns``, ``exec_ns`` (their sum),
        ``bytes`` (requested) and ``flops`` (0 where unknown).
    """
    with kept_op_costs(run, rank) as costs:
        return run.sql(f"SELECT id, type, cpu_ns, device_ns, exec_ns, bytes, flops FROM {costs} ORDER BY rank, id")


def op_view(run: Run, by: SortKey = SortKey.MICROS, limit: int | None = None,
            rank: int | None = None) -> pd.DataFrame:
    """tfprof's op view: one row per op type, sorted by ``by``, descending.

    Args:
        run: the run.
        by: the sort key (micros: total execution time, self: CPU time, calls: occurrence,
            bytes: requested bytes, flops, device: accelerator time).
        limit: at most this many rows (None: all); percentages still count every type.
        rank: only this rank's ops.

    Returns:
        :data:`OP_VIEW_COLUMNS`: the type as ``name``, then per measure its value, its share of
        all types and the share of it and the rows after it (see the module's docstring).

    Raises:
        ValueError: sorting by device time in a run without device activity.
    """
    if by is SortKey.DEVICE and not has_device_activity(run):
        raise ValueError("--by device: this run has no device activity")
    with kept_op_costs(run, rank) as costs:
        table = run.sql(
            "SELECT type AS name, CAST(sum(bytes) AS BIGINT) AS bytes, CAST(sum(exec_ns) AS BIGINT) AS total_ns, "
            "CAST(sum(device_ns) AS BIGINT) AS device_ns, CAST(sum(cpu_ns) AS BIGINT) AS cpu_ns, "
            f"count(*) AS occurrence, CAST(sum(flops) AS BIGINT) AS flops FROM {costs} GROUP BY type"
        )
    if table.empty:
        return pd.DataFrame(columns=OP_VIEW_COLUMNS)
    table = table.astype({m: "int64" for m in MEASURES})
    table = table.sort_values([SORT_COLUMN[by], "name"], ascending=[False, True],
                              kind="stable").reset_index(drop=True)
    for measure in MEASURES:
        share, cumulative = percent_columns(measure)
        values = table[measure].astype(np.float64)
        whole = values.sum()
        table[share] = 100.0 * values / whole if whole else 0.0
        # tfprof's first percentage: this row and all below it, so it falls from 100%.
        table[cumulative] = 100.0 * values[::-1].cumsum()[::-1] / whole if whole else 0.0
    table = table[OP_VIEW_COLUMNS]
    return table.head(limit) if limit else table
