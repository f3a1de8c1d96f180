"""``dlprof ranks``: the ranks of a distributed run side by side, and which of them lag."""

from __future__ import annotations

import sys

import click
import pandas as pd

from dlprof.analysis.aggregate import kinds_present
from dlprof.analysis.ranks import DEFAULT_THRESHOLD_PCT, rank_steps, stragglers_among, summary_of
from dlprof.cli.common import UsageError, engine_option, open_run, run_argument, runs_dir_option
from dlprof.cli.table_options import format_option, wide_option
from dlprof.keys import TableFormat
from dlprof.store.reader import Run
from dlprof.viewers.names import short_name
from dlprof.viewers.screen import wrapped
from dlprof.viewers.terminal import readable_columns, write_table

HELP = f"""Compare the ranks of a distributed run: step times, compute against communication
against idle time, how much communication computation hides, and stragglers.

RUN is a run directory, or the name of one under --dir; by default the newest there.

A rank with GPU work is measured on its GPUs (communication: NCCL/RCCL kernels; compute: the other
kernels), a rank without on its CPU threads (communication: collectives such as c10d::allreduce_
and gloo:all_reduce; compute: ops outside them). Overlap is the share of communication time during
which compute ran. Steps (ProfilerStep#N) are matched across ranks by number, collectives within a
step by name and order. A rank's arrival lag at a collective is its arrival minus the latest of the
other ranks' (positive only for the last to arrive); its arrival lag in a step is the time the
others waited for it alone less the time it waited for them. A rank is a straggler in a step when that lag is positive and over --threshold
percent of the step's median time (default {DEFAULT_THRESHOLD_PCT:g}); in a step without collectives,
its step time minus the median of the other ranks' decides. A rank that waited is never one.

\b
Examples:
  dlprof ranks                          # the newest run: per-rank summary, then stragglers
  dlprof ranks RUN --threshold 5        # flag lags over 5% of the median step time
  dlprof ranks RUN --by-step            # one row per rank and step
  dlprof ranks RUN -f json              # the summary, every column, for scripts
  dlprof ranks RUN --by-step -f csv
"""

_STEP_TIMES = [("step_median_ns", "Step median"), ("step_max_ns", "Step max")]
_SHARES = [("compute_pct", "Compute %"), ("comm_pct", "Comm %"), ("overlap_pct", "Overlap %"),
           ("idle_pct", "Idle %")]
_LAGS = [("step_lag_pct", "Step lag %"), ("arrival_lag_pct", "Arrival lag %")]
# What a narrow terminal keeps of each table, most important first (the rest go right to left).
_SUMMARY_KEPT = ("Rank", "On", "Step median", "Comm %", "Overlap %", "Straggler steps", "Max lag %")
_STEP_KEPT = ("Rank", "On", "Step", "Straggler", "Step time", "Step lag %", "Arrival lag %", "Comm %")
_LATE_KEPT = ("Step", "Rank", "Latest arrival", "Arrival lag %", "Step lag %")


@click.command("ranks", help=HELP)
@run_argument
@click.option("--threshold", type=click.FloatRange(min=0), default=DEFAULT_THRESHOLD_PCT,
              show_default=True, metavar="PCT",
              help="Flag a rank that held the others up by more than this percent of the median step time.")
@click.option("--by-step", is_flag=True, help="One row per rank and step instead of per rank.")
@format_option()
@wide_option
@runs_dir_option
@engine_option
def command(run: str | None, threshold: float, by_step: bool, fmt: str) -> int:
    loaded = open_run(run)
    print_ranks(loaded, threshold, by_step, TableFormat(fmt))
    return 0


def print_ranks(loaded: Run, threshold: float = DEFAULT_THRESHOLD_PCT, by_step: bool = False,
                fmt: TableFormat = TableFormat.TABLE) -> None:
    """Print a run's rank analysis, or fail with one line saying why there is none."""
    if not kinds_present(loaded):
        raise UsageError(f"{loaded.path}: the run holds no slices ({loaded.status})")
    name = f"{loaded.path.name} ({loaded.status})"
    # One pass over the ranks' timelines serves every table below.
    steps = rank_steps(loaded, threshold)
    if by_step:
        if fmt is not TableFormat.TABLE:
            write_table(steps, "", fmt)
            return
        title = f"{name}: per rank and step (lags against the other ranks)"
        write_table(_step_view(steps), title, fmt, keep=_STEP_KEPT)
        return
    summary = summary_of(steps)
    if fmt is not TableFormat.TABLE:
        write_table(summary, "", fmt)
        return
    shown = readable_columns(summary, ["rank", "measured_on"], [
        [("steps", "Steps")], _STEP_TIMES, _SHARES, [("collectives", "Collectives")],
        [("straggler_steps", "Straggler steps")], [("max_lag_pct", "Max lag %")]])
    write_table(shown.rename(columns={"Measured_on": "On"}), f"{name}: per rank (overlap: share of "
                "communication hidden by compute)", fmt, keep=_SUMMARY_KEPT)
    late = stragglers_among(steps)
    if late.empty:
        counted = f"{_count(int(summary['steps'].max()), 'step')}, {_count(len(summary), 'rank')}"
        print(wrapped(f"No stragglers: no rank held the others up by more than {threshold:g}% of the median "
                      f"step time ({counted}).", sys.stdout))
        return
    write_table(_late_view(late), f"{name}: stragglers (held the others up over {threshold:g}% of the median step time)",
                fmt, keep=_LATE_KEPT)


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _late_at(steps: pd.DataFrame) -> list[str]:
    """The collective a rank arrived at latest, named for a person: ``nccl:all_reduce #2``."""
    return ["-" if pd.isna(name) else f"{short_name(str(name), 60)} #{occurrence}"
            for name, occurrence in zip(steps["late_collective"], steps["late_occurrence"], strict=True)]


def _late_view(late: pd.DataFrame) -> pd.DataFrame:
    shown = readable_columns(late, ["step", "rank"],
                             [[("step_ns", "Step time"), ("median_step_ns", "Median")], _LAGS])
    return shown.assign(**{"Latest arrival": _late_at(late)})


def _step_view(steps: pd.DataFrame) -> pd.DataFrame:
    keys = ["rank", "step"] if steps["measured_on"].nunique() == 1 else ["rank", "measured_on", "step"]
    shown = readable_columns(steps, keys, [
        [("step_ns", "Step time"), ("span_ns", "Window")], _SHARES, [("collectives", "Collectives")], _LAGS])
    flags = ["yes" if flagged else "" for flagged in steps["straggler"]]
    return shown.rename(columns={"Measured_on": "On"}).assign(Straggler=flags)
