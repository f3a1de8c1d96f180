"""Two runs compared name by name, as ParaProf compares trials and HTA diffs traces.

    before, after = load("dlprof-runs/before"), load("dlprof-runs/after")
    per = choose_basis(before, after)
    table = diff(before, after, kinds=(Kind.OP, Kind.KERNEL), per=per)
    worse = table[regressed(table, above_pct=5.0, min_ns=50_000)]
    power = energy_diff(before, after)   # joules per counted step A -> B, or None without power

For each kind compared (ops on the CPU and kernels on the device by default), one row per name
found in either run: its calls, time, average time per call and share of the kind's total in run
A and in run B, and the change from A to B. Names match exactly (a kernel's whole C++ name), so
a renamed op shows as one name vanished and one new. Each kind opens with a total row.

Definitions, which ``dlprof diff --help`` repeats:

- A name's *time* is the sum of its slices' durations, nested work included (``aten::linear``
  holds its ``aten::addmm``), as HTA's trace diff sums them.
- A kind's *total* counts each instant once: it sums the slices of that kind that are not inside
  another slice of the same kind, so nested ops are not counted twice. A name's *share* is its
  time as a percentage of that total; with nesting, shares need not add up to 100.
- *Per step*, every count and time is divided by the run's number of steps, so a run of 3 steps
  and one of 300 compare. A step counts when work is nested in it: the empty tail a session
  records after its last ``step()`` does not.
- A row *regresses* by more than PCT when its time in B exceeds its time in A by more than PCT
  percent of A, and by at least the noise floor (``min_ns``). A new name (time 0 in A) regresses
  once its time reaches the floor; a vanished one never does.
- *Energy* per step is each run's mean joules per counted step over every device (NVML power,
  :mod:`dlprof.analysis.energy`); *cost* per step is a counted step's mean time at a price.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import pandas as pd

from dlprof.analysis.ancestry import nested_in_same
from dlprof.analysis.energy import StepPower, cost, step_energy, step_power
from dlprof.analysis.sql import rank_condition, user_time
from dlprof.analysis.steps import StepStatus, step_report
from dlprof.keys import DiffBasis, Kind
from dlprof.store.reader import Run

# Runs are compared per rank pair: (rank of A, rank of B); None takes every rank of that run.
RankPair = tuple[int | None, int | None]
ALL_RANKS: RankPair = (None, None)
DEFAULT_KINDS: tuple[str, ...] = (Kind.OP, Kind.KERNEL)


class Change(StrEnum):
    """What a row of a diff is: a kind's total, or a name found in one run or both."""

    TOTAL = "total"
    BOTH = "both"
    NEW = "new"  # only in run B
    VANISHED = "vanished"  # only in run A


# The columns of a diff table, in order. Times in nanoseconds, per step or per run as ``per``
# says; ``avg`` is per call either way.
DIFF_COLUMNS = [
    "kind",
    "name",
    "status",
    "calls_a",
    "calls_b",
    "time_a_ns",
    "time_b_ns",
    "delta_ns",
    "delta_pct",
    "avg_a_ns",
    "avg_b_ns",
    "share_a_pct",
    "share_b_pct",
    "per",
]

# The name on a kind's total row: brackets, so no op or kernel name can be taken for it.
TOTAL_NAME = "[total]"


def work_steps(run: Run, rank: int | None = None) -> int:
    """How many steps hold work: step slices with at least one slice nested in them.

    Args:
        run: the run.
        rank: only this rank's steps; None counts every rank's (a step of two ranks is two).

    Returns:
        The number of steps, 0 when the run records none.
    """
    only = rank_condition(rank)
    counted = run.query(
        f"SELECT count(*) FROM slices WHERE kind = '{Kind.STEP}'{only} AND id IN "
        f"(SELECT parent_id FROM slices WHERE parent_id IS NOT NULL{only})"
    )
    return int(counted.rows[0][0])


def choose_basis(run_a: Run, run_b: Run, ranks: RankPair = ALL_RANKS,
                 requested: DiffBasis | None = None) -> DiffBasis:
    """What to divide times by: per step when both runs have steps, else whole-run totals.

    Args:
        run_a: the baseline.
        run_b: the run compared with it.
        ranks: the rank of each run compared (None: all its ranks).
        requested: what the user asked for; None chooses.

    Returns:
        :attr:`DiffBasis.STEP` when both runs have steps and run totals were not asked for,
        else :attr:`DiffBasis.RUN`.

    Raises:
        ValueError: per step was asked for and a run has no steps.
    """
    steps = (work_steps(run_a, ranks[0]), work_steps(run_b, ranks[1]))
    if requested is DiffBasis.RUN:
        return DiffBasis.RUN
    if all(steps):
        return DiffBasis.STEP
    if requested is DiffBasis.STEP:
        empty = run_a if not steps[0] else run_b
        raise ValueError(f"{empty.path}: no steps to compare per step; compare totals with --per run")
    return DiffBasis.RUN


