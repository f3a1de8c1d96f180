"""``dlprof export``: write a run as a trace another tool opens (Perfetto, HTA, chrome://tracing)."""

from __future__ import annotations

from pathlib import Path

import click

from dlprof.cli.common import UsageError, open_run, output_option, progress_bar, run_argument, runs_dir_option
from dlprof.exporters.base import Exporter, ExportError
from dlprof.exporters.chrome import ChromeExporter
from dlprof.exporters.registry import (
    BY_FORMAT,
    FORMAT_NAMES,
    UnknownFormatError,
    exporter_for_format,
    exporter_for_path,
)
from dlprof.text import printable

DEFAULT_FORMAT = "chrome"
_NAME_WIDTH = max(len(name) for name in BY_FORMAT)
_EXTENSION_WIDTH = max(len(cls.file_extension) for cls in BY_FORMAT.values())

HELP = f"""Export a run as a trace file for a timeline viewer or a trace analyser.

\b
Formats (and the extension that picks each when --format is left out):
{chr(10).join(f"  {n:<{_NAME_WIDTH}}  {c.file_extension:<{_EXTENSION_WIDTH}}  {c.description}" for n, c in BY_FORMAT.items())}

RUN is a run directory, or the name of one under --dir; by default the newest there. With
neither --format nor
-o the format is {DEFAULT_FORMAT}. Without -o the trace goes into the run
directory as trace.<ext>. A Chrome export of a run with several ranks writes one file per
rank beside -o, NAME.rankN.json (Holistic Trace Analysis reads a directory of them), or with
--merged one file holding every rank. A Perfetto export is always one timeline of the whole
job: a group of tracks per rank, every rank on rank 0's clock. The written paths are printed,
one per line.

\b
Examples:
  dlprof export                                  # newest run -> <run>/trace.json
  dlprof export RUN -o cnn.perfetto-trace        # native Perfetto; open in ui.perfetto.dev
  dlprof export RUN -f perfetto                  # -> RUN/trace.perfetto-trace
  dlprof export RUN -f tau -o profiles.tau       # TAU profile directory (pprof, ParaProf)
  dlprof export RUN -o traces/train.json         # Kineto layout, for Holistic Trace Analysis
  dlprof export RUN -o job.json --merged         # every rank in one Chrome trace
"""


@click.command("export", help=HELP)
@run_argument
@click.option("-f", "--format", "fmt", type=click.Choice(FORMAT_NAMES, case_sensitive=False),
              default=None, help="Trace format (default: from -o's extension, else chrome).")
@output_option("File to write (default: trace.<ext> inside the run directory).", click.Path())
@click.option("--merged", is_flag=True, default=False,
              help="Chrome: every rank in one file (default: one file per rank, as HTA reads them).")
@runs_dir_option
def command(run: str | None, fmt: str | None, output: str | None, merged: bool) -> int:
    loaded = open_run(run)
    exporter = _exporter(fmt, output)
    if merged:
        if not isinstance(exporter, ChromeExporter):
            raise UsageError(f"--merged is for the chrome format ({exporter.format_name} writes one file already)")
        exporter = ChromeExporter(merged=True)
    path = Path(output) if output else loaded.path / f"trace{exporter.file_extension}"
    try:
        with progress_bar() as progress:
            written = exporter.export(loaded, path, progress)
    except ExportError as error:
        raise UsageError(str(error)) from None
    except OSError as error:
        raise UsageError(f"{path}: cannot write ({error.strerror or error})") from None
    for written_path in written:
        click.echo(printable(written_path))
    return 0


def _exporter(fmt: str | None, output: str | None) -> Exporter:
    """The exporter asked for by --format, else by -o's extension, else the default."""
    try:
        if fmt is not None:
            return exporter_for_format(fmt)()
        if output is not None:
            return exporter_for_path(Path(output))()
        return exporter_for_format(DEFAULT_FORMAT)()
    except UnknownFormatError as error:
        raise UsageError(f"-o {output}: {error}; or name one with --format") from None
