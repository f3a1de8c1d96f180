"""What several subcommands share: finding the run they act on, and their errors."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from dlprof.config import RUNS_DIR
from dlprof.engine import ENGINE_VARIABLE, choose_engine
from dlprof.keys import EngineKind
from dlprof.store.catalog import without_run_path
from dlprof.store.manifest import MANIFEST_NAME, Manifest
from dlprof.store.reader import Run, RunError, load

if TYPE_CHECKING:
    from rich.progress import Progress, ProgressColumn


class UsageError(Exception):
    """Bad input from the user; main() prints it as one line and exits non-zero."""


def newest_run(parent: Path = RUNS_DIR) -> Run:
    """The most recently started run under ``parent`` whose manifest reads.

    Newer runs that cannot be loaded are passed over, and named in one line on stderr, so that
    one damaged run never hides the others.

    Args:
        parent: the directory holding run directories.

    Returns:
        The loaded run.

    Raises:
        RunError: ``parent`` holds no run, or none that loads.
    """
    runs = [p for p in parent.glob("*") if (p / MANIFEST_NAME).is_file()] if parent.is_dir() else []
    if not runs:
        raise RunError(
            f"no runs under ./{parent}; profile a program first: dlprof run script.py"
        )
    skipped: list[str] = []
    for run_dir in sorted(runs, key=_started, reverse=True):
        try:
            run = load(run_dir)
        except RunError as error:
            skipped.append(f"{run_dir.name} ({without_run_path(str(error), run_dir)})")
            continue
        if skipped:
            print(f"dlprof: using {run_dir.name}; skipped {len(skipped)} newer unreadable "
                  f"run{'s' if len(skipped) > 1 else ''}: {'; '.join(skipped)}", file=sys.stderr)
        return run
    raise RunError(f"no readable run under ./{parent}; {len(skipped)} unreadable: {'; '.join(skipped)}")


def _started(run_dir: Path) -> tuple[int, str]:
    """When a run started (as ``dlprof ls`` orders them); its manifest's age if unreadable."""
    try:
        start = Manifest.read(run_dir).start_ns
    except (OSError, ValueError, TypeError, KeyError):
        start = 0
    try:
        return start or (run_dir / MANIFEST_NAME).stat().st_mtime_ns, run_dir.name
    except OSError:
        return 0, run_dir.name  # removed since it was listed


def open_run(path: str | None) -> Run:
    """The run at ``path`` (a directory, or the name of one under ./dlprof-runs), or the newest
    one under ./dlprof-runs when no path is given; saves a killed run left unfinished are
    finished first (once), so that what they hold is read."""
    if not path:
        run = newest_run()
    else:
        named = RUNS_DIR / path
        run = load(named if not Path(path).exists() and (named / MANIFEST_NAME).is_file() else Path(path))
    return _with_saves_finished(run)


def _with_saves_finished(run: Run) -> Run:
    from dlprof.keys import RunStatus
    from dlprof.store.layout import PENDING

    if run.status is not RunStatus.KILLED or not (run.path / PENDING).is_dir():
        return run
    from dlprof.importers.finisher import finish_pending  # Arrow and the importers: only here

    finished = finish_pending(run.path)
    if finished:
        print(f"dlprof: {run.path}: finished {finished} save(s) its killed processes left", file=sys.stderr)
        return load(run.path)
    return run


def check_rank(run: Run, rank: int | None) -> None:
    """Fail with one line naming the run's ranks when ``rank`` (if given) is not one of them."""
    if rank is None:
        return
    ranks = run.ranks()
    if rank not in ranks:
        raise UsageError(f"{run.path}: no rank {rank}; this run has ranks: {', '.join(map(str, ranks)) or 'none'}")


class FiniteFloatRange(click.FloatRange):
    """A click float range that also refuses nan and ±inf, which compare false with any bound
    (``--timeout nan`` would pass ``min=0`` and then never time out)."""

    name = "finite float range"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return float(number)


run_argument = click.argument("run", required=False, metavar="[RUN]")


def _choose_engine(_context: click.Context, _parameter: click.Parameter, value: str | None) -> None:
    choose_engine(value)


# --engine on every command that reads a run: the engine of the runs it loads.
engine_option = click.option(
    "--engine", type=click.Choice([str(k) for k in EngineKind], case_sensitive=False), default=None,
    expose_value=False, callback=_choose_engine, is_eager=True,
    help=f"Query engine: duckdb (embedded, the default) or spark (Apache Spark, master from its own "
         f"configuration). Default: ${ENGINE_VARIABLE}, else duckdb.")

def progress_bar(*columns: ProgressColumn) -> Progress:
    """A transient progress bar on stderr (stdout stays for results), shown only on a terminal:
    off one, rich would leave a blank line behind. Without ``columns``: a description, a bar,
    done of total, and the time elapsed."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    shown = columns or (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    return Progress(*shown, console=console, transient=True, disable=not console.is_terminal)
