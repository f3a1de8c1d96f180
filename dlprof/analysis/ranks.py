"""The ranks of a distributed run side by side: where each one's step time goes (compute,
communication, idle), how much of its communication computation hides, and which ranks hold the
others back, in the spirit of Holistic Trace Analysis's comm/comp overlap and straggler analyses.

    run = dlprof.load("dlprof-runs/20261122-101500-ddp")
    rank_summary(run)[["rank", "step_median_ns", "comm_pct", "overlap_pct", "straggler_steps"]]
    stragglers(run, threshold_pct=5.0)[["step", "rank", "step_lag_pct", "arrival_lag_pct"]]

Definitions (nanoseconds throughout):

- Communication is every slice of kind ``comm`` and every device kernel that is an NCCL or RCCL
  collective (:func:`is_collective_kernel`).
- A rank with device work (kernels, memcpy, memset) is measured on its GPUs, where the work runs:
  communication is its collective kernels (the CPU's ``c10d::`` calls only enqueue them), compute
  its other kernels, and memory its memcpy and memset. A rank without is measured on its CPU
  threads: communication is its ``comm`` slices, compute the time of its ops (nested ones counted
  once) outside any communication on the same thread.
- Each is the length of a union of intervals, so work on several streams or threads counts once.
  ``overlap_ns`` is communication time during which compute ran too; ``overlap_pct`` is its share
  of the communication time, as HTA defines comm/comp overlap. ``memory_ns`` is what copies add to
  compute and communication, ``idle_ns`` the rest of the window: compute + comm - overlap + memory
  + idle = span.
- Windows: on a CPU, a step's window is the step (``ProfilerStep#N``); on GPUs, its window as
  :mod:`dlprof.analysis.gpu` defines it (from the step's start until its device work is done). A
  rank without steps has one window, :data:`ALL`, over its whole span; a rank's summary adds up its
  windows.
- Steps are matched across ranks by their number, and collectives within a step by name and order:
  the k-th top-level communication slice (or collective kernel) of a name in a step, by start.
  A rank's arrival at a collective is that slice's start. Ranks' timestamps are compared as the
  run holds them: arrival lags are as good as the alignment of the ranks' clocks.
- Lags and stragglers (:mod:`dlprof.analysis.rank_lags`): a rank is compared with the other
  ranks. Its arrival lag at a collective is its arrival minus the latest of the others' (positive
  only for the last to arrive: how long the others waited for it alone), its arrival lag in a step
  the time the others waited for it alone less the time it waited for them, its step lag its step time (the CPU step's duration) minus
  the median of the others'. It is a straggler in a step when its arrival lag (in a step without
  collectives, its step lag) is positive and exceeds ``threshold_pct`` percent of the step's
  median time over ranks; a rank faster than the others never is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dlprof.analysis.aggregate import has_device_activity
from dlprof.analysis.gpu import ALL, Coverage, cpu_steps, gpu_breakdown, work_sql
from dlprof.analysis.rank_lags import lag_behind_latest_other, lag_table, match_key
from dlprof.analysis.sql import DEVICE_KINDS_SQL
from dlprof.keys import Kind
from dlprof.store.reader import Run

DEFAULT_THRESHOLD_PCT = 10.0
CPU = "cpu"  # measured_on of a rank measured on its CPU threads

# NCCL's kernels (ncclKernel_AllReduce_RING_LL_Sum_float, ncclDevKernel_AllGather_RING_LL,
# ncclAllReduceRingLLKernel_sum_f32 before NCCL 2.5), which RCCL keeps on AMD GPUs.
_COLLECTIVE_KERNEL = re.compile(r"(?:void )?[nr]ccl\w*Kernel")
_COLLECTIVE_KERNEL_SQL = r"^(void )?[nr]ccl\w*Kernel"  # the same, anchored as re.match is
_STEP_NUMBER = re.compile(r"#\s*(\d+)\s*$")

# The columns of rank_steps, in order.
STEP_COLUMNS = [
    "rank", "step", "step_number", "measured_on", "start_ns", "step_ns", "window_start_ns",
    "span_ns", "compute_ns", "comm_ns", "overlap_ns", "memory_ns", "idle_ns",
    "compute_pct", "comm_pct", "idle_pct", "overlap_pct", "collectives",
    "median_step_ns", "step_lag_ns", "step_lag_pct", "arrival_lag_ns", "arrival_lag_pct",
    "late_collective", "late_occurrence", "straggler",
]
# The columns of collective_arrivals, in order.
ARRIVAL_COLUMNS = ["step", "step_number", "collective", "occurrence", "rank", "arrival_ns", "lag_ns"]
# The columns of rank_summary, in order.
SUMMARY_COLUMNS = [
    "rank", "measured_on", "steps", "step_median_ns", "step_max_ns", "span_ns", "compute_ns",
    "comm_ns", "overlap_ns", "memory_ns", "idle_ns", "compute_pct", "comm_pct", "idle_pct",
    "overlap_pct", "collectives", "straggler_steps", "max_lag_pct",
]
_TIME_COLUMNS = ["span_ns", "compute_ns", "comm_ns", "overlap_ns", "memory_ns", "idle_ns"]


def is_collective_kernel(name: str) -> bool:
    """Whether a device kernel is an NCCL/RCCL collective (``ncclDevKernel_AllReduce_...``)."""
    return _COLLECTIVE_KERNEL.match(name) is not None


def communication_mask(slices: pd.DataFrame) -> pd.Series:
    """Which slices are communication: kind ``comm``, or a collective kernel."""
    kernels = slices["kind"] == Kind.KERNEL
    collective = slices["name"].astype(str).str.match(_COLLECTIVE_KERNEL.pattern)
    return (slices["kind"] == Kind.COMM) | (kernels & collective)


@dataclass(frozen=True)
class _Timeline:
    """One rank's work as this analysis sees it, and its windows."""

    rank: int
    measured_on: str
    windows: pd.DataFrame  # step, step_number, start_ns, step_ns, low, high; in time order
    compute: Coverage
    comm: Coverage
    working: Coverage  # compute and communication
    busy: Coverage  # and memory
    arrivals: pd.DataFrame  # window (position in windows), collective, arrival_ns


