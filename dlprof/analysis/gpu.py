"""Where each GPU's time goes, step by step: busy against idle, which kind of work kept it busy,
and how long kernels waited between their launch and their start.

    run = dlprof.load("dlprof-runs/20261122-101500-train")
    table = gpu_breakdown(run)
    table[["device", "step", "busy_pct", "kernel_pct", "delay_p95_ns"]]

Definitions (nanoseconds throughout):

- Busy time is the length of the union of a GPU's kernel, memcpy and memset intervals, so work
  overlapping on several streams is counted once. Of it, kernels come first, then memcpy, then
  memset: ``kernel_ns`` is the union of kernels, ``memcpy_ns`` what copies add to it, and
  ``memset_ns`` the rest, so the three add up to the busy time (as Holistic Trace Analysis splits
  compute from non-compute time).
- Each device slice belongs to the step during which its runtime call (``cudaLaunchKernel``...)
  started on the CPU, or, with no runtime call linked to it, the step its own start falls in.
- A step's window on a GPU starts at the step's CPU start, or where the previous step's window
  ended if that is later, and ends when both the step's CPU part and the device work belonging to
  it are over. A GPU running behind its CPU thus gets consecutive windows that never overlap, and
  the time it spends finishing one step's work is not counted as idle in the next.
- A step's busy time is the busy time inside its window; idle time is the window minus it.
- Every GPU also gets a row :data:`ALL`: from its first device slice's start to its last one's
  end, all of its work (the only row of a run without steps).
- Launch delay: a kernel's start minus the start of the runtime call that launched it, for
  kernels linked to one; it includes any wait behind earlier work on the stream.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dlprof.keys import DEVICE_KINDS, Kind
from dlprof.store.reader import Run

ALL = "all"  # the step column of a GPU's whole-run row

# The columns of gpu_breakdown, in order.
BREAKDOWN_COLUMNS = [
    "rank",
    "device",
    "step",
    "start_ns",
    "span_ns",
    "busy_ns",
    "idle_ns",
    "busy_pct",
    "kernel_ns",
    "memcpy_ns",
    "memset_ns",
    "kernel_pct",
    "memcpy_pct",
    "memset_pct",
    "kernels",
    "memcpys",
    "memsets",
    "launches",
    "delay_mean_ns",
    "delay_p50_ns",
    "delay_p95_ns",
    "delay_max_ns",
]

# The columns of device_work, in order.
WORK_COLUMNS = [
    "id", "rank", "device", "kind", "stream", "start_ns", "end_ns", "launch_ns", "step", "step_index"
]


def _of_rank(frame: pd.DataFrame, rank: int | None) -> pd.DataFrame:
    return frame if rank is None else frame[frame["rank"] == rank]


def cpu_steps(run: Run, rank: int | None = None) -> pd.DataFrame:
    """The training steps as the CPU saw them (``ProfilerStep#N`` slices), in time order.

    Args:
        run: the run.
        rank: only this rank's steps.

    Returns:
        Columns ``rank``, ``name``, ``start_ns``, ``end_ns``; one row per step slice.
    """
    slices = _of_rank(run.slices, rank)
    steps = slices[(slices["kind"] == Kind.STEP) & (slices["device"] == "cpu")]
    frame = pd.DataFrame(
        {
            "rank": steps["rank"].astype("int64"),
            "name": steps["name"].astype(str),
            "start_ns": steps["start_ns"].astype("int64"),
            "end_ns": (steps["start_ns"] + steps["dur_ns"]).astype("int64"),
        }
    )
    return frame.sort_values(["rank", "start_ns"], kind="stable").reset_index(drop=True)


def device_work(run: Run, rank: int | None = None) -> pd.DataFrame:
    """Every kernel, memcpy and memset, with its runtime call's start and the step it belongs to.

    The runtime call is found as :func:`dlprof.analysis.aggregate.launches` finds it, by
    correlation id within a rank; here its start is kept rather than its parent op.

    Args:
        run: the run.
        rank: only this rank's work.

    Returns:
        :data:`WORK_COLUMNS`: ``launch_ns`` is missing where no runtime call is linked; ``step``
        (the step's name) and ``step_index`` (its position among the rank's steps in
        :func:`cpu_steps`) are missing where the work belongs to no step.
    """
    slices = _of_rank(run.slices, rank)
    device = slices[slices["kind"].isin([str(k) for k in DEVICE_KINDS])]
    runtime = slices[(slices["kind"] == Kind.RUNTIME) & slices["correlation_id"].notna()]
    # One call per correlation id, as launches() keeps; a repeated id would duplicate work.
    calls = (
        runtime[["rank", "correlation_id", "start_ns"]]
        .drop_duplicates(["rank", "correlation_id"])
        .rename(columns={"start_ns": "launch_ns"})
    )
    work = device[["id", "rank", "device", "kind", "stream", "start_ns", "dur_ns", "correlation_id"]]
    work = work[work["correlation_id"].notna()].merge(calls, on=["rank", "correlation_id"], how="left")
    unlinked = device[device["correlation_id"].isna()].assign(launch_ns=pd.NA)
    work = pd.concat([work, unlinked[work.columns]], ignore_index=True) if len(unlinked) else work
    work = work.assign(
        rank=work["rank"].astype("int64"),
        device=work["device"].astype(str),
        kind=work["kind"].astype(str),
        start_ns=work["start_ns"].astype("int64"),
        end_ns=(work["start_ns"] + work["dur_ns"]).astype("int64"),
        launch_ns=work["launch_ns"].astype("Int64"),
    )
    steps = cpu_steps(run, rank)
    index = _step_of(work, steps)
    work["step_index"] = index
    work["step"] = _step_names(work["rank"], index, steps)
    return work[WORK_COLUMNS].sort_values(["rank", "device", "start_ns"], kind="stable").reset_index(
        drop=True
    )


def _step_of(work: pd.DataFrame, steps: pd.DataFrame) -> pd.Series:
    """The position among its rank's steps of the step each device slice belongs to, or missing."""
    result = pd.Series(pd.NA, index=work.index, dtype="Int64")
    # Launch time where known: a step's work often runs after the step has ended on the CPU.
    when = work["launch_ns"].fillna(work["start_ns"]).astype("int64")
    for rank, rank_steps in steps.groupby("rank"):
        mine = work["rank"] == rank
        starts = rank_steps["start_ns"].to_numpy()
        ends = rank_steps["end_ns"].to_numpy()
        times = when[mine].to_numpy()
        index = np.searchsorted(starts, times, side="right") - 1
        inside = (index >= 0) & (times < ends[np.maximum(index, 0)])
        result[mine] = pd.array(np.where(inside, index, -1), dtype="Int64")
    return result.mask(result < 0)


def _step_names(ranks: pd.Series, index: pd.Series, steps: pd.DataFrame) -> pd.Series:
    """Step names from (rank, position among the rank's steps)."""
    position = steps.groupby("rank").cumcount()
    names = dict(zip(zip(steps["rank"], position, strict=True), steps["name"], strict=True))
    keys = zip(ranks.tolist(), index.tolist(), strict=True)
    return pd.Series([names.get(key) for key in keys], index=index.index, dtype=object)


class Coverage:
    """The union of a set of intervals, and how much of it lies in any window."""

    def __init__(self, starts: np.ndarray, ends: np.ndarray) -> None:
        if len(starts) == 0:
            self.starts = self.ends = self.before = np.zeros(1, dtype=np.int64)
            return
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
        reach = np.maximum.accumulate(ends)
        # A merged block begins where a start lies past every end before it.
        opens = np.ones(len(starts), dtype=bool)
        opens[1:] = starts[1:] > reach[:-1]
        first = np.flatnonzero(opens)
        last = np.append(first[1:] - 1, len(starts) - 1)
        self.starts = starts[first]
        self.ends = reach[last]
        # Covered length of all the blocks before each one.
        self.before = np.concatenate(([0], np.cumsum(self.ends - self.starts)[:-1]))

    def upto(self, times: np.ndarray) -> np.ndarray:
        """Covered length from the beginning of time to each of ``times``."""
        block = np.searchsorted(self.starts, times, side="right") - 1
        safe = np.maximum(block, 0)
        partial = np.clip(times - self.starts[safe], 0, self.ends[safe] - self.starts[safe])
        return np.where(block >= 0, self.before[safe] + partial, 0)

    def within(self, lows: np.ndarray, highs: np.ndarray) -> np.ndarray:
        """Covered length inside each window ``[low, high]``."""
        covered: np.ndarray = self.upto(highs) - self.upto(lows)
        return covered


def _windows(gpu_work: pd.DataFrame, steps: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Each step's window on one GPU (see the module's docstring)."""
    last_end = gpu_work.dropna(subset=["step_index"]).groupby("step_index")["end_ns"].max()
    work_end = np.full(len(steps), np.iinfo(np.int64).min, dtype=np.int64)
    work_end[last_end.index.to_numpy(dtype=np.int64)] = last_end.to_numpy(dtype=np.int64)
    ends = np.maximum(steps["end_ns"].to_numpy(), work_end)
    previous = np.concatenate(([np.iinfo(np.int64).min], np.maximum.accumulate(ends)[:-1]))
    starts = np.minimum(np.maximum(steps["start_ns"].to_numpy(), previous), ends)
    return starts, ends


def _delay_stats(delays: np.ndarray) -> dict[str, float]:
    if len(delays) == 0:
        nan = float("nan")
        return {"delay_mean_ns": nan, "delay_p50_ns": nan, "delay_p95_ns": nan, "delay_max_ns": nan}
    # numpy's default (linear) interpolation between ranks, as pandas' quantile.
    p50, p95 = np.percentile(delays, [50, 95])
    return {
        "delay_mean_ns": float(delays.mean()),
        "delay_p50_ns": float(p50),
        "delay_p95_ns": float(p95),
        "delay_max_ns": float(delays.max()),
    }


def _counts(work: pd.DataFrame) -> dict[str, float | int]:
    kinds = work["kind"].to_numpy()
    kernels = work[kinds == Kind.KERNEL]
    linked = kernels[kernels["launch_ns"].notna()]
    # Integers all the way: epoch nanoseconds pass through a float with a few hundred ns lost.
    delays = linked["start_ns"].to_numpy(dtype=np.int64) - linked["launch_ns"].to_numpy(dtype=np.int64)
    return {
        "kernels": int((kinds == Kind.KERNEL).sum()),
        "memcpys": int((kinds == Kind.MEMCPY).sum()),
        "memsets": int((kinds == Kind.MEMSET).sum()),
        "launches": len(delays),
        **_delay_stats(delays),
    }


def _gpu_rows(rank: int, device: str, work: pd.DataFrame, steps: pd.DataFrame) -> list[dict[str, object]]:
    """The rows of one GPU: one per step of its rank, then its whole-run row."""
    kinds = work["kind"].to_numpy()
    starts, ends = work["start_ns"].to_numpy(), work["end_ns"].to_numpy()
    # Nested coverages give the kernel-first split: each kind adds what the ones before lack.
    layers = [
        Coverage(starts[mask], ends[mask])
        for mask in (kinds == Kind.KERNEL, np.isin(kinds, [Kind.KERNEL, Kind.MEMCPY]), np.ones(len(kinds), bool))
    ]
    low, high = _windows(work, steps)
    names = steps["name"].tolist()
    low = np.append(low, starts.min())
    high = np.append(high, ends.max())
    covered = [layer.within(low, high) for layer in layers]
    groups = dict(tuple(work.groupby("step_index")))
    rows: list[dict[str, object]] = []
    for i, name in enumerate([*names, ALL]):
        mine = work if i == len(names) else groups.get(i, work.iloc[:0])
        span, busy = int(high[i] - low[i]), int(covered[2][i])
        kernel, copies = int(covered[0][i]), int(covered[1][i] - covered[0][i])
        rows.append(
            {
                "rank": rank,
                "device": device,
                "step": name,
                "start_ns": int(low[i]),
                "span_ns": span,
                "busy_ns": busy,
                "idle_ns": span - busy,
                "busy_pct": 100.0 * busy / span if span else 0.0,
                "kernel_ns": kernel,
                "memcpy_ns": copies,
                "memset_ns": busy - kernel - copies,
                "kernel_pct": 100.0 * kernel / busy if busy else 0.0,
                "memcpy_pct": 100.0 * copies / busy if busy else 0.0,
                "memset_pct": 100.0 * (busy - kernel - copies) / busy if busy else 0.0,
                **_counts(mine),
            }
        )
    return rows


def _device_order(device: str) -> tuple[str, int]:
    """``cuda:2`` before ``cuda:10``."""
    family, _, index = device.partition(":")
    return family, int(index) if index.isdigit() else -1


def gpu_breakdown(run: Run, rank: int | None = None) -> pd.DataFrame:
    """Busy and idle time, their split by kind of work, and launch delays, per GPU and per step.

    Args:
        run: the run.
        rank: only this rank.

    Returns:
        :data:`BREAKDOWN_COLUMNS`, one row per (rank, GPU, step) in time order and a row
        :data:`ALL` per GPU after its steps; empty when there is no device activity. Delay
        statistics are missing (NaN) where no kernel with a linked launch belongs to the row.
    """
    work = device_work(run, rank)
    steps = cpu_steps(run, rank)
    rows: list[dict[str, object]] = []
    gpus = sorted(
        work[["rank", "device"]].drop_duplicates().itertuples(index=False),
        key=lambda gpu: (gpu[0], _device_order(gpu[1])),
    )
    for gpu_rank, device in gpus:
        mine = work[(work["rank"] == gpu_rank) & (work["device"] == device)]
        rank_steps = steps[steps["rank"] == gpu_rank].reset_index(drop=True)
        rows.extend(_gpu_rows(int(gpu_rank), str(device), mine, rank_steps))
    return pd.DataFrame(rows, columns=BREAKDOWN_COLUMNS)
