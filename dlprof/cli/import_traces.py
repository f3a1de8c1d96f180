"""``dlprof import``: PyTorch profiler (Kineto) and other Chrome traces, and TensorFlow's and
JAX's XPlane profiles, into a run directory."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click
from rich.progress import BarColumn, DownloadColumn, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from dlprof.cli.common import UsageError, output_option, progress_bar, runs_dir, runs_dir_option
from dlprof.importers.lean_arrow import hand_back_freed_memory, skip_pandas_check
from dlprof.text import printable

HELP = """Import trace files into a run, so every dlprof command works on them.

Takes PyTorch profiler traces (Kineto's Chrome JSON, .json or .json.gz), any other Chrome
trace (best effort: slices, counters, flows), torch's raw memory timelines
(export_memory_timeline_raw), PyTorch CUDA memory snapshots (torch.cuda.memory._dump_snapshot,
read without running any code the pickle names), and the XPlane profiles TensorFlow's and JAX's profilers write
(plugins/profile/<time>/<host>.xplane.pb). Several files become the ranks of one run, numbered
by their distributedInfo.rank or, failing that, by their order here.

\b
Examples:
  dlprof import trace.json.gz                       # -> ./dlprof-runs/<time>-trace
  dlprof import --dir runs trace.json.gz            # -> runs/<time>-trace
  dlprof import -o runs/job rank0.json rank1.json   # two ranks, one run
  dlprof import trace.json && dlprof top --kind kernel
  dlprof import logs/plugins/profile/*/host.xplane.pb && dlprof top --kind module
  dlprof import snapshot.pickle -o runs/oom && dlprof memory runs/oom
"""


@click.command("import", help=HELP)
@click.argument("traces", nargs=-1, required=True, type=click.Path(path_type=Path))
@output_option("Run directory to create (default: <time>-<first file> under --dir).",
               click.Path(file_okay=False, path_type=Path), hidden_aliases=("--out",))
@runs_dir_option
def command(traces: tuple[Path, ...], output: Path | None) -> int:
    stem = traces[0].name.split(".")[0] or "trace"
    run_dir = output or runs_dir() / f"{time.strftime('%Y%m%d-%H%M%S')}-{stem}"
    if run_dir.exists() and any(run_dir.iterdir()):
        raise UsageError(f"{run_dir}: already exists and is not empty; choose another -o")
    skip_pandas_check()  # the import makes no DataFrame
    hand_back_freed_memory()  # what a piece freed goes back, not kept for the next
    from dlprof.importers.trace_file import TraceImportError, dropped_text, import_traces

    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
               TransferSpeedColumn(), TimeRemainingColumn())
    with progress_bar(*columns) as bar:
        task = bar.add_task("importing", total=None)

        def report(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        try:
            manifest = import_traces(list(traces), run_dir, command=list(sys.argv), progress=report)
        except TraceImportError as error:
            raise UsageError(str(error)) from None
    events = sum(manifest.counts.values())
    changed = ", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in manifest.normalised.items())
    print(f"imported {len(traces)} file(s), {events} events, ranks {manifest.ranks}: {printable(run_dir)}")
    if changed:
        print(f"normalised to nest: {changed}")
    if manifest.dropped:
        print(f"dropped as damaged: {dropped_text(manifest.dropped)}")
    return 0
