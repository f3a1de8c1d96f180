"""``dlprof steps``: step-time statistics, where a step's time goes, and the steps left out."""

from __future__ import annotations

import json

import click
import pandas as pd

from dlprof.analysis.steps import STEP_COLUMNS, StepPart, StepReport, StepStatus, excluded_steps, step_report
from dlprof.cli.common import (
    UsageError,
    check_rank,
    engine_option,
    open_run,
    rank_option,
    run_argument,
    runs_dir_option,
    within_option,
)
from dlprof.cli.energy_columns import (
    StepEnergy,
    energy_lines,
    energy_table,
    price_option,
    step_energy_of,
    with_part_energy,
    with_step_energy,
)
from dlprof.cli.table_options import DEFAULT_LIMIT, format_option, limit_option, wide_option
from dlprof.keys import TableFormat
from dlprof.store.reader import Run
from dlprof.viewers.terminal import readable_columns, time_text, write_table

HELP = """Step-time statistics of a run: count, mean, median, p90, p99, standard deviation,
least and most, per rank; where a step's time goes (data wait, forward, backward, optimizer,
communication, profiler, other), on the host and on each GPU; and the slowest steps.

RUN is a run directory, or the name of one under --dir; by default the newest there.

Two kinds of step are left out of the statistics, and listed with the reason: the program's
first step (warm-up: ProfilerStep#0 pays for initialisation) and the step open when profiling
stopped (partial: ended by the stop rather than by a step call, it holds whatever ran after the
loop, such as an evaluation). The statistics are of the user's step time: a step's duration less
the time dlprof itself held the program (its profiler part: saves, profiler restarts).

The breakdown gives each instant of a step to what the threads of its process were doing then
(the main thread, autograd's backward thread, the DataLoader's pin-memory thread): data wait (the
loop waiting for a batch), forward and backward (the layers collector's module slices, autograd's
ops, ranges named forward and backward), optimizer (Optimizer.step and zero_grad), communication
(collectives), profiler (dlprof's own pauses); other is the rest, so the parts add up to the step.
Where threads overlap, the first in this order wins: profiler, data wait, communication, backward,
forward, optimizer. On a run with GPU work, a second breakdown per GPU: the time its work ran,
each piece under the part it was launched from, and its idle time, adding up to the step.

Energy, where the run recorded power (the nvml collector's GPU power, the rapl collector's CPU
package energy): joules per step and device, integrated over each step's window, and per part (the
step's mean power times the part's time). --price-per-hour adds each step's cost and the run's.

\b
Examples:
  dlprof steps                       # the newest run: statistics, breakdowns, slowest steps
  dlprof steps RUN --rank 1          # one rank of a job
  dlprof steps RUN --within train    # only the steps inside the region named train
  dlprof steps RUN -n 0              # every step, not only the 15 slowest
  dlprof steps RUN -f csv            # one row per step (status and parts), for scripts
  dlprof steps RUN -f json           # statistics, breakdown and steps as one JSON object
  dlprof steps RUN --price-per-hour 2.5   # the cost of a step and of the run
"""

_STATISTICS = [("mean_ns", "Mean"), ("median_ns", "Median"), ("p90_ns", "p90"), ("p99_ns", "p99"),
               ("std_ns", "Std"), ("min_ns", "Min"), ("max_ns", "Max")]
_PARTS = [(f"{part}_ns", part.replace("_", " ").capitalize()) for part in StepPart]
# Why a step is left out, in words.
REASONS = {
    StepStatus.WARMUP: "warm-up: the program's first step",
    StepStatus.PARTIAL: "partial: open when profiling stopped (holds what ran after the loop)",
}


@click.command("steps", help=HELP)
@run_argument
@rank_option
@within_option("Only the steps (their middle)")
@limit_option("Slowest counted steps to list", note="0 lists every step, in order.")
@format_option(help_text="Tables for a person, or CSV (one row per step) or JSON for a script.")
@wide_option
@runs_dir_option
@price_option
@engine_option
def command(run: str | None, rank: int | None, within: str | None, limit: int, fmt: str,
            price_per_hour: float | None) -> int:
    loaded = open_run(run)
    print_steps(loaded, rank, limit, TableFormat(fmt), price_per_hour, within)
    return 0


