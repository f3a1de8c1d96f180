"""``dlprof finish``: make final the saves a killed run left waiting (the one command that writes to
a run it reads)."""

from __future__ import annotations

import click

from dlprof.cli.common import UsageError, open_run, run_argument, runs_dir_option
from dlprof.keys import RunStatus
from dlprof.store.writer_lock import in_use
from dlprof.viewers.screen import printable

HELP = """Make final the saves a killed run left waiting.

A run writes each save at once as raw chunks and profiler traces, and a child process makes it
final while the program runs. If both the program and that child were killed, the saves wait in
the run's pending/ folder: the other commands read what the chunks hold and say how many saves
wait, but never write to a run; this command converts the traces, nests the rows and writes the
saves' parts, inside the run directory only.

\b
Examples:
  dlprof finish                    # the newest run
  dlprof finish RUN                # a run directory, or the name of one under --dir
"""


@click.command("finish", help=HELP)
@run_argument
@runs_dir_option
def command(run: str | None) -> int:
    loaded = open_run(run, note_unfinished=False)
    shown = printable(str(loaded.path))
    if loaded.status is RunStatus.RUNNING or in_use(loaded.path) is not None:
        raise UsageError(f"{shown}: still being recorded; its own processes finish its saves")
    # A run is input: a link out of it would make the parts written here land elsewhere, and a
    # part or chunk that is not Parquet (a FIFO) would hang the reading.
    loaded.check_tables()
    from dlprof.recording.finisher import FinishError, finish_pending  # Arrow and the importers: only here
    from dlprof.store.save_jobs import SaveJobError

    try:
        finished = finish_pending(loaded.path)
    except (SaveJobError, FinishError) as error:
        raise UsageError(f"{shown}: damaged: {printable(str(error))}") from None
    click.echo(f"{shown}: {finished} save(s) made final" if finished else f"{shown}: no save was waiting")
    return 0
