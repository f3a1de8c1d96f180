"""``dlprof view``: open a run's timeline in the Perfetto UI, served from this machine only."""

from __future__ import annotations

import webbrowser
from pathlib import Path

import click
from rich.console import Console

from dlprof.cli.common import (
    FiniteFloatRange,
    UsageError,
    open_run,
    progress_bar,
    run_argument,
    runs_dir_option,
)
from dlprof.exporters.base import ExportError
from dlprof.exporters.perfetto import PerfettoExporter
from dlprof.store.manifest import MANIFEST_NAME
from dlprof.store.reader import Run
from dlprof.store.safe_files import not_a_file, os_error_text
from dlprof.text import printable
from dlprof.viewers.perfetto_ui import HOST, PERFETTO_PORT, ServeResult, TraceServer, serve_once

TRACE_NAME = f"trace{PerfettoExporter.file_extension}"

HELP = f"""Open a run's timeline in the Perfetto UI (ui.perfetto.dev).

Writes RUN/{TRACE_NAME} if it is missing or older than the run, serves that one file on
{HOST}:{PERFETTO_PORT} (loopback only; the only port the UI fetches from) and opens the UI
on it. The trace never leaves this machine: the UI, running in your browser, reads it from
the local server. dlprof exits once the UI has fetched the file, or on Ctrl-C.

RUN is a run directory, or the name of one under --dir; by default the newest there.

\b
Examples:
  dlprof view                      # newest run, in the default browser
  dlprof view RUN --no-browser     # print the URL; open it yourself
"""


@click.command("view", help=HELP)
@run_argument
@click.option("--no-browser", is_flag=True, help="Print the URL instead of opening a browser.")
@click.option("--port", type=click.IntRange(0, 65535), default=PERFETTO_PORT, show_default=True,
              help="Port on 127.0.0.1; ui.perfetto.dev only fetches from 9001, so another port "
                   "needs a self-hosted UI.")
@click.option("--timeout", type=FiniteFloatRange(min=0, min_open=True), default=None,
              help="Give up after this many seconds without a fetch (default: wait for Ctrl-C).")
@runs_dir_option
def command(run: str | None, no_browser: bool, port: int, timeout: float | None) -> int:
    loaded = open_run(run)
    trace = ensure_trace(loaded)
    console = Console(stderr=True, highlight=False, soft_wrap=True)

    def announce(server: TraceServer) -> None:
        # stdout carries the URL alone, for scripts and for a terminal that makes it clickable.
        click.echo(server.url)
        console.print(f"serving {printable(trace)} on {HOST}:{server.port} until the Perfetto UI fetches it "
                      "(Ctrl-C to stop)", markup=False)

    def open_in_browser(url: str) -> None:
        if not webbrowser.open(url):
            console.print("no browser could be started; open the URL above", markup=False)

    try:
        result = serve_once(trace, port, open_browser=None if no_browser else open_in_browser,
                            timeout=timeout, on_ready=announce)
    except OSError as error:
        # PortBusyError's message is already one line; other errors get their file and reason.
        raise UsageError(os_error_text(error)) from None
    if result is ServeResult.FETCHED:
        console.print(f"the Perfetto UI fetched {printable(trace.name)}; done", markup=False)
    elif result is ServeResult.TIMED_OUT:
        console.print(f"dlprof: nothing fetched {printable(trace.name)} within {timeout:g} s", markup=False)
    return int(result)


def ensure_trace(run: Run) -> Path:
    """The run's Perfetto trace, written (with a progress bar) if missing or older than the run.

    Args:
        run: the loaded run.

    Returns:
        The path of ``<run>/trace.perfetto-trace``.

    Raises:
        UsageError: the run holds nothing to show, or the trace cannot be written.
    """
    trace = run.path / TRACE_NAME
    if trace.is_symlink():  # a run travels: its trace may point anywhere on this machine
        raise UsageError(f"{printable(trace)}: a symbolic link; dlprof view serves the run's own trace "
                         "only (remove the link, and it is written anew)")
    what = not_a_file(trace)
    if what not in (None, "no such file"):
        raise UsageError(f"{printable(trace)}: {what}; dlprof view serves the run's own trace file only")
    if what is None and trace.stat().st_mtime_ns >= (run.path / MANIFEST_NAME).stat().st_mtime_ns:
        return trace
    # On stderr and transient, as `dlprof export` shows it: stdout is kept for the URL. Off a
    # terminal rich would still leave a blank line behind, so there is no bar at all.
    try:
        with progress_bar() as progress:
            PerfettoExporter().export(run, trace, progress)
    except ExportError as error:
        raise UsageError(str(error)) from None
    except OSError as error:
        raise UsageError(f"{trace}: cannot write ({os_error_text(error)})") from None
    return trace
