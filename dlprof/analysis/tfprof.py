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

import numpy as np
import pandas as pd

from dlprof.analysis.aggregate import launches, op_types
from dlprof.analysis.ancestors import NONE, nearest_ancestor_positions
from dlprof.keys import DEVICE_KINDS, Kind, SortKey
from dlprof.store.reader import Run

# The measures of the op view, in tfprof's column order; each also gets *_pct and *_cum_pct.
MEASURES = ("bytes", "total_ns", "device_ns", "cpu_ns", "occurrence", "flops")

_SORT_COLUMN = {
    SortKey.MICROS: "total_ns",
    SortKey.SELF: "cpu_ns",  # an op type's own time: its ops less the ops nested in them
    SortKey.CALLS: "occurrence",
    SortKey.BYTES: "bytes",
    SortKey.FLOPS: "flops",
    SortKey.DEVICE: "device_ns",
}


def percent_columns(measure: str) -> tuple[str, str]:
    """The share and cumulative-share columns of a measure: ``total_ns`` -> ``total_pct``,
    ``total_cum_pct``."""
    stem = measure.removesuffix("_ns")
    return f"{stem}_pct", f"{stem}_cum_pct"


OP_VIEW_COLUMNS = ["name", *(c for m in MEASURES for c in (m, *percent_columns(m)))]


def rank_slices(run: Run, rank: int | None) -> pd.DataFrame:
    """All slices of one rank (every rank when ``rank`` is None), rows numbered from 0."""
    slices = run.slices
    if rank is not None:
        slices = slices[slices["rank"] == rank]
    return slices.reset_index(drop=True)


def op_costs(run: Run, rank: int | None = None) -> pd.DataFrame:
    """What each op cost, by tfprof's definitions (see the module's docstring).

    Args:
        run: the run.
        rank: only this rank's ops (None: every rank).

    Returns:
        One row per op: ``id``, ``type``, ``cpu_ns``, ``device_ns``, ``exec_ns`` (their sum),
        ``bytes`` (requested) and ``flops`` (0 where unknown).
    """
    slices = rank_slices(run, rank)
    is_op = (slices["kind"] == Kind.OP).to_numpy()
    rows = len(slices)
    enclosing = nearest_ancestor_positions(slices, is_op)
    own_op = np.where(is_op, np.arange(rows), enclosing)  # a slice's op: itself or the one around it
    duration = slices["dur_ns"].to_numpy(dtype=np.int64)
    nested = is_op & (enclosing != NONE)
    nested_ns = np.bincount(enclosing[nested], weights=duration[nested], minlength=rows)
    positions = pd.Index(slices["id"].to_numpy(dtype=np.int64))

    def attributed(slice_ids: pd.Series, amounts: pd.Series) -> np.ndarray:
        """Sum ``amounts`` onto the op of each slice id (ids of other ranks, or of slices inside
        no op, are left out)."""
        found = positions.get_indexer(slice_ids.astype("Int64").fillna(NONE).to_numpy(dtype=np.int64))
        op = np.where(found == NONE, NONE, own_op[found])
        kept = op != NONE
        return np.bincount(op[kept], weights=amounts.to_numpy(dtype=np.float64)[kept], minlength=rows)

    launched = launches(run)
    device_ns = attributed(launched["launcher_id"], launched["dur_ns"])
    memory = run.memory
    if memory.empty:
        requested = np.zeros(rows)
    else:
        allocations = memory[memory["bytes"] > 0]
        requested = attributed(allocations["slice_id"], allocations["bytes"])
    ops = slices[is_op]
    cpu_ns = np.clip(duration[is_op] - nested_ns[is_op], 0, None).astype(np.int64)
    costs = pd.DataFrame({
        "id": ops["id"].to_numpy(dtype=np.int64),
        "type": op_types(ops).to_numpy(),
        "cpu_ns": cpu_ns,
        "device_ns": device_ns[is_op].round().astype(np.int64),
        "bytes": requested[is_op].round().astype(np.int64),
        "flops": ops["flops"].fillna(0).to_numpy(dtype=np.int64),
    })
    costs["exec_ns"] = costs["cpu_ns"] + costs["device_ns"]
    return costs


def has_device_activity(run: Run) -> bool:
    """Whether the run holds any kernel, memcpy or memset."""
    return bool(run.slices["kind"].isin([str(k) for k in DEVICE_KINDS]).any())


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
    costs = op_costs(run, rank)
    if costs.empty:
        return pd.DataFrame(columns=OP_VIEW_COLUMNS)
    table = costs.groupby("type", sort=False).agg(
        bytes=("bytes", "sum"),
        total_ns=("exec_ns", "sum"),
        device_ns=("device_ns", "sum"),
        cpu_ns=("cpu_ns", "sum"),
        occurrence=("id", "size"),
        flops=("flops", "sum"),
    ).rename_axis("name").reset_index()
    table = table.sort_values([_SORT_COLUMN[by], "name"], ascending=[False, True],
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
