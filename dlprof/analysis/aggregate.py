"""Flat profiles: slices grouped by name (or name and shape), as tfprof's and TAU's tables show.

Pure functions from a loaded run to DataFrames; the views print them.
"""

from __future__ import annotations

import pandas as pd

from dlprof.keys import DEVICE_KINDS, GroupKey, Kind, SortKey
from dlprof.store.reader import Run

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
DEVICE_COLUMN = "device_ns"
# Metrics from CPU counters measured over step and region slices: shown as extra top columns.
# (Per-kernel GPU metrics stay with `dlprof metrics`, where they are derived and explained.)
COUNTER_METRIC_PREFIXES = ("perf:", "papi:")

_SORT_COLUMN = {
    SortKey.MICROS: "total_ns",
    SortKey.SELF: "self_ns",
    SortKey.CALLS: "calls",
    SortKey.BYTES: "bytes",
    SortKey.FLOPS: "flops",
    SortKey.DEVICE: DEVICE_COLUMN,
}


def slices_of_kind(run: Run, kind: str, rank: int | None = None) -> pd.DataFrame:
    """The slices of one kind (of one rank, if given)."""
    slices = run.slices
    selected = slices[slices["kind"] == str(kind)]
    if rank is not None:
        selected = selected[selected["rank"] == rank]
    return selected


UNATTRIBUTED = "(no launching op)"


def launches(run: Run) -> pd.DataFrame:
    """Each device slice (kernel, memcpy, memset) with the CPU op that launched it.

    A device slice is linked to the runtime call that launched it by correlation id (per rank);
    the call's parent is the op.

    Returns:
        Columns ``id`` (the device slice), ``dur_ns`` and ``launcher_id`` (the op; missing when
        the trace links none).
    """
    slices = run.slices
    device = slices[slices["kind"].isin(list(DEVICE_KINDS))]
    runtime = slices[(slices["kind"] == Kind.RUNTIME) & slices["correlation_id"].notna()]
    calls = runtime[["rank", "correlation_id", "parent_id"]].dropna().drop_duplicates(
        ["rank", "correlation_id"]
    )
    joined = device[["id", "rank", "correlation_id", "dur_ns"]].merge(
        calls, on=["rank", "correlation_id"], how="left"
    )
    return joined.rename(columns={"parent_id": "launcher_id"})[["id", "dur_ns", "launcher_id"]]


def device_time_by_launcher(run: Run) -> pd.Series:
    """Device time (kernels, memcpy, memset) per id of the CPU op that launched it."""
    linked = launches(run).dropna(subset=["launcher_id"])
    return linked.groupby("launcher_id")["dur_ns"].sum()


def top(
    run: Run,
    kind: str = Kind.OP,
    by: SortKey = SortKey.MICROS,
    group_by: GroupKey = GroupKey.NAME,
    limit: int | None = 15,
    rank: int | None = None,
    per_rank: bool = False,
) -> pd.DataFrame:
    """Aggregate the slices of one kind into a table, sorted and cut to ``limit`` rows.

    Args:
        run: the run.
        kind: which slices (``op``, ``module``, ``region``, ``step``, ``kernel``...).
        by: what the rows are sorted by, descending.
        group_by: one row per name, per (name, input shapes), per type (:func:`op_types`), or,
            for device kinds, per name of the CPU op that launched the work.
        limit: at most this many rows (None: all).
        rank: only this rank's slices.
        per_rank: add how each row's total time spreads over the ranks (:func:`rank_spread`).

    Returns:
        One row per group with :data:`TOP_COLUMNS`, plus ``device_ns`` when the run has device
        activity, plus ``input_shapes`` when grouped by shape, plus one column per CPU counter
        metric (``perf:task-clock``...) measured over these slices, summed per group. Percentages are of the total
        self time of the kind; ``cum_pct`` accumulates them down the sorted table. With
        ``per_rank``, :data:`PER_RANK_COLUMNS` come last.
    """
    selected = slices_of_kind(run, kind, rank)
    keys = ["name", "input_shapes"] if group_by is GroupKey.SHAPE else ["name"]
    if selected.empty:
        return pd.DataFrame(columns=TOP_COLUMNS)
    frame = selected.assign(input_shapes=selected["input_shapes"].fillna(""))
    if group_by is GroupKey.OP and kind in DEVICE_KINDS:
        frame = frame.assign(name=_launcher_names(run, frame))
    elif group_by is GroupKey.TYPE:
        frame = frame.assign(name=op_types(frame))
    launched = device_time_by_launcher(run)
    if kind in DEVICE_KINDS:
        frame = frame.assign(device_ns=frame["dur_ns"])
    elif not launched.empty:
        frame = frame.assign(device_ns=frame["id"].map(launched).fillna(0).astype("int64"))
    elif by is SortKey.DEVICE:
        raise ValueError("--by device: this run has no device activity")
    counted = counter_metrics(run, frame["id"])
    if not counted.empty:
        frame = frame.join(counted, on="id")
    grouped = frame.groupby(keys, sort=False, dropna=False)
    table = grouped.agg(
        calls=("id", "size"),
        total_ns=("dur_ns", "sum"),
        self_ns=("self_ns", "sum"),
        min_ns=("dur_ns", "min"),
        max_ns=("dur_ns", "max"),
        bytes=("bytes", lambda s: int(s.sum(min_count=1)) if s.notna().any() else 0),
        flops=("flops", lambda s: int(s.sum(min_count=1)) if s.notna().any() else 0),
        **({DEVICE_COLUMN: (DEVICE_COLUMN, "sum")} if DEVICE_COLUMN in frame else {}),
        **{metric: (metric, "sum") for metric in counted.columns},
    ).reset_index()
    for metric in counted.columns:
        table[metric] = table[metric].round().astype("int64")
    for column in ("calls", "total_ns", "self_ns", "min_ns", "max_ns", "bytes", "flops"):
        table[column] = table[column].astype("int64")
    table["avg_ns"] = table["total_ns"] // table["calls"].clip(lower=1)
    all_self = table["self_ns"].sum()
    table["self_pct"] = 100.0 * table["self_ns"] / all_self if all_self else 0.0
    table = table.sort_values(
        [_SORT_COLUMN[by], "name"], ascending=[False, True], kind="stable"
    ).reset_index(drop=True)
    table["cum_pct"] = table["self_pct"].cumsum()
    columns = list(TOP_COLUMNS)
    if group_by is GroupKey.SHAPE:
        columns.insert(1, "input_shapes")
    if DEVICE_COLUMN in table:
        columns.append(DEVICE_COLUMN)
    columns.extend(counted.columns)
    table = table[columns]
    table = table.head(limit) if limit else table
    if per_rank:
        ranks = [rank] if rank is not None else sorted(int(r) for r in run.slices["rank"].unique())
        table = table.merge(rank_spread(frame, keys, ranks), on=keys, how="left")
    return table


