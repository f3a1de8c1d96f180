"""``dlprof tune``: the kernels most worth tuning, ranked, each with its reasons in words."""

from __future__ import annotations

import sys

import click
import pandas as pd

from dlprof.analysis.aggregate import kinds_present
from dlprof.analysis.tuning import Basis, tuning_candidates
from dlprof.cli.common import UsageError, engine_option, open_run, run_argument, runs_dir_option
from dlprof.cli.table_options import format_option, limit_option, wide_option
from dlprof.keys import PROFILER_RANGE, TableFormat
from dlprof.viewers.names import distinct_names
from dlprof.viewers.screen import printable, table_width, wrapped
from dlprof.viewers.terminal import time_text, write_table

HELP = """Rank a run's kernels by how much tuning them may gain, and say why.

With per-kernel counters the score is TAU's ranking: (active warps per instruction) x
exclusive time plus (global loads per instruction) x exclusive time. Without them, exclusive
time x the signals of the launch configuration: estimated occupancy below 50%, more than 64
registers per thread, fewer blocks than the GPU has SMs, kernels shorter than their launch.
Times are exclusive milliseconds summed over each kernel name's calls.

RUN is a run directory, or the name of one under --dir; by default the newest there.

\b
Examples:
  dlprof tune                      # newest run, the 15 best candidates
  dlprof tune RUN -n 5
  dlprof tune RUN --wide           # every column and whole names
  dlprof tune RUN -f json          # reasons as lists, for scripts
"""

_BASIS_WORDS = {
    Basis.COUNTERS: "(metric per instruction) x exclusive ms",
    Basis.LAUNCH: "exclusive ms x launch-configuration signals",
}


@click.command("tune", help=HELP)
@run_argument
@limit_option("Candidates to show")
@format_option(help_text="Table for a person, CSV or JSON for a script.")
@wide_option
@runs_dir_option
@engine_option
def command(run: str | None, limit: int, fmt: str) -> int:
    loaded = open_run(run)
    try:
        found = tuning_candidates(loaded, limit=limit or None)
    except ValueError:
        present = kinds_present(loaded)
        detail = f"this run has: {', '.join(present)}" if present else "the run holds no slices"
        if PROFILER_RANGE in present:
            detail += (f"; its {PROFILER_RANGE} slices carry counters but placeholder durations "
                       "(dlprof metrics shows them)")
        raise UsageError(f"{loaded.path}: no kernels to rank; {detail}") from None
    if found.basis is Basis.LAUNCH:
        print("dlprof: no per-kernel counters in this run: ranked by exclusive time x "
              "launch-configuration signals", file=sys.stderr)
    if found.table.empty:
        print("dlprof: no kernel matched a tuning rule", file=sys.stderr)
    title = f"{loaded.path.name}: tuning candidates, score = {_BASIS_WORDS[found.basis]} ({loaded.status})"
    table_format = TableFormat(fmt)
    table = found.table
    if table_format is TableFormat.TABLE:
        shown = table.drop(columns=["reasons", "rules"])
        write_table(shown.assign(score=[f"{s:.3g}" for s in table["score"]]), title, table_format,
                    sort="score", keep=("rank",))
        _write_reasons(table)
        _write_collectives(found.collectives)
        return 0
    if table_format is TableFormat.CSV:
        table = table.assign(reasons=table["reasons"].map("; ".join),
                             rules=table["rules"].map(" ".join))
    write_table(table, title, table_format)
    return 0


def _write_reasons(table: pd.DataFrame) -> None:
    """Each candidate's reasons under its rank, below the table (a cell would crush them),
    wrapped to the tables' width; the names shortened together, as in the table."""
    width = table_width(sys.stdout)
    names = [str(n) for n in table["name"]]
    shown = distinct_names(names, width - 6) if width else names
    for rank, name, reasons in zip(table["rank"], shown, table["reasons"], strict=True):
        click.echo(printable(f"{rank:>4}  {name}"))
        for reason in reasons:
            click.echo(wrapped(f"        - {reason}", sys.stdout, indent=" " * 10))


def _write_collectives(collectives: pd.DataFrame) -> None:
    """The collective kernels left out of the ranking, and why."""
    if collectives.empty:
        return
    total = time_text(float(collectives["self_ns"].sum()))
    click.echo(wrapped(f"Left out: {len(collectives)} collective kernel name(s) ({total}; NCCL or RCCL): "
                       "their time waits on the other ranks, which no launch configuration explains; "
                       "dlprof ranks shows who held them up.", sys.stdout, indent="  "))
