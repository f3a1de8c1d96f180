"""What several subcommands share: finding the run they act on, and their errors."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)

from dlprof.config import RUNS_DIR
from dlprof.store.manifest import MANIFEST_NAME, Manifest
from dlprof.store.reader import Run, RunError, load


class UsageError(Exception):
    """Bad input from the user; main() prints it as one line and exits non-zero."""


def newest_run(parent: Path = RUNS_DIR) -> Path:
    """The most recently started run under ``parent``."""
    runs = [p for p in parent.glob("*") if (p / MANIFEST_NAME).is_file()] if parent.is_dir() else []
    if not runs:
        raise RunError(
            f"no runs under ./{parent}; profile a program first: dlprof run script.py"
        )
    return max(runs, key=_started)


def _started(run_dir: Path) -> tuple[int, str]:
    """When a run started (as ``dlprof ls`` orders them); its manifest's age if unreadable."""
    try:
        start = Manifest.read(run_dir).start_ns
    except (OSError, ValueError, TypeError, KeyError):
        start = 0
    return start or (run_dir / MANIFEST_NAME).stat().st_mtime_ns, run_dir.name


def open_run(path: str | None) -> Run:
    """The run at ``path`` (a directory, or the name of one under ./dlprof-runs), or the newest
    one under ./dlprof-runs when no path is given."""
    if not path:
        return load(newest_run())
    named = RUNS_DIR / path
    if not Path(path).exists() and (named / MANIFEST_NAME).is_file():
        return load(named)
    return load(Path(path))


def check_rank(run: Run, rank: int | None) -> None:
    """Fail with one line naming the run's ranks when ``rank`` (if given) is not one of them."""
    if rank is None:
        return
    ranks = sorted({int(r) for r in run.slices["rank"].unique()})
    if rank not in ranks:
        raise UsageError(f"{run.path}: no rank {rank}; this run has ranks: {', '.join(map(str, ranks)) or 'none'}")


run_argument = click.argument("run", required=False, metavar="[RUN]")

ROW_COLUMNS = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())


def progress_bar(*columns: ProgressColumn) -> Progress:
    """A transient progress bar on stderr (stdout stays for results), shown only on a terminal:
    off one, rich would leave a blank line behind."""
    console = Console(stderr=True)
    return Progress(*(columns or ROW_COLUMNS), console=console, transient=True,
                    disable=not console.is_terminal)