def _ends(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    starts = frame["start_ns"].to_numpy(dtype=np.int64)
    return starts, starts + frame["dur_ns"].to_numpy(dtype=np.int64)


def _coverage(frame: pd.DataFrame) -> Coverage:
    return Coverage(*_ends(frame))


def _without(keep: Coverage, cut: Coverage) -> tuple[np.ndarray, np.ndarray]:
    """The parts of ``keep``'s union outside ``cut``'s, as intervals."""
    edges = np.unique(np.concatenate([keep.starts, keep.ends, cut.starts, cut.ends]))
    low, high = edges[:-1], edges[1:]
    # Between consecutive edges, each union covers either all of a piece or none of it.
    outside = (keep.within(low, high) > 0) & (cut.within(low, high) == 0)
    return low[outside], high[outside]


def _outermost(comm: pd.DataFrame) -> pd.DataFrame:
    """The communication slices not inside another on their thread (c10d::allreduce_, not the
    record_param_comms and nccl:all_reduce within it)."""
    ordered = comm.assign(end_ns=comm["start_ns"] + comm["dur_ns"]).sort_values(
        ["pid", "tid", "start_ns", "dur_ns"], ascending=[True, True, True, False], kind="stable")
    reach = ordered.groupby(["pid", "tid"])["end_ns"].cummax()
    before = reach.groupby([ordered["pid"], ordered["tid"]]).shift(1)
    return ordered[before.isna() | (ordered["start_ns"] >= before)]


def _cpu_timeline(rank: int, cpu: pd.DataFrame, extent: tuple[int, int] | None, steps: pd.DataFrame) -> _Timeline:
    """A rank measured on its CPU threads: ``cpu`` holds its ops and communication, ``extent``
    the first start and last end of any of its CPU slices."""
    comm = cpu[cpu["is_comm"]]
    ops = cpu[cpu["kind"] == Kind.OP]
    pieces = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    # Per thread: an op that waits in a collective it encloses is not computing meanwhile, while
    # ops on another thread are, and overlap the collective.
    for thread, thread_ops in ops.groupby(["pid", "tid"]):
        mine = comm[(comm["pid"] == thread[0]) & (comm["tid"] == thread[1])]
        low, high = _without(_coverage(thread_ops), _coverage(mine))
        pieces[0].append(low)
        pieces[1].append(high)
    compute = Coverage(np.concatenate(pieces[0]), np.concatenate(pieces[1]))
    if steps.empty:
        first, last = extent or (0, 0)
        windows = _one_window(np.array([first]), np.array([last]))
    else:
        windows = steps.assign(low=steps["start_ns"], high=steps["start_ns"] + steps["step_ns"])
    outer = _outermost(comm)
    return _timeline(rank, CPU, windows, compute, _coverage(comm), Coverage(np.zeros(0), np.zeros(0)),
                     outer, _window_of_start(outer["start_ns"], windows))


def _gpu_timeline(rank: int, device: pd.DataFrame, steps: pd.DataFrame, gpus: pd.DataFrame,
                  owners: pd.Series) -> _Timeline:
    """A rank measured on its GPUs: ``device`` holds its device work and device communication,
    ``owners`` each collective kernel's step index (by id)."""
    # Masks over the rank's arrays, not copies of its frame: millions of rows at scale.
    is_comm = device["is_comm"].to_numpy(dtype=bool)
    kind = device["kind"].to_numpy()
    starts, ends = _ends(device)
    compute = ~is_comm & (kind == Kind.KERNEL)
    memory = (kind == Kind.MEMCPY) | (kind == Kind.MEMSET)
    comm = device[is_comm]
    # Several GPUs of one rank: each step's window spans theirs.
    per_step = gpus[gpus["step"] != ALL] if len(steps) else gpus[gpus["step"] == ALL]
    position = per_step.groupby("device").cumcount()
    spans = per_step.assign(position=position, end=per_step["start_ns"] + per_step["span_ns"])
    bounds = spans.groupby("position").agg(low=("start_ns", "min"), high=("end", "max"))
    if steps.empty:
        windows = _one_window(bounds["low"].to_numpy(), bounds["high"].to_numpy())
    else:
        windows = steps.assign(low=bounds["low"].to_numpy(), high=bounds["high"].to_numpy())
    # A collective kernel belongs to the step that launched it, as GPU windows are drawn.
    owner = comm["id"].map(owners).astype("Int64")
    window = owner if len(steps) else pd.Series(0, index=comm.index, dtype="Int64")
    measured_on = ",".join(sorted(gpus["device"].unique()))
    return _timeline(rank, measured_on, windows, Coverage(starts[compute], ends[compute]),
                     Coverage(starts[is_comm], ends[is_comm]), Coverage(starts[memory], ends[memory]), comm, window)


def _one_window(starts: np.ndarray, ends: np.ndarray | None = None) -> pd.DataFrame:
    """The single window of a rank without steps: from its first start to its last end."""
    low, high = int(starts.min()), int((starts if ends is None else ends).max())
    return pd.DataFrame({"step": [ALL], "step_number": pd.array([pd.NA], dtype="Int64"),
                         "start_ns": [low], "step_ns": [high - low], "low": [low], "high": [high]})


def _window_of_start(starts: pd.Series, windows: pd.DataFrame) -> pd.Series:
    """The position of the window each start lies in, or missing."""
    lows, highs = windows["low"].to_numpy(), windows["high"].to_numpy()
    times = starts.to_numpy(dtype=np.int64)
    index = np.searchsorted(lows, times, side="right") - 1
    inside = (index >= 0) & (times < highs[np.maximum(index, 0)])
    return pd.Series(np.where(inside, index, -1), index=starts.index, dtype="Int64").mask(lambda s: s < 0)


def _timeline(rank: int, measured_on: str, windows: pd.DataFrame, compute: Coverage, comm: Coverage,
              memory: Coverage, arriving: pd.DataFrame, window: pd.Series) -> _Timeline:
    starts = [compute.starts, comm.starts]
    ends = [compute.ends, comm.ends]
    working = Coverage(np.concatenate(starts), np.concatenate(ends))
    busy = Coverage(np.concatenate([*starts, memory.starts]), np.concatenate([*ends, memory.ends]))
    arrivals = pd.DataFrame({"window": window, "collective": arriving["name"].astype(str),
                             "arrival_ns": arriving["start_ns"].astype("int64")}).dropna(subset=["window"])
    return _Timeline(rank, measured_on, windows.reset_index(drop=True), compute, comm, working, busy,
                     arrivals.sort_values("arrival_ns", kind="stable"))


def _timelines(run: Run) -> list[_Timeline]:
    d = run.engine.dialect
    all_steps = cpu_steps(run)
    numbers = all_steps["name"].str.extract(_STEP_NUMBER, expand=False)
    all_steps = all_steps.assign(step=all_steps["name"], step_number=pd.to_numeric(numbers).astype("Int64"),
                                 step_ns=all_steps["end_ns"] - all_steps["start_ns"])
    communicates = f"(kind = '{Kind.COMM}' OR (kind = '{Kind.KERNEL}' AND {d.matches('name', _COLLECTIVE_KERNEL_SQL)}))"
    device_work = has_device_activity(run)
    gpus = gpu_breakdown(run) if device_work else pd.DataFrame(columns=["rank"])
    ranks = run.ranks()
    on_gpu = sorted({int(r) for r in gpus["rank"]})
    on_cpu = [r for r in ranks if r not in on_gpu]

    def measured(where: str, of_ranks: list[int]) -> pd.DataFrame:
        """Only what this analysis measures, narrow: names only where a collective is named."""
        if not of_ranks:
            return pd.DataFrame(columns=["rank", "id", "pid", "tid", "kind", "start_ns", "dur_ns", "is_comm", "name"])
        frame = run.sql(
            f"SELECT rank, id, pid, tid, kind, start_ns, dur_ns, {communicates} AS is_comm, "
            f"CASE WHEN {communicates} THEN name END AS name FROM slices "
            f"WHERE ({where}) AND rank IN ({', '.join(str(r) for r in of_ranks)})"
        )
        return frame.astype({"start_ns": "int64", "dur_ns": "int64", "is_comm": "bool"})

    cpu_slices = measured(f"device = '{CPU}' AND (kind = '{Kind.OP}' OR {communicates})", on_cpu)
    gpu_slices = measured(f"kind IN {DEVICE_KINDS_SQL} OR (kind = '{Kind.COMM}' AND device <> '{CPU}')", on_gpu)
    extents = {int(r): (int(lo), int(hi)) for r, lo, hi in run.query(
        f"SELECT rank, min(start_ns), max(start_ns + dur_ns) FROM slices WHERE device = '{CPU}' GROUP BY rank")}
    owners = pd.Series(dtype="Int64")
    if device_work:
        collective = f"w.kind = '{Kind.KERNEL}' AND {d.matches('w.name', _COLLECTIVE_KERNEL_SQL)}"
        found = run.sql(f"SELECT id, step_index FROM ({work_sql(d, where=collective)}) AS w")
        owners = pd.Series(found["step_index"].to_numpy(), index=found["id"].to_numpy())
    timelines = []
    for rank in ranks:
        steps = all_steps.loc[all_steps["rank"] == rank, ["step", "step_number", "start_ns", "step_ns"]]
        steps = steps.reset_index(drop=True)
        if rank in on_gpu:
            mine = gpu_slices if len(on_gpu) == 1 else gpu_slices[gpu_slices["rank"] == rank]
            timelines.append(_gpu_timeline(rank, mine, steps, gpus[gpus["rank"] == rank], owners))
        else:
            mine = cpu_slices[cpu_slices["rank"] == rank]
            timelines.append(_cpu_timeline(rank, mine, extents.get(rank), steps))
    return timelines


def _shares(frame: pd.DataFrame) -> pd.DataFrame:
    """The percentages of a frame of times: of the span, and overlap of the communication."""
    span = frame["span_ns"].where(frame["span_ns"] > 0)
    comm = frame["comm_ns"].where(frame["comm_ns"] > 0)
    return frame.assign(
        compute_pct=(100.0 * frame["compute_ns"] / span).fillna(0.0),
        comm_pct=(100.0 * frame["comm_ns"] / span).fillna(0.0),
        idle_pct=(100.0 * frame["idle_ns"] / span).fillna(0.0),
        # Missing without communication: nothing to overlap.
        overlap_pct=(100.0 * frame["overlap_ns"] / comm).astype("float64"),
    )


def _step_rows(timeline: _Timeline) -> pd.DataFrame:
    windows = timeline.windows
    low, high = windows["low"].to_numpy(), windows["high"].to_numpy()
    compute, comm = timeline.compute.within(low, high), timeline.comm.within(low, high)
    working, busy = timeline.working.within(low, high), timeline.busy.within(low, high)
    counts = timeline.arrivals.groupby("window").size()
    rows = pd.DataFrame({
        "rank": timeline.rank, "step": windows["step"], "step_number": windows["step_number"],
        "measured_on": timeline.measured_on, "start_ns": windows["start_ns"], "step_ns": windows["step_ns"],
        "window_start_ns": low, "span_ns": high - low, "compute_ns": compute, "comm_ns": comm,
        "overlap_ns": compute + comm - working, "memory_ns": busy - working, "idle_ns": high - low - busy,
        "collectives": [int(counts.get(i, 0)) for i in range(len(windows))],
    })
    return _shares(rows)


def _arrivals(timelines: list[_Timeline]) -> pd.DataFrame:
    frames = []
    for timeline in timelines:
        arrivals = timeline.arrivals
        windows = timeline.windows.iloc[arrivals["window"].astype("int64")]
        frames.append(pd.DataFrame({
            "step": windows["step"].to_numpy(), "step_number": windows["step_number"].to_numpy(),
            "collective": arrivals["collective"].to_numpy(),
            "occurrence": arrivals.groupby(["window", "collective"]).cumcount().to_numpy() + 1,
            "rank": timeline.rank, "arrival_ns": arrivals["arrival_ns"].to_numpy(),
        }))
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=ARRIVAL_COLUMNS[:-1])
    table = table.assign(step_number=table["step_number"].astype("Int64"),
                         arrival_ns=table["arrival_ns"].astype("int64"),
                         occurrence=table["occurrence"].astype("int64"))
    table["lag_ns"] = lag_behind_latest_other(table["arrival_ns"], [match_key(table), table["collective"],
                                                                    table["occurrence"]])
    return table.sort_values(["step_number", "step", "arrival_ns"], kind="stable").reset_index(drop=True)[
        ARRIVAL_COLUMNS]