# Added by top(per_rank=True): how a row's total time spreads over the ranks.
PER_RANK_COLUMNS = ["rank_min_ns", "rank_median_ns", "rank_max_ns", "max_rank"]


def rank_spread(frame: pd.DataFrame, keys: list[str], ranks: list[int]) -> pd.DataFrame:
    """Per group of slices, the least, median and most total time one rank spent in it, and
    the rank that spent the most.

    Args:
        frame: slices with a ``rank`` column and the ``keys`` columns.
        keys: the columns whose values make a group.
        ranks: the ranks to spread over; a rank without slices in a group counts zero there.

    Returns:
        The ``keys`` columns and :data:`PER_RANK_COLUMNS`; a tie for the most goes to the
        lowest rank.
    """
    totals = frame.groupby([*keys, "rank"], sort=False, dropna=False)["dur_ns"].sum()
    per_rank = totals.unstack("rank", fill_value=0).reindex(columns=ranks, fill_value=0)
    spread = pd.DataFrame({
        "rank_min_ns": per_rank.min(axis=1).astype("int64"),
        "rank_median_ns": per_rank.median(axis=1).astype("float64"),
        "rank_max_ns": per_rank.max(axis=1).astype("int64"),
        "max_rank": per_rank.idxmax(axis=1).astype("int64"),
    })
    return spread.reset_index()


def counter_metrics(run: Run, slice_ids: pd.Series) -> pd.DataFrame:
    """CPU counter metrics of the given slices: one row per slice id, one column per metric."""
    metrics = run.metrics
    if metrics.empty:
        return pd.DataFrame()
    names = metrics["metric"].astype(str)
    wanted = metrics[names.str.startswith(COUNTER_METRIC_PREFIXES) & metrics["slice_id"].isin(slice_ids)]
    if wanted.empty:
        return pd.DataFrame()
    pivot = wanted.assign(metric=wanted["metric"].astype(str)).pivot_table(
        index="slice_id", columns="metric", values="value", aggfunc="sum"
    )
    pivot.columns = [str(c) for c in pivot.columns]
    return pivot


def op_types(slices: pd.DataFrame) -> pd.Series:
    """Each slice's logical type (``MatMul``) where the source recorded one, else its name
    (PyTorch records none: ``aten::mm`` is both)."""
    return slices["op_type"].astype(object).fillna(slices["name"].astype(object)).astype(str)


def _launcher_names(run: Run, device: pd.DataFrame) -> pd.Series:
    """The name of the op that launched each device slice (or :data:`UNATTRIBUTED`)."""
    names = run.slices.set_index("id")["name"]
    launcher = device["id"].map(launches(run).set_index("id")["launcher_id"])
    return launcher.map(names).fillna(UNATTRIBUTED).astype(str)


def kinds_present(run: Run) -> list[str]:
    """The kinds of slice the run holds, most frequent first."""
    return [str(kind) for kind in run.slices["kind"].value_counts().index]
