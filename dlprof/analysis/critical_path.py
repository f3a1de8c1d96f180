"""A step's time on another GPU along its critical path: the host's launches stay where they
were, each stream's work is replayed with its new times, and the step moves by what the GPU's
new finish pushes past the host (or by the host's waits it frees, no more).

    steps = step_paths(run, items)      # items: estimate's, with target_ns
    steps[["step", "source_ns", "target_ns", "busy_pct", "target_busy_pct", "bound", "target_bound"]]

On the source each piece of device work started when its stream was free and its launch had
come. On the target it starts at the later of its ready time and the end of the work before it
on its stream (:func:`replay`): its ready time is its source start where it waited on the host
(the stream was idle), its launch where it waited in the queue. A host-bound step (the GPU idle
most of it) absorbs slower kernels into its idle gaps and cannot gain from faster ones beyond
the time its host spent waiting for the GPU (synchronisations, blocking copies); a GPU-bound
step follows the GPU's work. Streams are replayed each on its own: dependencies between them
(events) are not seen.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dlprof.analysis.gpu import device_work
from dlprof.analysis.sql import ON_CPU, rank_condition, step_at_sql
from dlprof.keys import Kind
from dlprof.store.reader import Run

# Runtime calls in which the host waits for the GPU: what a faster GPU can give back.
WAIT_CALLS = r"(?i)synchronize|^cudaMemcpy$|^cudaMemcpy2D$|^hipMemcpy$"
HOST_BOUND_BUSY = 80.0  # % of the step the GPU is busy: below it, the GPU waits on the host much of the step
STEP_PATH_COLUMNS = ["rank", "step", "source_ns", "target_ns", "busy_pct", "target_busy_pct", "wait_ns",
                     "bound", "target_bound"]


def replay(ready: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Each piece's end on one stream when it starts at the later of its ready time and the end
    of the piece before it (a pure function; pieces in their source order).

    Args:
        ready: when each piece could start.
        target: each piece's duration.

    Returns:
        Each piece's end.
    """
    ends = np.empty(len(ready), dtype=np.float64)
    free = -np.inf
    for index in range(len(ready)):
        free = max(float(ready[index]), free) + float(target[index])
        ends[index] = free
    return ends


def ready_times(start: np.ndarray, previous_end: np.ndarray, launch: np.ndarray) -> np.ndarray:
    """When each piece could have started: its start where its stream idled before it (it waited
    for the host), else its launch (it waited behind earlier work); its start where no launch is
    linked."""
    queued = (start <= previous_end) & ~np.isnan(launch)
    return np.where(queued, np.fmin(launch, start), start)


def step_paths(run: Run, items: pd.DataFrame, rank: int | None = None) -> pd.DataFrame:
    """Each step's measured and predicted time along its critical path.

    Args:
        run: the run.
        items: the device work with ``rank``, ``id``, ``time_ns`` and ``target_ns`` (missing
            where the work is left as it was: collectives).
        rank: only this rank.

    Returns:
        :data:`STEP_PATH_COLUMNS`: the step's time, its GPUs' busy share before and after, the
        host's waits for the GPU, and which bounds it (``host`` where its GPUs are busy less
        than :data:`HOST_BOUND_BUSY` % of it, else ``GPU``), on the source and the target.
    """
    steps = run.sql(f"SELECT rank, name AS step, start_ns, dur_ns FROM slices WHERE kind = '{Kind.STEP}'"
                    f"{rank_condition(rank)} ORDER BY rank, start_ns")
    if steps.empty:
        return pd.DataFrame(columns=STEP_PATH_COLUMNS)
    work = device_work(run, rank).merge(items[["rank", "id", "time_ns", "target_ns"]], on=["rank", "id"], how="left")
    work = work.assign(target_ns=work["target_ns"].fillna(work["end_ns"] - work["start_ns"]))
    waits = _host_waits(run, rank)
    rows = []
    for step in steps.itertuples(index=False):
        own = work[(work["rank"] == step.rank) & (work["step"] == step.step)]
        shift, busy, target_busy = _shift(own)
        wait = waits.get((int(step.rank), str(step.step)), 0.0)
        target = float(step.dur_ns) + max(shift, -wait)
        busy_pct = 100.0 * busy / step.dur_ns if step.dur_ns else 0.0
        target_pct = 100.0 * target_busy / target if target > 0 else 0.0
        rows.append({"rank": int(step.rank), "step": str(step.step), "source_ns": int(step.dur_ns),
                     "target_ns": round(target), "busy_pct": busy_pct, "target_busy_pct": target_pct,
                     "wait_ns": wait, "bound": _bound(busy_pct), "target_bound": _bound(target_pct)})
    return pd.DataFrame(rows, columns=STEP_PATH_COLUMNS)


def _bound(busy_pct: float) -> str:
    return "host" if busy_pct < HOST_BOUND_BUSY else "GPU"


def _shift(work: pd.DataFrame) -> tuple[float, float, float]:
    """How much later (or earlier) a step's GPU work ends on the target, and its busy time on
    the source and the target (summed over its devices' streams)."""
    if work.empty:
        return 0.0, 0.0, 0.0
    old_end = new_end = -np.inf
    busy = target_busy = 0.0
    for _, stream in work.sort_values(["device", "stream", "start_ns", "id"]).groupby(["device", "stream"], sort=False):
        start = stream["start_ns"].to_numpy(dtype=np.float64)
        end = stream["end_ns"].to_numpy(dtype=np.float64)
        previous_end = np.concatenate(([-np.inf], np.maximum.accumulate(end)[:-1]))
        launch = stream["launch_ns"].to_numpy(dtype=np.float64)
        durations = stream["target_ns"].to_numpy(dtype=np.float64)
        ends = replay(ready_times(start, previous_end, launch), durations)
        old_end, new_end = max(old_end, float(end.max())), max(new_end, float(ends.max()))
        busy += float((end - start).sum())
        target_busy += float(durations.sum())
    return new_end - old_end, busy, target_busy


def _host_waits(run: Run, rank: int | None) -> dict[tuple[int, str], float]:
    """The time each step's host threads spent in calls that wait for the GPU."""
    pattern = run.engine.dialect.matches("name", WAIT_CALLS)
    calls = (f"SELECT rank, id, start_ns AS t FROM slices WHERE kind = '{Kind.RUNTIME}' AND {ON_CPU} "
             f"AND {pattern}{rank_condition(rank)}")
    rows = run.query(
        f"SELECT p.rank, p.step, CAST(sum(s.dur_ns) AS BIGINT) FROM ({step_at_sql(run.engine.dialect, calls, rank)}) AS p "
        "JOIN slices s ON s.rank = p.rank AND s.id = p.id WHERE p.step IS NOT NULL GROUP BY p.rank, p.step").rows
    return {(int(r), str(step)): float(ns or 0) for r, step, ns in rows}