def diff(run_a: Run, run_b: Run, kinds: tuple[str, ...] = DEFAULT_KINDS,
         per: DiffBasis = DiffBasis.STEP, ranks: RankPair = ALL_RANKS) -> pd.DataFrame:
    """Compare two runs kind by kind and name by name.

    Args:
        run_a: the baseline.
        run_b: the run compared with it.
        kinds: the kinds of slice compared, one section each, in this order.
        per: divide counts and times by each run's number of steps, or compare whole-run totals
            (see :func:`choose_basis`).
        ranks: the rank of each run to compare (None: all its ranks, summed).

    Returns:
        :data:`DIFF_COLUMNS`. Per kind, the total row (name :data:`TOTAL_NAME`) first, then one
        row per name by absolute change, largest first. ``delta_pct`` is missing where A's time
        is 0; ``avg`` where a run has no calls; a name absent from a run has 0 calls and time.

    Raises:
        ValueError: ``per`` is step and a run has no steps.
    """
    divisors = (_steps(run_a, ranks[0]), _steps(run_b, ranks[1])) if per is DiffBasis.STEP else None
    sections = [_section(run_a, run_b, kind, ranks, divisors) for kind in kinds]
    table = pd.concat(sections, ignore_index=True) if sections else pd.DataFrame(columns=DIFF_COLUMNS)
    table["per"] = str(per)
    return table[DIFF_COLUMNS]


def regressed(table: pd.DataFrame, above_pct: float, min_ns: float = 0) -> pd.Series:
    """Which rows of a :func:`diff` table regressed by more than ``above_pct`` percent.

    Args:
        table: a diff table.
        above_pct: the allowed growth, in percent of the time in run A.
        min_ns: the noise floor: a row whose time grew by less than this never regresses.

    Returns:
        A boolean Series on the table's index: time B > time A x (1 + above_pct / 100) and
        time B - time A >= min_ns. A new name (time A of 0) regresses once it reaches ``min_ns``.
    """
    time_a = table["time_a_ns"].astype("float64")
    time_b = table["time_b_ns"].astype("float64")
    grew = time_b > time_a * (1.0 + above_pct / 100.0)
    return (grew & (time_b - time_a >= min_ns)).astype(bool)


def limit_names(table: pd.DataFrame, limit: int | None) -> pd.DataFrame:
    """A diff table cut to its total rows and the first ``limit`` names of each kind.

    Args:
        table: a diff table, each kind's total row first.
        limit: names kept per kind; None or 0 keeps every row.
    """
    if not limit:
        return table
    place_in_kind = table.groupby("kind", sort=False).cumcount()
    return table[(table["status"] == Change.TOTAL) | (place_in_kind <= limit)]


def _steps(run: Run, rank: int | None) -> int:
    steps = work_steps(run, rank)
    if not steps:
        raise ValueError(f"{run.path}: no steps to compare per step; compare totals with --per run")
    return steps


