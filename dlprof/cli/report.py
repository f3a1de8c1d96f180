"""``dlprof report``: one self-contained HTML file with a run's summary, charts, tables and timeline."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from dlprof.analysis.report_data import STAGES, report_data
from dlprof.cli.common import (
    UsageError,
    engine_option,
    open_run,
    output_option,
    run_argument,
    runs_dir_option,
)
from dlprof.store.safe_files import write_text
from dlprof.text import printable
from dlprof.viewers.html_report import render_report

HELP = """Write a run's report as one HTML file that works offline.

The page shows the run's summary (command, host, devices, duration, status, collectors and what
they could not do), step times, the top ops, layers and kernels (sortable), a zoomable timeline
of steps and their nested slices per thread and stream, memory and counter curves, and derived
metrics and tuning candidates where the run has them. It makes no network request.

RUN is a run directory, or the name of one under --dir; by default the newest there. The
report is written to
RUN/report.html unless -o says otherwise.

\b
Examples:
  dlprof report                        # newest run, into its directory
  dlprof report RUN -o report.html
"""


@click.command("report", help=HELP)
@run_argument
@output_option("Where to write the HTML (default: RUN/report.html).",
               click.Path(dir_okay=False, path_type=Path))
@runs_dir_option
@engine_option
def command(run: str | None, output: Path | None) -> int:
    loaded = open_run(run)
    target = output if output is not None else loaded.path / "report.html"
    if target.parent and not target.parent.is_dir():
        raise UsageError(f"{target}: no such directory {target.parent}")
    console = Console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=console, transient=True, disable=not console.is_terminal) as progress:
        task = progress.add_task("report: reading the run", total=len(STAGES) + 2)
        advance = _advancer(progress, task)
        data = report_data(loaded, progress=advance)
        advance("rendering")
        page = render_report(data)
        advance("writing")
        try:
            write_text(target, page)
        except OSError as error:
            raise UsageError(f"{target}: cannot write the report ({error.strerror or error})") from None
    click.echo(printable(target))
    print(f"dlprof: report of {printable(loaded.path.name)} ({loaded.status}): {len(page.encode('utf-8')) / 1e6:.1f} MB",
          file=sys.stderr)
    return 0


def _advancer(progress: Progress, task: TaskID) -> Callable[[str], None]:
    """A callback that moves the bar one stage on and names the stage starting."""
    started = [False]

    def advance(stage: str) -> None:
        progress.update(task, advance=1 if started[0] else 0, description=f"report: {stage}")
        started[0] = True

    return advance
