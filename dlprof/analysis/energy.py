"""Energy per step: joules from power samples integrated over each step's window, and cost.

    energy = step_energy(run)          # per step and power source: joules, mean watts
    power = step_power(energy)         # one figure per run: joules per counted step (None: no power)
    sources = power_sources(run)       # what the run has: [] means no power was recorded

Sources, from the counters table:

- **NVML** (the ``nvml`` collector, track ``nvml.power``): each GPU's board power in watts,
  sampled every ``host_interval_s``. Between two samples power is taken as the straight line
  joining them (the trapezoid rule); a window that cuts a sampling interval takes the line's
  values at its ends, so a power that changes linearly is integrated exactly.
- **RAPL** (the ``rapl`` collector, track ``rapl.energy_pkg``): joules counted since the start
  per CPU package; between two readings power is the energy counted over the time, constant.

A step's joules are the integral over its window of each source's power, per device; only the
part of a window the samples cover counts (``covered_pct`` says how much). Per part of a step
(forward, backward...: :mod:`dlprof.analysis.steps`) the samples are too coarse to integrate: a
part is given the step's mean power times its time (:func:`part_joules`). Cost is time, not
energy: ``price_per_hour`` times a step's (or the run's) wall time.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import pandas as pd

from dlprof.analysis.sql import rank_condition
from dlprof.analysis.steps import StepPart, StepStatus, flagged_steps_sql
from dlprof.store.reader import Run


class PowerSource(StrEnum):
    """Where a power reading comes from, named by its counters track."""

    NVML = "nvml.power"  # GPU board power, watts, sampled
    RAPL = "rapl.energy_pkg"  # CPU package energy, joules counted since the start


ENERGY_COLUMNS = ["rank", "step", "start_ns", "status", "device", "source", "joules", "watts", "covered_pct"]
NO_POWER = "not recorded (GPU power: the nvml collector; CPU package energy: the rapl collector)"


def power_sources(run: Run, rank: int | None = None) -> list[tuple[str, str]]:
    """The (device, source track) pairs of power the run recorded."""
    tracks = ", ".join(f"'{s}'" for s in PowerSource)
    rows = run.query(f"SELECT DISTINCT device, track FROM counters WHERE track IN ({tracks}){rank_condition(rank)} "
                     "ORDER BY device, track").rows
    return [(str(device), str(track)) for device, track in rows]


def _segments_sql(rank: int | None) -> str:
    """Power between consecutive samples of a device: ``seg_start``, ``seg_end`` and the watts
    at each end (``w_start``, ``w_end``)."""
    window = "OVER (PARTITION BY rank, pid, device, track ORDER BY ts_ns)"
    tracks = ", ".join(f"'{s}'" for s in PowerSource)
    paired = (
        f"SELECT rank, device, track, ts_ns AS seg_start, lead(ts_ns) {window} AS seg_end, value, "
        f"lead(value) {window} AS next_value FROM counters WHERE track IN ({tracks}){rank_condition(rank)}"
    )
    rate = "(next_value - value) * 1e9 / (seg_end - seg_start)"
    return (
        "SELECT rank, device, track, seg_start, seg_end, "
        f"CASE WHEN track = '{PowerSource.NVML}' THEN value ELSE {rate} END AS w_start, "
        f"CASE WHEN track = '{PowerSource.NVML}' THEN next_value ELSE {rate} END AS w_end "
        f"FROM ({paired}) AS p WHERE seg_end > seg_start"
    )


def step_energy(run: Run, rank: int | None = None) -> pd.DataFrame:
    """Each step's energy per device and source (see the module's docstring).

    Args:
        run: the run.
        rank: only this rank.

    Returns:
        :data:`ENERGY_COLUMNS`, one row per step, device and source with samples in its window;
        empty when the run recorded no power.
    """
    steps = flagged_steps_sql(run, rank)
    # The power line's value at a time x inside a segment, and the overlap's ends.
    low, high = "GREATEST(g.seg_start, s.start_ns)", "LEAST(g.seg_end, s.end_ns)"

    def at(x: str) -> str:
        return f"(g.w_start + (g.w_end - g.w_start) * ({x} - g.seg_start) / (g.seg_end - g.seg_start))"

    overlaps = (
        "SELECT s.rank, s.step, s.start_ns, s.status, s.dur_ns, g.device, g.track AS source, "
        f"({at(low)} + {at(high)}) / 2.0 * ({high} - {low}) / 1e9 AS joules, {high} - {low} AS covered_ns "
        f"FROM ({steps}) AS s JOIN ({_segments_sql(rank)}) AS g ON g.rank = s.rank "
        "AND g.seg_start < s.end_ns AND g.seg_end > s.start_ns"
    )
    frame = run.sql(
        "SELECT rank, step, start_ns, status, device, source, sum(joules) AS joules, "
        "sum(joules) * 1e9 / sum(covered_ns) AS watts, 100.0 * sum(covered_ns) / min(dur_ns) AS covered_pct "
        f"FROM ({overlaps}) AS o GROUP BY rank, step, start_ns, status, device, source "
        "ORDER BY rank, start_ns, device, source"
    )
    return frame.astype({"rank": "int64", "start_ns": "int64", "joules": "float64", "watts": "float64",
                         "covered_pct": "float64"})[ENERGY_COLUMNS]


def energy_summary(energy: pd.DataFrame) -> pd.DataFrame:
    """Per rank, device and source, over the counted steps: steps, mean joules a step, total
    joules and mean watts."""
    counted = energy[energy["status"] == StepStatus.COUNTED]
    grouped = counted.groupby(["rank", "device", "source"], sort=True)
    return grouped.agg(steps=("joules", "size"), mean_joules=("joules", "mean"), total_joules=("joules", "sum"),
                       watts=("watts", "mean")).reset_index()


def joules_per_step(energy: pd.DataFrame) -> pd.DataFrame:
    """Each step's joules over every device and source: ``rank``, ``start_ns``, ``joules``."""
    return energy.groupby(["rank", "start_ns"], sort=True)["joules"].sum().reset_index()