def collective_arrivals(run: Run) -> pd.DataFrame:
    """Each rank's arrival at each collective of each step, against the other ranks'.

    Args:
        run: the run.

    Returns:
        :data:`ARRIVAL_COLUMNS`, one row per (step, collective, occurrence, rank) by step and time;
        ``occurrence`` counts from 1 within the rank's step; ``lag_ns`` is the arrival minus the
        latest arrival of the other ranks holding the same step, collective and occurrence:
        positive only for the last to arrive, by how long the others waited for it alone.
    """
    return _arrivals(_timelines(run))


def rank_steps(run: Run, threshold_pct: float = DEFAULT_THRESHOLD_PCT) -> pd.DataFrame:
    """Each rank's time per step (compute, communication, their overlap, memory, idle) and how
    far it lags the other ranks in that step.

    Args:
        run: the run.
        threshold_pct: a rank whose arrival lag (in a step without collectives, step lag) is
            positive and exceeds this percentage of the step's median time over ranks is a
            straggler in that step.

    Returns:
        :data:`STEP_COLUMNS`, one row per (rank, step) in time order, or one row :data:`ALL` for
        a rank without steps. ``measured_on`` is ``cpu`` or the rank's GPUs; ``step_ns`` is the
        CPU step's duration, ``span_ns`` the window measured; ``collectives`` counts the step's
        arrivals (see :func:`collective_arrivals`); ``overlap_pct`` is missing where the step
        communicates nothing. ``step_lag_ns`` is the step time minus the median of the other
        ranks' (0 for a step one rank has); ``arrival_lag_ns`` is the time the others waited for
        it alone in the step less the time it waited for them (overlapping waits counted once;
        :mod:`dlprof.analysis.rank_lags`) and ``late_collective``,
        ``late_occurrence`` name the one with its largest lag; the three are missing where the
        step has none. Lag percentages are of ``median_step_ns``, the median over all ranks.
    """
    timelines = _timelines(run)
    frames = [_step_rows(t) for t in timelines]
    if not frames:
        return pd.DataFrame(columns=STEP_COLUMNS)
    return lag_table(pd.concat(frames, ignore_index=True), _arrivals(timelines), threshold_pct)[STEP_COLUMNS]