def _section(run_a: Run, run_b: Run, kind: str, ranks: RankPair,
             steps: tuple[int, int] | None) -> pd.DataFrame:
    """One kind's total row and name rows, per step when each run's steps are given."""
    side_a, total_a = _side(run_a, ranks[0], kind)
    side_b, total_b = _side(run_b, ranks[1], kind)
    names = side_a.join(side_b, how="outer", suffixes=("_a", "_b"))
    present_a, present_b = names["calls_a"].notna(), names["calls_b"].notna()
    names = names.fillna(0)
    status = np.where(present_a & present_b, Change.BOTH, np.where(present_a, Change.VANISHED, Change.NEW))
    names = names.assign(status=status).rename_axis("name").reset_index()
    total = pd.DataFrame({
        "name": [TOTAL_NAME], "status": [Change.TOTAL],
        "calls_a": [float(side_a["calls"].sum())], "calls_b": [float(side_b["calls"].sum())],
        "time_a": [total_a], "time_b": [total_b],
    })
    rows = pd.concat([total, names], ignore_index=True)
    out = pd.DataFrame({"kind": str(kind), "name": rows["name"].astype(str), "status": rows["status"].astype(str)})
    divisors = steps or (0, 0)  # 0: whole-run totals, whole counts
    for side, divisor, kind_total in (("a", divisors[0], total_a), ("b", divisors[1], total_b)):
        calls, time = rows[f"calls_{side}"], rows[f"time_{side}"]
        out[f"calls_{side}"] = calls / divisor if divisor else calls.astype("int64")
        out[f"time_{side}_ns"] = (time / (divisor or 1)).round().astype("int64")
        out[f"avg_{side}_ns"] = (time / calls).where(calls > 0).round()
        out[f"share_{side}_pct"] = 100.0 * time / kind_total if kind_total else np.nan
    # Nested slices make a per-call average of the total meaningless.
    out.loc[0, ["avg_a_ns", "avg_b_ns"]] = np.nan
    out["delta_ns"] = out["time_b_ns"] - out["time_a_ns"]
    out["delta_pct"] = (100.0 * out["delta_ns"] / out["time_a_ns"]).where(out["time_a_ns"] > 0)
    body = out.iloc[1:]
    order = body.assign(size=body["delta_ns"].abs()).sort_values(
        ["size", "name"], ascending=[False, True], kind="stable"
    ).index
    return pd.concat([out.iloc[:1], out.loc[order]], ignore_index=True)


def _side(run: Run, rank: int | None, kind: str) -> tuple[pd.DataFrame, float]:
    """One run's slices of one kind: calls and time per name (index), and the kind's total, which
    leaves out the slices inside another of the same kind."""
    d = run.engine.dialect
    where = f"kind = {d.literal(str(kind))}{rank_condition(rank)}"
    per_name = run.sql(
        f"WITH nesting AS ({nested_in_same('kind', where)}) SELECT s.name, count(*) AS calls, "
        f"sum({user_time('s')}) AS time, sum(CASE WHEN n.nested THEN 0 ELSE {user_time('s')} END) AS outermost "
        f"FROM slices s JOIN nesting n ON n.rank = s.rank AND n.id = s.id GROUP BY s.name"
    )
    total = float(per_name["outermost"].sum()) if len(per_name) else 0.0
    per_name = per_name.set_index("name")[["calls", "time"]].astype("float64")
    per_name.index = per_name.index.astype(object)
    return per_name, total


def change_pct(a: float | None, b: float | None) -> float | None:
    """B's change from A in percent; None where either is missing or A is 0."""
    return None if a is None or b is None or a == 0 else (b - a) / a * 100.0


@dataclass(frozen=True)
class EnergyDiff:
    """Each run's energy per counted step (None: that run recorded no power)."""

    a: StepPower | None
    b: StepPower | None

    def record(self) -> dict[str, object] | None:
        """As plain values for JSON; None when neither run recorded power."""
        if self.a is None and self.b is None:
            return None
        sides = {f"{key}_{letter}": getattr(side, key) if side else None
                 for letter, side in (("a", self.a), ("b", self.b)) for key in ("joules", "watts", "steps")}
        return {**sides,
                "joules_pct": change_pct(self.a.joules, self.b.joules) if self.a and self.b else None,
                "watts_pct": change_pct(self.a.watts, self.b.watts) if self.a and self.b else None}


def energy_diff(run_a: Run, run_b: Run, ranks: RankPair = ALL_RANKS) -> EnergyDiff:
    """Joules per counted step and mean watts of both runs (see the module's docstring)."""
    return EnergyDiff(*(step_power(step_energy(run, rank)) for run, rank in zip((run_a, run_b), ranks, strict=True)))


@dataclass(frozen=True)
class CostDiff:
    """What a counted step costs in each run at a price (None: the run has no counted step)."""

    price_per_hour: float
    a: float | None
    b: float | None

    def record(self) -> dict[str, object]:
        return {"price_per_hour": self.price_per_hour, "a": self.a, "b": self.b, "change_pct": change_pct(self.a, self.b)}


def cost_diff(run_a: Run, run_b: Run, price_per_hour: float, ranks: RankPair = ALL_RANKS) -> CostDiff:
    """Each run's mean counted step time at ``price_per_hour``."""
    costs: list[float | None] = []
    for run, rank in zip((run_a, run_b), ranks, strict=True):
        steps = step_report(run, rank).steps
        counted = steps.loc[steps["status"] == StepStatus.COUNTED, "dur_ns"]
        costs.append(cost(float(counted.mean()) / 1e9, price_per_hour) if len(counted) else None)
    return CostDiff(price_per_hour, *costs)