def print_steps(loaded: Run, rank: int | None = None, limit: int = DEFAULT_LIMIT,
                fmt: TableFormat = TableFormat.TABLE, price_per_hour: float | None = None,
                within: str | None = None) -> None:
    """Print a run's step report, or fail with one line saying why there is none."""
    check_rank(loaded, rank)
    report = step_report(loaded, rank, within)
    if report.steps.empty and within is not None:
        raise UsageError(f"{loaded.path}: no step lies inside a slice named {within!r} (see dlprof top --kind "
                         "region for the regions)")
    if report.steps.empty:
        raise UsageError(f"{loaded.path}: the run has no steps (ProfilerStep#N slices); end each step with "
                         "prof.step(), or profile under `dlprof run`")
    energy = step_energy_of(loaded, rank, price_per_hour)
    listed = with_step_energy(_listed(report, limit)[STEP_COLUMNS], energy)
    if fmt is TableFormat.CSV:
        write_table(listed, "", fmt)
        return
    if fmt is TableFormat.JSON:
        print(json.dumps({
            "statistics": _records(report.statistics),
            "breakdown": _records(with_part_energy(report.breakdown, report, energy)),
            "device_breakdown": _records(report.device_breakdown),
            "steps": _records(listed), "energy": _records(energy.summary) if energy.recorded else None,
            "run_cost": energy.run_cost,
        }, indent=1))
        return
    name = f"{loaded.path.name} ({loaded.status})"
    paused = report.steps.loc[report.steps["status"] == StepStatus.COUNTED, f"{StepPart.PROFILER}_ns"].sum()
    note = f" (less dlprof's own pauses, {time_text(float(paused))} in all)" if paused else ""
    write_table(_statistics_view(report), f"{name}: step times over the counted steps{note}", fmt)
    if (report.statistics["steps"] > 0).any():
        write_table(_breakdown_view(report, energy), f"{name}: time per counted step by part", fmt)
        if not report.device_breakdown.empty:
            write_table(_device_breakdown_view(report), f"{name}: GPU time per counted step by part (the work "
                        "launched in each part; profiler also holds the GPU's idle time while dlprof held the "
                        "program; idle is the GPU's own)", fmt)
    if energy.recorded:
        write_table(energy_table(energy), f"{name}: energy per counted step, per device", fmt)
    left_out = excluded_steps(report)
    if not left_out.empty:
        shown = readable_columns(left_out, ["rank", "step"], [[("dur_ns", "Time")]])
        reasons = [REASONS[StepStatus(status)] for status in left_out["status"]]
        write_table(shown.assign(Reason=reasons), f"{name}: steps left out of the statistics", fmt,
                    keep=["Step", "Reason"])
    title = "every step, in order" if not limit else f"the {len(listed)} slowest counted steps"
    shown = readable_columns(listed, ["rank", "step", "status"], [[("dur_ns", "Time"), *_PARTS]])
    write_table(_energy_cells(shown, listed), f"{name}: {title}", fmt, keep=["Time", "Energy (J)", "Cost"])
    for line in energy_lines(energy):
        print(line)


def _energy_cells(shown: pd.DataFrame, listed: pd.DataFrame) -> pd.DataFrame:
    """The step table's energy and cost columns, where there are any."""
    cells = {"joules": ("Energy (J)", "{:.3f}"), "cost": ("Cost", "{:.6f}")}
    for column, (header, spec) in cells.items():
        if column in listed.columns:
            shown[header] = ["-" if pd.isna(v) else spec.format(v) for v in listed[column]]
    return shown


def _listed(report: StepReport, limit: int) -> pd.DataFrame:
    """Every step in order (limit 0), or the ``limit`` slowest counted ones, slowest first."""
    if not limit:
        return report.steps
    counted = report.steps[report.steps["status"] == StepStatus.COUNTED]
    return counted.sort_values(["dur_ns", "rank", "start_ns"], ascending=[False, True, True]).head(limit)


def _statistics_view(report: StepReport) -> pd.DataFrame:
    return readable_columns(report.statistics, ["rank", "steps", "warmup", "partial"], [_STATISTICS]).rename(
        columns={"Warmup": "Warm-up"})


def _breakdown_view(report: StepReport, energy: StepEnergy) -> pd.DataFrame:
    table = with_part_energy(report.breakdown, report, energy)
    shown = readable_columns(table, ["rank"], [[("mean_ns", "Mean")], [("step_pct", "% of step")]])
    if "mean_joules" in table.columns:
        shown["Energy (J)"] = ["-" if pd.isna(v) else f"{v:.3f}" for v in table["mean_joules"]]
    parts = [part.replace("_", " ") for part in table["part"]]
    return shown.assign(Part=parts)[["Rank", "Part", *[c for c in shown.columns if c != "Rank"]]]


def _device_breakdown_view(report: StepReport) -> pd.DataFrame:
    table = report.device_breakdown
    keys = ["rank", "device"] if table["rank"].nunique() > 1 else ["device"]
    shown = readable_columns(table, keys, [[("mean_ns", "Mean")], [("step_pct", "% of step")]])
    parts = [part.replace("_", " ") for part in table["part"]]
    headers = [c for c in shown.columns if c not in ("Rank", "Device")]
    return shown.assign(Part=parts)[[*(c for c in ("Rank", "Device") if c in shown.columns), "Part", *headers]]


def _records(frame: pd.DataFrame) -> list[dict[str, object]]:
    """A frame as JSON records (missing values as null)."""
    # 15 digits, not pandas' 10 decimals: a step's cost can be a few millionths.
    records: list[dict[str, object]] = json.loads(frame.to_json(orient="records", double_precision=15))
    return records
