"""``dlprof pprof``: every thread's flat profile as TAU's ``pprof`` prints it."""

from __future__ import annotations

import click

from dlprof.analysis.pprof import function_summaries, pprof_tables
from dlprof.cli.common import UsageError, check_rank, open_run, run_argument
from dlprof.viewers.pprof_text import write_pprof

HELP = """Print a run's flat profile per rank and thread, in TAU pprof's text layout.

One table per thread or GPU stream (NODE is the rank, THREAD the track's index within it): each
name's exclusive and inclusive time, calls, direct child calls and inclusive time per call,
sorted by inclusive time. With several threads, TAU's total and mean summaries follow.

RUN is a run directory; by default the newest under ./dlprof-runs.

\b
Examples:
  dlprof pprof                      # newest run, every rank and thread
  dlprof pprof RUN --rank 1         # only rank 1 (TAU's node 1)
  dlprof pprof RUN --limit 20       # 20 rows per table, the rest as -others-
  dlprof pprof RUN | less -S        # long names, long tables
"""


@click.command("pprof", help=HELP)
@run_argument
@click.option("--rank", type=int, default=None, help="Only this rank (TAU's node).")
@click.option("--limit", "-n", type=click.IntRange(min=0), default=0, show_default=True,
              help="Rows per table (0: all); the rest are summed into a -others- row, as "
                   "TAU's pprof -n does.")
def command(run: str | None, rank: int | None, limit: int) -> int:
    loaded = open_run(run)
    slices = loaded.slices
    if slices.empty:
        raise UsageError(f"{loaded.path}: the run holds no slices ({loaded.status})")
    check_rank(loaded, rank)
    try:
        profiles = pprof_tables(loaded, rank=rank)
    except ValueError as error:
        raise UsageError(f"{loaded.path}: {error}") from None
    summaries = [s.head(limit) for s in function_summaries(profiles)]
    title = f"Reading run {loaded.path} ({loaded.status})"
    write_pprof([p.head(limit) for p in profiles], summaries, title)
    return 0