def stragglers(run: Run, threshold_pct: float = DEFAULT_THRESHOLD_PCT) -> pd.DataFrame:
    """The steps in which a rank lagged the others by more than ``threshold_pct``.

    Args:
        run: the run.
        threshold_pct: as for :func:`rank_steps`.

    Returns:
        The :func:`rank_steps` rows whose ``straggler`` is true, by step (matched across ranks)
        and rank.
    """
    return stragglers_among(rank_steps(run, threshold_pct))


def stragglers_among(steps: pd.DataFrame) -> pd.DataFrame:
    """:func:`stragglers` from :func:`rank_steps`' table, for a caller that has it already."""
    late = steps.loc[steps["straggler"].astype(bool)]
    order = late["step_number"].astype("float64").fillna(-1.0)
    return late.assign(order=order).sort_values(["order", "step", "rank"], kind="stable").drop(
        columns="order").reset_index(drop=True)


def rank_summary(run: Run, threshold_pct: float = DEFAULT_THRESHOLD_PCT) -> pd.DataFrame:
    """One row per rank: its step times, its time split over its steps, and how often it lagged.

    Args:
        run: the run.
        threshold_pct: as for :func:`rank_steps`.

    Returns:
        :data:`SUMMARY_COLUMNS`: the times add up the rank's :func:`rank_steps` rows (its steps,
        or its whole span without steps), the percentages are recomputed from the sums;
        ``straggler_steps`` counts the steps it was a straggler in, ``max_lag_pct`` is its largest
        step or arrival lag in percent of a step's median time.
    """
    return summary_of(rank_steps(run, threshold_pct))


def summary_of(steps: pd.DataFrame) -> pd.DataFrame:
    """:func:`rank_summary` from :func:`rank_steps`' table, for a caller that has it already."""
    grouped = steps.groupby("rank", sort=True)
    table = grouped[[*_TIME_COLUMNS, "collectives"]].sum().reset_index()
    table["measured_on"] = grouped["measured_on"].first().to_numpy()
    real = steps[steps["step"] != ALL].groupby("rank")["step_ns"]
    table["steps"] = table["rank"].map(real.size()).fillna(0).astype("int64")
    table["step_median_ns"] = table["rank"].map(real.median()).astype("float64")
    table["step_max_ns"] = table["rank"].map(real.max()).astype("Int64")
    table["straggler_steps"] = grouped["straggler"].sum().to_numpy().astype("int64")
    lags = steps[["step_lag_pct", "arrival_lag_pct"]].max(axis=1)
    table["max_lag_pct"] = lags.groupby(steps["rank"]).max().to_numpy().astype("float64")
    return _shares(table)[SUMMARY_COLUMNS]
