"""Where each GPU's time goes, step by step: busy against idle, which kind of work kept it busy,
and how long kernels waited between their launch and their start, launch cost told from queueing.

    run = dlprof.load("dlprof-runs/20261122-101500-train")
    table = gpu_breakdown(run)
    table[["device", "step", "busy_pct", "kernel_pct", "launch_p95_ns", "queue_p95_ns"]]

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
  kernels linked to one. It is two waits, one after the other, which add up to it per kernel:
  *queueing*, the part of it during which earlier work on the kernel's stream was still running
  (from the call's start until that work ended, at most the whole delay), and *launch cost*, the
  rest: from the later of the call's start and its stream's being free to the kernel's start.
  A long launch cost is the host's (or the driver's) doing; a long queue is a GPU busy with
  earlier work, no cost at all when it is busy. Memcpy and memset are work on their streams too
  (what a kernel queues behind), but the statistics are of kernels.

Everything proportional to the device work is a query on the engine: each slice's step (a
window over the rank's steps and work in time order), the union of each GPU's intervals (merged
into blocks by a running maximum), the blocks' overlap with each window, and the counts and delay
percentiles. Only per-step rows come back; the windows are drawn from per-step figures in Python.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from dlprof.analysis.sql import DEVICE_KINDS_SQL, launch_calls, rank_condition, step_at_sql, steps_sql
from dlprof.engine.dialect import Dialect
from dlprof.keys import Kind
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
    "queued",
    "launch_mean_ns",
    "launch_p50_ns",
    "launch_p95_ns",
    "launch_max_ns",
    "queue_mean_ns",
    "queue_p50_ns",
    "queue_p95_ns",
    "queue_max_ns",
]
# The statistics of each wait, per row of the breakdown: (column prefix, per-work column).
_WAITS = (("delay", "start_ns - launch_ns"), ("launch", "launch_cost_ns"), ("queue", "queue_ns"))
_STATISTICS = ("mean", "p50", "p95", "max")
_WAIT_COLUMNS = [f"{prefix}_{statistic}_ns" for prefix, _ in _WAITS for statistic in _STATISTICS]

# The columns of device_work, in order.
WORK_COLUMNS = [
    "id", "rank", "device", "kind", "stream", "start_ns", "end_ns", "launch_ns", "queue_ns", "launch_cost_ns",
    "step", "step_index",
]
_BEFORE = "ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING"
_UPTO = "ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW"


def work_sql(dialect: Dialect, rank: int | None = None, where: str = "") -> str:
    """Every kernel, memcpy and memset with its launch, its waits and its step, as a query of
    :data:`WORK_COLUMNS` (see :func:`device_work`); ``where``: only the work (``w``) that meets
    this condition as well, placed in its step without sorting the rest."""
    # When the work before each piece on its stream had ended (none before: NULL). Over all the
    # stream's work, before ``where`` picks some of it.
    stream = "PARTITION BY rank, pid, device, coalesce(stream, tid) ORDER BY start_ns, dur_ns, id"
    on_streams = (
        f"SELECT *, max(start_ns + dur_ns) OVER ({stream} {_BEFORE}) AS stream_free_ns FROM slices "
        f"WHERE kind IN {DEVICE_KINDS_SQL}{rank_condition(rank)}"
    )
    delay = "w.start_ns - c.start_ns"
    # Waiting behind earlier work: from the call's start until the stream was free, at most the
    # whole delay (a stream that was free before the call, or a kernel that starts before its
    # call by the clocks' error, waits for nothing).
    # (Both engines' least and greatest pass over NULLs: unlinked work gets none by CASE.)
    queue = (f"CASE WHEN c.start_ns IS NOT NULL THEN least(greatest(coalesce(w.stream_free_ns, c.start_ns) "
             f"- c.start_ns, 0), greatest({delay}, 0)) END")
    work = (
        f"SELECT w.id, w.rank, w.device, w.kind, w.stream, w.start_ns, w.start_ns + w.dur_ns AS end_ns, "
        f"c.start_ns AS launch_ns, {queue} AS queue_ns, {delay} - {queue} AS launch_cost_ns "
        f"FROM ({on_streams}) AS w LEFT JOIN ({launch_calls(with_parent=False)}) AS c "
        f"ON c.rank = w.rank AND c.correlation_id = w.correlation_id{f' WHERE ({where})' if where else ''}"
    )
    # A piece of work's step is the one it was launched in (or began in, when not linked).
    placed = step_at_sql(dialect, "SELECT rank, id, coalesce(launch_ns, start_ns) AS t FROM work", rank)
    return (
        f"WITH work AS ({work}) "
        "SELECT w.id, w.rank, w.device, w.kind, w.stream, w.start_ns, w.end_ns, w.launch_ns, w.queue_ns, "
        "w.launch_cost_ns, p.step, p.step_index "
        f"FROM work w JOIN ({placed}) AS p ON p.rank = w.rank AND p.id = w.id"
    )


def cpu_steps(run: Run, rank: int | None = None) -> pd.DataFrame:
    """The training steps as the CPU saw them (``ProfilerStep#N`` slices), in time order.

    Args:
        run: the run.
        rank: only this rank's steps.

    Returns:
        Columns ``rank``, ``name``, ``start_ns``, ``end_ns``; one row per step slice.
    """
    steps = run.sql(f"SELECT rank, name, start_ns, end_ns FROM ({steps_sql(rank)}) AS steps "
                    "ORDER BY rank, step_index")
    return steps.astype({"rank": "int64", "start_ns": "int64", "end_ns": "int64"})


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
    work = run.sql(f"SELECT * FROM ({work_sql(run.engine.dialect, rank)}) AS work "
                   "ORDER BY rank, device, start_ns, id")
    return work.astype({"rank": "int64", "start_ns": "int64", "end_ns": "int64"})[WORK_COLUMNS]


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


def covered_sql(dialect: Dialect, work: str, windows: str) -> str:
    """Each GPU's busy time per window, split kernels first, then memcpy, then memset.

    One sweep over each GPU's work in time order: every start and end changes a running count
    of open kernels, copies and sets, and every window's edges change a running state (entered
    window i, left it); between two consecutive instants the GPU is busy with whatever count is
    positive, so each piece of time goes to one kind and to the window it lies in.

    Args:
        dialect: the engine's dialect.
        work: a table of device work (``rank``, ``device``, ``kind``, ``start_ns``, ``end_ns``).
        windows: a query of ``rank``, ``device``, ``slot`` (numbering a GPU's windows from 0, in
            time order; they do not overlap), ``low``, ``high``.

    Returns:
        A query of ``rank``, ``device``, ``slot`` (-2 for the whole run), ``kernel_ns``,
        ``copy_ns`` (memcpy time outside kernels) and ``busy_ns``.
    """
    def delta(kind: str, sign: int) -> str:
        return f"CASE WHEN kind = '{kind}' THEN {sign} ELSE 0 END"

    kinds = (Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET)
    events = (
        f"SELECT rank, device, start_ns AS t, {', '.join(delta(k, 1) for k in kinds)}, 0 AS edge FROM {work} "
        f"UNION ALL SELECT rank, device, end_ns, {', '.join(delta(k, -1) for k in kinds)}, 0 FROM {work} "
        f"UNION ALL SELECT rank, device, low, 0, 0, 0, 2 * slot + 1 FROM ({windows}) AS w "
        f"UNION ALL SELECT rank, device, high, 0, 0, 0, 2 * slot + 2 FROM ({windows}) AS w"
    )
    order = "PARTITION BY rank, device ORDER BY t, edge"
    swept = (
        f"SELECT rank, device, sum(k) OVER ({order} {_UPTO}) AS kernels, sum(c) OVER ({order} {_UPTO}) AS copies, "
        f"sum(m) OVER ({order} {_UPTO}) AS sets, max(edge) OVER ({order} {_UPTO}) AS state, "
        f"lead(t) OVER ({order}) - t AS length "
        f"FROM (SELECT rank, device, t, k, c, m, edge FROM ({events}) AS e (rank, device, t, k, c, m, edge)) AS events"
    )
    measures = ("CAST(coalesce(sum(length) FILTER (WHERE kernels > 0), 0) AS BIGINT) AS kernel_ns, "
                "CAST(coalesce(sum(length) FILTER (WHERE kernels = 0 AND copies > 0), 0) AS BIGINT) AS copy_ns, "
                "CAST(coalesce(sum(length) FILTER (WHERE kernels + copies + sets > 0), 0) AS BIGINT) AS busy_ns")
    return (
        f"WITH swept AS ({swept}) "
        f"SELECT rank, device, {dialect.int_div('state - 1', '2')} AS slot, {measures} FROM swept "
        "WHERE length > 0 AND state % 2 = 1 GROUP BY rank, device, state "
        f"UNION ALL SELECT rank, device, -2 AS slot, {measures} FROM swept WHERE length > 0 GROUP BY rank, device"
    )


def _delay_columns(dialect: Dialect) -> str:
    def kernel(value: str) -> str:
        return f"CASE WHEN kind = '{Kind.KERNEL}' AND launch_ns IS NOT NULL THEN {value} END"

    statistics = []
    for prefix, value in _WAITS:
        wait = kernel(value)
        statistics.append(
            f"avg({wait}) AS {prefix}_mean_ns, {dialect.quantile(wait, 0.5)} AS {prefix}_p50_ns, "
            f"{dialect.quantile(wait, 0.95)} AS {prefix}_p95_ns, CAST(max({wait}) AS DOUBLE) AS {prefix}_max_ns")
    return (
        f"count(*) FILTER (WHERE kind = '{Kind.KERNEL}') AS kernels, "
        f"count(*) FILTER (WHERE kind = '{Kind.MEMCPY}') AS memcpys, "
        f"count(*) FILTER (WHERE kind = '{Kind.MEMSET}') AS memsets, "
        f"count({kernel('launch_ns')}) AS launches, count({kernel('CASE WHEN queue_ns > 0 THEN 1 END')}) AS queued, "
        + ", ".join(statistics)
    )


def _device_order(device: str) -> tuple[str, int]:
    """``cuda:2`` before ``cuda:10``."""
    family, _, index = device.partition(":")
    return family, int(index) if index.isdigit() else -1


def _windows(steps: pd.DataFrame, work_end: dict[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Each step's window on one GPU (see the module's docstring), from the end of the work that
    belongs to each step on it."""
    last = np.array([work_end.get(i, np.iinfo(np.int64).min) for i in range(len(steps))], dtype=np.int64)
    ends = np.maximum(steps["end_ns"].to_numpy(dtype=np.int64), last)
    previous = np.concatenate(([np.iinfo(np.int64).min], np.maximum.accumulate(ends)[:-1]))
    starts = np.minimum(np.maximum(steps["start_ns"].to_numpy(dtype=np.int64), previous), ends)
    return starts, ends


