"""Training steps: each step's time and where it went, and statistics over the steps that count.

    report = step_report(run)
    report.statistics   # per rank: steps counted, mean, median, p90, p99, std, min, max
    report.breakdown    # per rank and part: mean time per step and share of step time
    report.steps        # per step: status, duration, data wait, forward, backward, ...

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

Where a step's time went (the breakdown, as TensorBoard's PyTorch overview gave it): the slices
of the step's own thread that fall in it are classified as data wait (``data_wait`` and
``dataloader`` slices), communication (``comm``), forward and backward (the layers collector's
``... forward`` and ``... backward`` module slices; autograd's ``evaluate_function`` ops),
optimizer (torch's ``Optimizer.step#...`` and ``Optimizer.zero_grad#...`` ranges). Of nested
slices of one class only the outermost counts. Data wait and communication are carved out of
the forward, backward or optimizer slice they run inside (a DDP all-reduce launched from a
backward hook is communication, not backward). Other is the rest of the step, so the parts sum to
the step's duration exactly. Work a framework runs on threads of its own (TensorFlow's executor)
is not on the step's thread: it shows in ``dlprof top``, and here as other.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import pandas as pd

from dlprof.analysis.sql import rank_condition
from dlprof.engine.dialect import Dialect
from dlprof.keys import Kind
from dlprof.store.reader import Run

STEP_PREFIX = "ProfilerStep#"
FIRST_STEP = f"{STEP_PREFIX}0"


class StepStatus(StrEnum):
    """Whether a step counts in the statistics, and if not, why."""

    COUNTED = "counted"
    WARMUP = "warm-up"  # the program's first step
    PARTIAL = "partial"  # open when profiling stopped: ended by the stop, not by a step call


class StepPart(StrEnum):
    """What a step's time went to, in the breakdown's order."""

    DATA_WAIT = "data_wait"
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    COMMUNICATION = "communication"
    OTHER = "other"


# Parts carved out of the forward, backward or optimizer slice they run inside.
_CARVED = (StepPart.DATA_WAIT, StepPart.COMMUNICATION)
_PHASES = (StepPart.FORWARD, StepPart.BACKWARD, StepPart.OPTIMIZER)

STEP_COLUMNS = ["rank", "step", "status", "start_ns", "dur_ns", *(f"{p}_ns" for p in StepPart)]
STATISTICS_COLUMNS = ["rank", "steps", "warmup", "partial", "mean_ns", "median_ns", "p90_ns", "p99_ns",
                      "std_ns", "min_ns", "max_ns"]
BREAKDOWN_COLUMNS = ["rank", "part", "mean_ns", "step_pct"]


@dataclass(frozen=True)
class StepReport:
    """The steps of a run (or of one rank) and what is said about them."""

    steps: pd.DataFrame  # STEP_COLUMNS, one row per step, in order of start per rank
    statistics: pd.DataFrame  # STATISTICS_COLUMNS, one row per rank with steps
    breakdown: pd.DataFrame  # BREAKDOWN_COLUMNS, one row per rank and part, over counted steps


def partial_steps(run: Run) -> dict[int, str]:
    """The step each rank had open when profiling stopped, as the run's manifests record it.

    Args:
        run: the run.

    Returns:
        Rank to step name; ranks with no such step (or no record of one) are left out.
    """
    manifests = run.rank_manifests or {rank: run.manifest for rank in run.manifest.ranks}
    return {rank: m.partial_step for rank, m in manifests.items() if m.partial_step}


def _part_of(d: Dialect) -> str:
    """The breakdown part of a slice, NULL for a slice of none."""
    return (
        "CASE "
        f"WHEN kind IN {d.literals((Kind.DATA_WAIT, Kind.DATALOADER))} THEN '{StepPart.DATA_WAIT}' "
        f"WHEN kind = '{Kind.COMM}' THEN '{StepPart.COMMUNICATION}' "
        f"WHEN kind = '{Kind.MODULE}' AND name LIKE '% forward' THEN '{StepPart.FORWARD}' "
        f"WHEN kind = '{Kind.MODULE}' AND name LIKE '% backward' THEN '{StepPart.BACKWARD}' "
        f"WHEN kind = '{Kind.OP}' AND name LIKE 'autograd::engine::evaluate_function:%' THEN '{StepPart.BACKWARD}' "
        f"WHEN kind = '{Kind.USER_ANNOTATION}' AND (name LIKE 'Optimizer.step#%' "
        f"OR name LIKE 'Optimizer.zero_grad#%') THEN '{StepPart.OPTIMIZER}' "
        "END"
    )


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


def _parts_sql(d: Dialect, steps: str, rank: int | None) -> str:
    """Per step with classified slices: ``rank``, ``step_index`` and each part's time (but other)."""
    carved = d.literals(tuple(str(p) for p in _CARVED))
    classified = (
        f"SELECT * FROM (SELECT rank, pid, tid, id, depth, start_ns, start_ns + dur_ns AS end_ns, dur_ns, "
        f"{_part_of(d)} AS part FROM slices WHERE device = 'cpu'{rank_condition(rank)}) AS s WHERE part IS NOT NULL"
    )
    # In track order a slice's ancestors are the earlier slices of its thread still open at its
    # start (see ancestry.py): an outermost slice is one no earlier slice of its group covers.
    grouped = f"CASE WHEN part IN {carved} THEN 1 ELSE 0 END"
    covered = (
        f"SELECT *, {grouped} AS carved, max(end_ns) OVER (PARTITION BY rank, pid, tid, {grouped} "
        "ORDER BY start_ns, dur_ns DESC, depth, id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) "
        f"AS covered_until FROM ({classified}) AS c"
    )
    outermost = f"SELECT * FROM ({covered}) AS v WHERE covered_until IS NULL OR covered_until <= start_ns"
    # Outermost phase slices of a thread do not overlap: a carved slice is inside the last phase
    # slice started before it, if that one has not ended.
    frame = ("OVER (PARTITION BY rank, pid, tid ORDER BY start_ns, carved, dur_ns DESC, id "
             "ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)")
    marked = (
        f"SELECT *, {d.last_non_null('CASE WHEN carved = 0 THEN part END')} {frame} AS phase, "
        f"{d.last_non_null('CASE WHEN carved = 0 THEN end_ns END')} {frame} AS phase_end FROM ({outermost}) AS o"
    )
    placed = (
        "SELECT s.rank, s.step_index, m.part, "
        "CASE WHEN m.carved = 1 AND m.phase_end > m.start_ns THEN m.phase END AS within, "
        "LEAST(m.end_ns, s.end_ns) - m.start_ns AS dur_ns "
        f"FROM ({marked}) AS m JOIN ({steps}) AS s ON m.rank = s.rank AND m.pid = s.pid AND m.tid = s.tid "
        "AND m.start_ns >= s.start_ns AND m.start_ns < s.end_ns"
    )
    sums = [f"sum(CASE WHEN part = '{p}' THEN dur_ns ELSE 0 END) AS {p}_ns" for p in _CARVED]
    sums += [f"sum(CASE WHEN part = '{p}' THEN dur_ns WHEN within = '{p}' THEN -dur_ns ELSE 0 END) AS {p}_ns"
             for p in _PHASES]
    return f"SELECT rank, step_index, {', '.join(sums)} FROM ({placed}) AS p GROUP BY rank, step_index"


