"""``dlprof ls``: the runs under ./dlprof-runs, newest first."""

from __future__ import annotations

from datetime import datetime

import click

from dlprof.cli.common import runs_dir, runs_dir_option
from dlprof.cli.table_options import format_option, wide_option
from dlprof.config import RUNS_DIR
from dlprof.engine.rows import Rows
from dlprof.keys import TableFormat
from dlprof.store.catalog import list_runs
from dlprof.text import printable
from dlprof.viewers.terminal import write_table

HELP = f"""List the runs under ./{RUNS_DIR} (or --dir), newest first.

One row per run directory: its name (what other commands take as RUN), the script it
profiled, its status (a run whose writer died shows as killed; one whose manifest or files
cannot be read as unreadable or damaged, with the reason; one whose recording is not whole, a
collector that could not start or stopped, as degraded, with the reason), when it started, how long
it ran, its events (rows in all its tables) and its size on disk. No runs is not an
error: a line says so and the exit status is 0 (CSV and JSON print an empty table).

\b
Examples:
  dlprof ls                        # ./dlprof-runs
  dlprof ls --dir runs             # another directory of runs
  dlprof ls --wide                 # every column, however wide
  dlprof ls -f json                # for scripts (times in ns, sizes in bytes)
"""


@click.command("ls", help=HELP)
@runs_dir_option
@format_option(help_text="Table for a person, CSV or JSON for a script.")
@wide_option
def command(fmt: str) -> int:
    parent = runs_dir()
    runs = list_runs(parent)
    table_format = TableFormat(fmt)
    if table_format is not TableFormat.TABLE:
        write_table(runs, "", table_format)
    elif not runs:
        click.echo(f"no runs under {printable(parent)}; profile a program first: dlprof run script.py")
    else:
        title = f"{len(runs)} run{'s' if len(runs) != 1 else ''} under {parent}"
        write_table(for_people(runs), title, table_format)
    return 0


def for_people(runs: Rows) -> Rows:
    """The listing as text cells: local start time, a duration and a size with their units.

    Args:
        runs: :func:`dlprof.store.catalog.list_runs`'s rows.

    Returns:
        Columns name, Script, Status, Started, Duration, Events, Size (headers as shown), as strings.
    """
    return Rows.from_columns({
        "name": runs.column("name"),
        "Script": runs.column("script"),
        "Status": [_status_cell(status, problem)
                   for status, problem in zip(runs.column("status"), runs.column("problem"), strict=True)],
        "Started": [_local_time(ns) for ns in runs.column("start_ns")],
        "Duration": [human_duration(ns) if ns else "" for ns in runs.column("duration_ns")],
        "Events": ["" if n is None else f"{int(n):,}" for n in runs.column("events")],
        "Size": [human_size(b) for b in runs.column("size_bytes")],
    })


def _status_cell(status: str, problem: str) -> str:
    """The status, with the reason a run cannot be read (which may start with the status word)."""
    if not problem:
        return status
    return problem if problem.startswith(status) else f"{status}: {problem}"


def _local_time(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9).strftime("%Y-%m-%d %H:%M:%S") if ns else ""


def human_duration(ns: int) -> str:
    seconds = ns / 1e9
    if seconds < 60:
        return f"{seconds:.2f} s" if seconds >= 1 else f"{ns / 1e6:.1f} ms"
    minutes, seconds = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


def human_size(size: int) -> str:
    value = float(size)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} GB"
