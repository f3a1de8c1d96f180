"""``dlprof pprof``: every thread's flat profile as TAU's ``pprof`` tool prints it (TAU's profile
layout; the command keeps the name of TAU's tool, and Google's pprof format is an export)."""

from __future__ import annotations

import click
import pandas as pd

from dlprof.analysis.aggregate import kinds_present
from dlprof.analysis.tau_profile import (
    PROFILE_COLUMNS,
    FunctionSummary,
    SummaryKind,
    ThreadProfile,
    folded_inclusive,
    function_summaries,
    tau_profiles,
)
from dlprof.cli.common import (
    UsageError,
    check_rank,
    engine_option,
    open_run,
    rank_option,
    run_argument,
    runs_dir_option,
)
from dlprof.cli.table_options import format_option, limit_option, wide_option
from dlprof.keys import TableFormat
from dlprof.viewers.tau_profile_text import write_tau_profile
from dlprof.viewers.terminal import write_table

HELP = """Print a run's flat profile per rank and thread, in TAU's profile layout (as TAU's
pprof tool prints it; for Google's pprof format: dlprof export -o prof.pb.gz).

One table per thread or GPU stream (NODE is the rank, THREAD the track's index within it): each
name's exclusive and inclusive time, calls, direct child calls and inclusive time per call,
sorted by inclusive time. With several threads, TAU's total and mean summaries follow. To fit
the terminal, #Subrs and then the inclusive time per call go first (--wide keeps them).

RUN is a run directory, or the name of one under --dir; by default the newest there.

\b
Examples:
  dlprof pprof                      # newest run, every rank and thread, 15 rows a table
  dlprof pprof RUN --rank 1         # only rank 1 (TAU's node 1)
  dlprof pprof RUN -n 0             # every row, as TAU's pprof prints them
  dlprof pprof RUN -n 20            # 20 rows per table, the rest as -others-
  dlprof pprof RUN -f csv           # the same rows, a profile column naming each table
  dlprof pprof RUN --wide | less -S # TAU's whole layout, whole names
  dlprof pprof RUN --engine spark   # computed by Apache Spark
"""


@click.command("pprof", help=HELP)
@run_argument
@rank_option
@limit_option("Rows per table", note="The rest are summed into a -others- row, as TAU's pprof -n does.")
@format_option(help_text="TAU's text layout for a person, or its rows as CSV or JSON for a script.")
@wide_option
@runs_dir_option
@engine_option
def command(run: str | None, rank: int | None, limit: int, fmt: str) -> int:
    loaded = open_run(run)
    if not kinds_present(loaded):
        raise UsageError(f"{loaded.path}: the run holds no slices ({loaded.status})")
    check_rank(loaded, rank)
    try:
        profiles = tau_profiles(loaded, rank=rank)
    except ValueError as error:
        raise UsageError(f"{loaded.path}: {error}") from None
    # Each -others- row's inclusive time is what its slices cover, a nested one counted once.
    per_thread, folded_total = folded_inclusive(loaded, profiles, limit, rank) if limit else ({}, 0)
    summaries = [s.head(limit or None, (folded_total if s.kind is SummaryKind.TOTAL else folded_total / s.threads)
                        if limit else None) for s in function_summaries(profiles)]
    shown = [p.head(limit or None, per_thread.get((p.rank, p.pid, p.tid, p.device))) for p in profiles]
    if TableFormat(fmt) is not TableFormat.TABLE:
        write_table(profile_rows(shown, summaries), "", TableFormat(fmt))
        return 0
    title = f"Reading run {loaded.path} ({loaded.status})"
    write_tau_profile(shown, summaries, title)
    return 0


def profile_rows(profiles: list[ThreadProfile], summaries: list[FunctionSummary]) -> pd.DataFrame:
    """TAU's tables as one table for a script: the rows each thread's table shows (``profile``
    "thread", with its rank, thread, pid, tid and device), then the summaries' ("total",
    "mean", with no thread).

    Args:
        profiles: the thread profiles as shown (cut to the limit, with their ``-others-`` row).
        summaries: the total and mean summaries as shown.

    Returns:
        Columns profile, rank, thread, pid, tid, device, then :data:`PROFILE_COLUMNS`.
    """
    keys = ["profile", "rank", "thread", "pid", "tid", "device"]
    parts = [p.functions.assign(profile="thread", rank=p.rank, thread=p.thread, pid=p.pid, tid=p.tid,
                                device=p.device) for p in profiles]
    parts += [s.functions.assign(profile=str(s.kind), rank=None, thread=None, pid=None, tid=None, device=None)
              for s in summaries]
    if not parts:
        return pd.DataFrame(columns=[*keys, *PROFILE_COLUMNS])
    return pd.concat(parts, ignore_index=True)[[*keys, *PROFILE_COLUMNS]]