def _steps_with_parts_sql(run: Run, rank: int | None, within: str | None) -> str:
    parts = [p for p in StepPart if p is not StepPart.OTHER]
    steps = flagged_steps_sql(run, rank, within)
    known = " + ".join(f"coalesce(p.{p}_ns, 0)" for p in parts)
    return (
        "SELECT s.rank, s.step, s.status, s.step_index, s.start_ns, s.dur_ns, "
        + ", ".join(f"coalesce(p.{p}_ns, 0) AS {p}_ns" for p in parts)
        + f", s.dur_ns - ({known}) AS {StepPart.OTHER}_ns "
        f"FROM ({steps}) AS s LEFT JOIN ({_parts_sql(run.engine.dialect, steps, rank)}) AS p "
        "ON p.rank = s.rank AND p.step_index = s.step_index"
    )


def _statistics_sql(d: Dialect, table: str) -> str:
    counted = f"CASE WHEN status = '{StepStatus.COUNTED}' THEN dur_ns END"
    return (
        f"SELECT rank, count({counted}) AS steps, "
        f"count(CASE WHEN status = '{StepStatus.WARMUP}' THEN 1 END) AS warmup, "
        f"count(CASE WHEN status = '{StepStatus.PARTIAL}' THEN 1 END) AS partial, "
        f"avg({counted}) AS mean_ns, {d.quantile(counted, 0.5)} AS median_ns, "
        f"{d.quantile(counted, 0.9)} AS p90_ns, {d.quantile(counted, 0.99)} AS p99_ns, "
        f"stddev_samp({counted}) AS std_ns, min({counted}) AS min_ns, max({counted}) AS max_ns "
        f"FROM {table} GROUP BY rank ORDER BY rank"
    )


def _breakdown_sql(table: str) -> str:
    rows = [
        f"SELECT rank, '{p}' AS part, {i} AS part_order, avg({p}_ns) AS mean_ns, "
        f"100.0 * sum({p}_ns) / sum(dur_ns) AS step_pct FROM {table} "
        f"WHERE status = '{StepStatus.COUNTED}' GROUP BY rank"
        for i, p in enumerate(StepPart)
    ]
    return f"SELECT rank, part, mean_ns, step_pct FROM ({' UNION ALL '.join(rows)}) AS b ORDER BY rank, part_order"


def step_report(run: Run, rank: int | None = None, within: str | None = None) -> StepReport:
    """A run's steps, their statistics and their breakdown (see the module's docstring).

    Args:
        run: the run.
        rank: only this rank's steps.
        within: only the steps inside a slice of this name (see :func:`flagged_steps_sql`).

    Returns:
        The three tables; all empty when the run has no steps.
    """
    with run.kept("dlprof_steps", _steps_with_parts_sql(run, rank, within)) as table:
        steps = run.sql(f"SELECT {', '.join(STEP_COLUMNS)} FROM {table} ORDER BY rank, step_index")
        statistics = run.sql(_statistics_sql(run.engine.dialect, table))
        breakdown = run.sql(_breakdown_sql(table))
    integers = {c: "int64" for c in STEP_COLUMNS if c.endswith("_ns") or c == "rank"}
    steps = steps.astype(integers)
    statistics = statistics.astype({"rank": "int64", "steps": "int64", "warmup": "int64", "partial": "int64"})
    for column in STATISTICS_COLUMNS[4:]:
        statistics[column] = statistics[column].astype("float64")
    breakdown = breakdown.astype({"rank": "int64", "mean_ns": "float64", "step_pct": "float64"})
    return StepReport(steps=steps, statistics=statistics, breakdown=breakdown)


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