def part_joules(steps: pd.DataFrame, energy: pd.DataFrame) -> pd.DataFrame:
    """Each part's mean joules per counted step: the step's mean power times the part's time.

    Args:
        steps: :attr:`StepReport.steps` (a row per step with each part's ``<part>_ns``).
        energy: :func:`step_energy`'s rows for the same steps.

    Returns:
        ``rank``, ``part``, ``mean_joules``, one row per rank and part (empty without energy).
    """
    totals = joules_per_step(energy)
    merged = steps[steps["status"] == StepStatus.COUNTED].merge(totals, on=["rank", "start_ns"])
    rows = []
    for rank, group in merged.groupby("rank", sort=True):
        for part in StepPart:
            share = group[f"{part}_ns"] / group["dur_ns"]
            rows.append({"rank": rank, "part": str(part), "mean_joules": float((share * group["joules"]).mean())})
    return pd.DataFrame(rows, columns=["rank", "part", "mean_joules"])


def cost(seconds: float, price_per_hour: float) -> float:
    """What ``seconds`` of the machine cost at ``price_per_hour``."""
    return seconds / 3600.0 * price_per_hour


@dataclass(frozen=True)
class StepPower:
    """A run's energy over its counted steps, every device and source added up."""

    steps: int  # counted steps with power samples in their window
    joules: float  # mean joules per counted step
    watts: float  # mean power, every device's added (averaged over ranks)


def step_power(energy: pd.DataFrame) -> StepPower | None:
    """:func:`step_energy`'s rows as one figure per run; None without power in a counted step."""
    counted = energy[energy["status"] == StepStatus.COUNTED]
    if counted.empty:
        return None
    per_step = joules_per_step(counted)
    watts = energy_summary(counted).groupby("rank")["watts"].sum().mean()
    return StepPower(len(per_step), float(per_step["joules"].mean()), float(watts))
