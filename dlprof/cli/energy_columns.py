"""The energy and cost figures ``dlprof steps`` adds to its tables (dlprof/analysis/energy.py)."""

from __future__ import annotations

from dataclasses import dataclass

import click
import pandas as pd

from dlprof.analysis.energy import (
    NO_POWER,
    cost,
    energy_summary,
    joules_per_step,
    part_joules,
    step_energy,
)
from dlprof.analysis.steps import StepReport
from dlprof.cli.common import FiniteFloatRange
from dlprof.store.reader import Run

price_option = click.option(
    "--price-per-hour", type=FiniteFloatRange(min=0), default=None, metavar="PRICE",
    help="What the machine costs an hour (any currency): adds the cost of a step and of the run.")


@dataclass(frozen=True)
class StepEnergy:
    """A run's energy per step, summed up, and its cost at a price (None: no price given)."""

    steps: pd.DataFrame  # step_energy's rows
    summary: pd.DataFrame  # energy_summary's rows
    price_per_hour: float | None
    run_seconds: float

    @property
    def recorded(self) -> bool:
        return not self.steps.empty

    @property
    def run_cost(self) -> float | None:
        return None if self.price_per_hour is None else cost(self.run_seconds, self.price_per_hour)


def step_energy_of(loaded: Run, rank: int | None, price_per_hour: float | None) -> StepEnergy:
    """The run's step energy, and its wall time for the cost of the run."""
    manifest = loaded.manifest
    seconds = max(manifest.end_ns - manifest.start_ns, 0) / 1e9 if manifest.end_ns else 0.0
    energy = step_energy(loaded, rank)
    return StepEnergy(energy, energy_summary(energy), price_per_hour, seconds)


def with_step_energy(steps: pd.DataFrame, energy: StepEnergy) -> pd.DataFrame:
    """``steps`` with each step's ``joules`` (every source) and, at a price, its ``cost``."""
    if energy.recorded:
        steps = steps.merge(joules_per_step(energy.steps), on=["rank", "start_ns"], how="left")
    if energy.price_per_hour is not None:
        steps = steps.assign(cost=[cost(ns / 1e9, energy.price_per_hour) for ns in steps["dur_ns"]])
    return steps


def with_part_energy(breakdown: pd.DataFrame, report: StepReport, energy: StepEnergy) -> pd.DataFrame:
    """The breakdown with each part's mean joules per counted step."""
    if not energy.recorded:
        return breakdown
    return breakdown.merge(part_joules(report.steps, energy.steps), on=["rank", "part"], how="left")


def energy_table(energy: StepEnergy) -> pd.DataFrame:
    """Per rank and power source, over the counted steps, for a person."""
    summary = energy.summary
    shown = pd.DataFrame({
        "Rank": summary["rank"], "Device": summary["device"], "Source": summary["source"],
        "Steps": summary["steps"], "Mean (J)": summary["mean_joules"].map("{:.3f}".format),
        "Total (J)": summary["total_joules"].map("{:.1f}".format), "Power (W)": summary["watts"].map("{:.1f}".format),
    })
    return shown


def energy_lines(energy: StepEnergy) -> list[str]:
    """What the tables do not say: the cost of the run, and (when a cost was asked for) that no
    power was recorded."""
    lines = [] if energy.recorded or energy.price_per_hour is None else [f"energy: {NO_POWER}"]
    if energy.run_cost is not None:
        lines.append(f"cost of the run: {energy.run_cost:.4f} ({energy.run_seconds:.1f} s at "
                     f"{energy.price_per_hour:g} an hour)")
    return lines
