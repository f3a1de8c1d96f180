"""Training steps: each step's time and where it went, and statistics over the steps that count.

    report = step_report(run)
    report.statistics   # per rank: steps counted, mean, median, p90, p99, std, min, max
    report.breakdown    # per rank and part: mean time per step and share of step time
    report.steps        # per step: status, duration, data wait, forward, backward, ...
    report.device_steps       # per step and GPU: busy time per part, idle time
    report.device_breakdown   # per rank, GPU and part (and idle): mean time and share

Which steps count (a step is a ``ProfilerStep#N`` slice on a CPU thread):

- **partial**: the step open when profiling stopped. A step ends at a step call; the one under
  way at the stop holds whatever ran after the loop (an evaluation, the teardown) and is no
  training step. dlprof's session records its name in the run's manifest (``partial_step``, per
  rank); a run imported from other tools' traces has no such record and its last step counts.
- **warm-up**: the program's first step (``ProfilerStep#0``, or the first step of a run whose
  steps are not numbered), which pays for lazy initialisation, allocator growth and compilation.
  A profiling schedule's own warm-up steps are never recorded, so under a schedule the first
  recorded step is a later one and counts.
- **counted**: every other step. Statistics are over counted steps only; the others are listed
  with their status.

Where a step's time went (the breakdown, as TensorBoard's PyTorch overview gave it, see
:mod:`dlprof.analysis.step_parts`): every instant of the step's span goes to one part, data wait,
forward, backward, optimizer, communication, compile (torch.compile compiling), profiler
(dlprof's own pauses) or other, by what
every CPU thread of the step's process was doing then (the main thread, autograd's, the
DataLoader's pin-memory thread), so the parts sum to the step's duration exactly. On a run with
GPU work a second breakdown does the same per GPU in its own time: each part's busy time (the
work launched from inside that part), the GPU's idle time while dlprof held the program (in the
profiler part) and its own idle time, adding up to the step's span.

The statistics are of the user's step time: each step's duration less its profiler part, the
time dlprof itself held the program's threads (a save, a profiler cycle's restart). Runs recorded
before dlprof timed its pauses have none. Work a framework runs on threads of its own that the
profiler did not record (TensorFlow's executor, untraced threads) shows as other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import pandas as pd

from dlprof.analysis.aggregate import has_device_activity
from dlprof.analysis.sql import rank_condition
from dlprof.analysis.step_parts import IDLE, StepPart, device_parts_sql, host_parts_sql
from dlprof.engine.dialect import Dialect
from dlprof.keys import Kind
from dlprof.store.reader import Run

__all__ = ["IDLE", "StepPart", "StepReport", "StepStatus", "excluded_steps", "flagged_steps_sql", "partial_steps",
           "step_report", "uncounted_steps"]

STEP_PREFIX = "ProfilerStep#"
FIRST_STEP = f"{STEP_PREFIX}0"


class StepStatus(StrEnum):
    """Whether a step counts in the statistics, and if not, why."""

    COUNTED = "counted"
    WARMUP = "warm-up"  # the program's first step
    PARTIAL = "partial"  # open when profiling stopped: ended by the stop, not by a step call


STEP_COLUMNS = ["rank", "step", "status", "start_ns", "dur_ns", *(f"{p}_ns" for p in StepPart)]
STATISTICS_COLUMNS = ["rank", "steps", "warmup", "partial", "mean_ns", "median_ns", "p90_ns", "p99_ns",
                      "std_ns", "min_ns", "max_ns"]
BREAKDOWN_COLUMNS = ["rank", "part", "mean_ns", "step_pct"]
# A GPU's time in a step: the work launched in each part (other: outside every part; profiler: also
# the GPU's idle time while dlprof held the program), then its own idle time.
DEVICE_STEP_COLUMNS = ["rank", "device", "step", "status", "start_ns", "dur_ns", *(f"{p}_ns" for p in StepPart),
                       f"{IDLE}_ns"]
DEVICE_BREAKDOWN_COLUMNS = ["rank", "device", "part", "mean_ns", "step_pct"]


@dataclass(frozen=True)
class StepReport:
    """The steps of a run (or of one rank) and what is said about them."""

    steps: pd.DataFrame  # STEP_COLUMNS, one row per step, in order of start per rank
    statistics: pd.DataFrame  # STATISTICS_COLUMNS, one row per rank with steps (user time: no profiler part)
    breakdown: pd.DataFrame  # BREAKDOWN_COLUMNS, one row per rank and part, over counted steps
    # DEVICE_STEP_COLUMNS, one row per step and GPU of its rank (none on a run without GPU work)
    device_steps: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=DEVICE_STEP_COLUMNS))
    # DEVICE_BREAKDOWN_COLUMNS, one row per rank, GPU and part (idle last), over counted steps
    device_breakdown: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=DEVICE_BREAKDOWN_COLUMNS))


def partial_steps(run: Run) -> dict[int, str]:
    """The step each rank had open when profiling stopped, as the run's manifests record it.

    Args:
        run: the run.

    Returns:
        Rank to step name; ranks with no such step (or no record of one) are left out.
    """
    manifests = run.rank_manifests or {rank: run.manifest for rank in run.manifest.ranks}
    return {rank: m.partial_step for rank, m in manifests.items() if m.partial_step}


def flagged_steps_sql(run: Run, rank: int | None = None, within: str | None = None) -> str:
    """Each CPU step with its place among its rank's steps and its :class:`StepStatus`: columns
    ``rank``, ``pid``, ``tid``, ``step``, ``step_index``, ``start_ns``, ``end_ns``, ``dur_ns``,
    ``status``. With ``within``, only the steps whose middle lies inside a slice of that name on
    their rank (a region such as train or eval); their places and statuses are as among all."""
    d = run.engine.dialect
    partial = partial_steps(run)
    partial_name = ("CASE rank " + " ".join(f"WHEN {r} THEN {d.literal(n)}" for r, n in sorted(partial.items()))
                    + " END") if partial else "CAST(NULL AS STRING)"
    ordered = (
        "SELECT rank, pid, tid, name AS step, start_ns, start_ns + dur_ns AS end_ns, dur_ns, "
        "CAST(row_number() OVER (PARTITION BY rank ORDER BY start_ns, pid, tid, dur_ns DESC, id) - 1 AS BIGINT) "
        "AS step_index, count(*) OVER (PARTITION BY rank) AS rank_steps "
        f"FROM slices WHERE kind = '{Kind.STEP}' AND device = 'cpu'{rank_condition(rank)}"
    )
    flagged = (
        "SELECT rank, pid, tid, step, step_index, start_ns, end_ns, dur_ns, CASE "
        f"WHEN step_index = rank_steps - 1 AND step = {partial_name} THEN '{StepStatus.PARTIAL}' "
        f"WHEN step_index = 0 AND (step = '{FIRST_STEP}' OR step NOT LIKE '{STEP_PREFIX}%') "
        f"THEN '{StepStatus.WARMUP}' ELSE '{StepStatus.COUNTED}' END AS status FROM ({ordered}) AS ordered"
    )
    if within is None:
        return flagged
    middle = "(f.start_ns + f.end_ns) / 2.0"
    return (
        f"SELECT * FROM ({flagged}) AS f WHERE EXISTS (SELECT 1 FROM slices w WHERE w.rank = f.rank "
        f"AND w.name = {d.literal(within)} AND w.start_ns <= {middle} AND {middle} < w.start_ns + w.dur_ns)"
    )


def _steps_with_parts_sql(run: Run, steps: str, rank: int | None) -> str:
    parts = [p for p in StepPart if p is not StepPart.OTHER]
    known = " + ".join(f"coalesce(p.{p}_ns, 0)" for p in parts)
    return (
        "SELECT s.rank, s.step, s.status, s.step_index, s.start_ns, s.dur_ns, "
        + ", ".join(f"coalesce(p.{p}_ns, 0) AS {p}_ns" for p in parts)
        + f", s.dur_ns - ({known}) AS {StepPart.OTHER}_ns "
        f"FROM {steps} AS s LEFT JOIN ({host_parts_sql(run.engine.dialect, steps, rank)}) AS p "
        "ON p.rank = s.rank AND p.step_index = s.step_index"
    )


def _device_steps_sql(run: Run, steps: str, rank: int | None) -> str:
    parts = ", ".join(f"p.{p}_ns" for p in StepPart)
    return (
        f"SELECT p.rank, p.device, s.step, s.status, s.step_index, s.start_ns, s.dur_ns, {parts}, "
        f"s.dur_ns - p.parts_ns AS {IDLE}_ns FROM ({device_parts_sql(run.engine.dialect, steps, rank)}) AS p "
        "JOIN " + steps + " AS s ON s.rank = p.rank AND s.step_index = p.step_index"
    )


def _statistics_sql(d: Dialect, table: str) -> str:
    counted = f"CASE WHEN status = '{StepStatus.COUNTED}' THEN dur_ns - {StepPart.PROFILER}_ns END"
    return (
        f"SELECT rank, count({counted}) AS steps, "
        f"count(CASE WHEN status = '{StepStatus.WARMUP}' THEN 1 END) AS warmup, "
        f"count(CASE WHEN status = '{StepStatus.PARTIAL}' THEN 1 END) AS partial, "
        f"avg({counted}) AS mean_ns, {d.quantile(counted, 0.5)} AS median_ns, "
        f"{d.quantile(counted, 0.9)} AS p90_ns, {d.quantile(counted, 0.99)} AS p99_ns, "
        f"stddev_samp({counted}) AS std_ns, min({counted}) AS min_ns, max({counted}) AS max_ns "
        f"FROM {table} GROUP BY rank ORDER BY rank"
    )


def _breakdown_sql(table: str, parts: list[str], keys: str = "rank") -> str:
    rows = [
        f"SELECT {keys}, '{p}' AS part, {i} AS part_order, avg({p}_ns) AS mean_ns, "
        f"100.0 * sum({p}_ns) / sum(dur_ns) AS step_pct FROM {table} "
        f"WHERE status = '{StepStatus.COUNTED}' GROUP BY {keys}"
        for i, p in enumerate(parts)
    ]
    return (f"SELECT {keys}, part, mean_ns, step_pct FROM ({' UNION ALL '.join(rows)}) AS b "
            f"ORDER BY {keys}, part_order")


def step_report(run: Run, rank: int | None = None, within: str | None = None) -> StepReport:
    """A run's steps, their statistics and their breakdown (see the module's docstring).

    Args:
        run: the run.
        rank: only this rank's steps.
        within: only the steps inside a slice of this name (see :func:`flagged_steps_sql`).

    Returns:
        The tables; all empty when the run has no steps, the GPU's when it has no GPU work.
    """
    flagged = f"SELECT * FROM ({flagged_steps_sql(run, rank, within)}) AS f"
    with run.kept("dlprof_flagged_steps", flagged) as steps, \
            run.kept("dlprof_steps", _steps_with_parts_sql(run, steps, rank)) as table:
        frame = run.sql(f"SELECT {', '.join(STEP_COLUMNS)} FROM {table} ORDER BY rank, step_index")
        statistics = run.sql(_statistics_sql(run.engine.dialect, table))
        breakdown = run.sql(_breakdown_sql(table, [str(p) for p in StepPart]))
        device_steps, device_breakdown = _device_tables(run, steps, rank)
    integers = {c: "int64" for c in STEP_COLUMNS if c.endswith("_ns") or c == "rank"}
    frame = frame.astype(integers)
    statistics = statistics.astype({"rank": "int64", "steps": "int64", "warmup": "int64", "partial": "int64"})
    for column in STATISTICS_COLUMNS[4:]:
        statistics[column] = statistics[column].astype("float64")
    breakdown = breakdown.astype({"rank": "int64", "mean_ns": "float64", "step_pct": "float64"})
    return StepReport(steps=frame, statistics=statistics, breakdown=breakdown, device_steps=device_steps,
                      device_breakdown=device_breakdown)


def _device_tables(run: Run, steps: str, rank: int | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The GPU breakdown per step and over the counted steps; empty without GPU work."""
    if not has_device_activity(run):
        return pd.DataFrame(columns=DEVICE_STEP_COLUMNS), pd.DataFrame(columns=DEVICE_BREAKDOWN_COLUMNS)
    with run.kept("dlprof_device_steps", _device_steps_sql(run, steps, rank)) as table:
        per_step = run.sql(f"SELECT {', '.join(DEVICE_STEP_COLUMNS)} FROM {table} ORDER BY rank, device, step_index")
        parts = [*(str(p) for p in StepPart), IDLE]
        breakdown = run.sql(_breakdown_sql(table, parts, "rank, device"))
    per_step = per_step.astype({c: "int64" for c in DEVICE_STEP_COLUMNS if c.endswith("_ns") or c == "rank"})
    breakdown = breakdown.astype({"rank": "int64", "mean_ns": "float64", "step_pct": "float64"})
    return per_step, breakdown


def excluded_steps(report: StepReport) -> pd.DataFrame:
    """The steps left out of the statistics, with their status (why)."""
    left_out = report.steps[report.steps["status"] != StepStatus.COUNTED]
    return left_out[["rank", "step", "status", "dur_ns"]].reset_index(drop=True)


def uncounted_steps(run: Run, rank: int | None = None) -> dict[str, StepStatus]:
    """The steps the statistics leave out, by name, with why (one rank's word wins over a
    name's others: ``partial`` over ``warm-up``).

    Args:
        run: the run.
        rank: only this rank's steps.

    Returns:
        Step name to its status, for steps that are not :attr:`StepStatus.COUNTED`.
    """
    rows = run.query(f"SELECT DISTINCT step, status FROM ({flagged_steps_sql(run, rank)}) AS f "
                     f"WHERE status <> '{StepStatus.COUNTED}'").rows
    found: dict[str, StepStatus] = {}
    for name, status in sorted(rows, key=lambda row: row[1] != StepStatus.PARTIAL):
        found.setdefault(str(name), StepStatus(status))
    return found
