"""``dlprof pprof``: every thread's flat profile as TAU's ``pprof`` tool prints it (TAU's profile
layout; the command keeps the name of TAU's tool, and Google's pprof format is an export)."""

from __future__ import annotations

import click

from dlprof.analysis.aggregate import kinds_present
from dlprof.analysis.tau_profile import function_summaries, tau_profiles
from dlprof.cli.common import UsageError, check_rank, engine_option, open_run, run_argument
from dlprof.cli.table_options import wide_option
from dlprof.viewers.tau_profile_text import write_tau_profile

HELP = """Print a run's flat profile per rank and thread, in TAU's profile layout (as TAU's
pprof tool prints it; for Google's pprof format: dlprof export -o prof.pb.gz).

One table per thread or GPU stream (NODE is the rank, THREAD the track's index within it): each
name's exclusive and inclusive time, calls, direct child calls and inclusive time per call,
sorted by inclusive time. With several threads, TAU's total and mean summaries follow. To fit
the terminal, #Subrs and then the inclusive time per call go first (--wide keeps them).

RUN is a run directory; by default the newest under ./dlprof-runs.

\b
Examples:
  dlprof pprof                      # newest run, every rank and thread
  dlprof pprof RUN --rank 1         # only rank 1 (TAU's node 1)
  dlprof pprof RUN --limit 20       # 20 rows per table, the rest as -others-
  dlprof pprof RUN --wide | less -S # TAU's whole layout, whole names
  dlprof pprof RUN --engine spark   # computed by Apache Spark
"""


@click.command("pprof", help=HELP)
@run_argument
@click.option("--rank", type=int, default=None, help="Only this rank (TAU's node).")
@click.option("--limit", "-n", type=click.IntRange(min=0), default=0, show_default=True,
              help="Rows per table (0: all); the rest are summed into a -others- row, as "
                   "TAU's pprof -n does.")
@wide_option
@engine_option
def command(run: str | None, rank: int | None, limit: int) -> int:
    loaded = open_run(run)
    if not kinds_present(loaded):
        raise UsageError(f"{loaded.path}: the run holds no slices ({loaded.status})")
    check_rank(loaded, rank)
    try:
        profiles = tau_profiles(loaded, rank=rank)
    except ValueError as error:
        raise UsageError(f"{loaded.path}: {error}") from None
    summaries = [s.head(limit) for s in function_summaries(profiles)]
    title = f"Reading run {loaded.path} ({loaded.status})"
    write_tau_profile([p.head(limit) for p in profiles], summaries, title)
    return 0