def gpu_breakdown(run: Run, rank: int | None = None) -> pd.DataFrame:
    """Busy and idle time, their split by kind of work, and kernels' waits (the launch delay, its
    launch cost and its queueing), per GPU and per step.

    Args:
        run: the run.
        rank: only this rank.

    Returns:
        :data:`BREAKDOWN_COLUMNS`, one row per (rank, GPU, step) in time order and a row
        :data:`ALL` per GPU after its steps; empty when there is no device activity. ``queued``
        counts the kernels that waited behind earlier work on their stream. The statistics of
        the waits are over every kernel with a linked launch (those that did not queue count
        zero queueing), so ``launch_mean_ns + queue_mean_ns == delay_mean_ns``; they are
        missing (NaN) where no such kernel belongs to the row.
    """
    d = run.engine.dialect
    # The work is read three times below: computed once.
    narrow = (f"SELECT rank, device, kind, start_ns, end_ns, launch_ns, queue_ns, launch_cost_ns, step_index "
              f"FROM ({work_sql(d, rank)}) AS work")
    with run.kept("dlprof_gpu_work", narrow) as work:
        return _breakdown(run, work, rank)


def _breakdown(run: Run, work: str, rank: int | None) -> pd.DataFrame:
    d = run.engine.dialect
    # Per GPU and step (step -1: the whole run): the work's extent and its counts.
    per_step = run.sql(
        f"SELECT rank, device, coalesce(step_index, -1) AS step_index, "
        f"min(start_ns) AS first_ns, max(end_ns) AS last_ns, {_delay_columns(d)} FROM {work} "
        "GROUP BY rank, device, coalesce(step_index, -1) "
        f"UNION ALL SELECT rank, device, -2 AS step_index, min(start_ns), max(end_ns), {_delay_columns(d)} "
        f"FROM {work} GROUP BY rank, device"
    )
    if per_step.empty:
        return pd.DataFrame(columns=BREAKDOWN_COLUMNS)
    steps = cpu_steps(run, rank)
    windows: list[tuple[int, str, int, str, int, int]] = []  # rank, device, window, step, low, high
    figures: dict[tuple[int, str, int], dict[str, Any]] = {}
    for row in per_step.to_dict("records"):
        figures[(int(row["rank"]), str(row["device"]), int(row["step_index"]))] = row
    gpus = sorted({(r, dev) for r, dev, _ in figures}, key=lambda gpu: (gpu[0], _device_order(gpu[1])))
    for gpu_rank, device in gpus:
        rank_steps = steps[steps["rank"] == gpu_rank].reset_index(drop=True)
        work_end = {i: int(f["last_ns"]) for (r, dev, i), f in figures.items()
                    if r == gpu_rank and dev == device and i >= 0}
        low, high = _windows(rank_steps, work_end)
        for index, name in enumerate(rank_steps["name"]):
            windows.append((gpu_rank, device, index, str(name), int(low[index]), int(high[index])))
        whole = figures[(gpu_rank, device, -2)]
        windows.append((gpu_rank, device, -2, ALL, int(whole["first_ns"]), int(whole["last_ns"])))
    steps_only = [w for w in windows if w[2] >= 0]
    window_rows = " UNION ALL ".join(
        f"SELECT {r} AS rank, {d.literal(dev)} AS device, {i} AS slot, {lo} AS low, {hi} AS high"
        for r, dev, i, _, lo, hi in steps_only
    ) or "SELECT 0 AS rank, '' AS device, 0 AS slot, 0 AS low, 0 AS high WHERE 1 = 0"
    covered = {(int(r), str(dev), int(i)): (int(k), int(c), int(b))
               for r, dev, i, k, c, b in run.query(covered_sql(d, work, window_rows))}
    rows = []
    for gpu_rank, device, index, name, low_ns, high_ns in windows:
        kernel, copies, busy = covered.get((gpu_rank, device, index), (0, 0, 0))
        span = high_ns - low_ns
        counts = figures.get((gpu_rank, device, index), {})
        rows.append({
            "rank": gpu_rank, "device": device, "step": name, "start_ns": low_ns, "span_ns": span,
            "busy_ns": busy, "idle_ns": span - busy, "busy_pct": 100.0 * busy / span if span else 0.0,
            "kernel_ns": kernel, "memcpy_ns": copies, "memset_ns": busy - kernel - copies,
            "kernel_pct": 100.0 * kernel / busy if busy else 0.0,
            "memcpy_pct": 100.0 * copies / busy if busy else 0.0,
            "memset_pct": 100.0 * (busy - kernel - copies) / busy if busy else 0.0,
            **{c: int(counts.get(c, 0)) for c in ("kernels", "memcpys", "memsets", "launches", "queued")},
            **{c: _number(counts.get(c)) for c in _WAIT_COLUMNS},
        })
    return pd.DataFrame(rows, columns=BREAKDOWN_COLUMNS)


def _number(value: Any) -> float:
    """A delay statistic as a float, NaN where there is none."""
    return float("nan") if value is None or pd.isna(value) else float(value)
