"""What several subcommands share: finding the run they act on, its options, and their errors.

Options every command spells alike are defined here once (``--dir``, ``--rank``, ``-o/--output``,
``--engine``) and in :mod:`dlprof.cli.table_options` (what table commands share). An option or a
value renamed for consistency keeps its old spelling as a hidden alias (:class:`AliasedOption`,
:class:`AliasedChoice`): scripts written for it keep working, and help shows only the new one.

    @click.command("top")
    @run_argument
    @rank_option
    @runs_dir_option
    def command(run: str | None, rank: int | None) -> int:
        loaded = open_run(run)  # RUN, else the newest run under --dir
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from dlprof.config import RUNS_DIR
from dlprof.engine import ENGINE_VARIABLE, choose_engine
from dlprof.keys import EngineKind
from dlprof.store.catalog import without_run_path
from dlprof.store.manifest import MANIFEST_NAME, Manifest
from dlprof.store.reader import Run, RunError, load
from dlprof.viewers.screen import printable

if TYPE_CHECKING:
    from rich.progress import Progress, ProgressColumn


class UsageError(Exception):
    """Bad input from the user; main() prints it as one line and exits non-zero."""


def runs_dir() -> Path:
    """The directory of runs this command was given with ``--dir``, else ./dlprof-runs: where
    commands without RUN find the newest run, and RUN names a run by name."""
    context = click.get_current_context(silent=True)
    chosen = context.meta.get(_RUNS_DIR_KEY) if context is not None else None
    return chosen if isinstance(chosen, Path) else RUNS_DIR


def newest_run(parent: Path | None = None) -> Run:
    """The most recently started run under ``parent`` whose manifest reads.

    Newer runs that cannot be loaded are passed over, and named in one line on stderr, so that
    one damaged run never hides the others.

    Args:
        parent: the directory holding run directories (default: :func:`runs_dir`).

    Returns:
        The loaded run.

    Raises:
        RunError: ``parent`` holds no run, or none that loads.
    """
    parent = runs_dir() if parent is None else parent
    runs = [p for p in parent.glob("*") if (p / MANIFEST_NAME).is_file()] if parent.is_dir() else []
    if not runs:
        raise RunError(
            f"no runs under {_shown_dir(parent)}; profile a program first: dlprof run script.py"
        )
    skipped: list[str] = []
    for run_dir in sorted(runs, key=_started, reverse=True):
        try:
            run = load(run_dir)
        except RunError as error:
            skipped.append(f"{run_dir.name} ({without_run_path(str(error), run_dir)})")
            continue
        if skipped:
            print(printable(f"dlprof: using {run_dir.name}; skipped {len(skipped)} newer unreadable "
                            f"run{'s' if len(skipped) > 1 else ''}: {'; '.join(skipped)}"), file=sys.stderr)
        return run
    raise RunError(f"no readable run under {_shown_dir(parent)}; {len(skipped)} unreadable: {'; '.join(skipped)}")


def _shown_dir(parent: Path) -> str:
    """A directory of runs as a person typed it: ./dlprof-runs for a relative one."""
    return str(parent) if parent.is_absolute() else f"./{parent}"


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


def open_run(path: str | None, note_unfinished: bool = True) -> Run:
    """The run at ``path`` (a directory, or the name of one under the runs directory, ``--dir``),
    or the newest one there when no path is given. Reading never writes: saves a killed run left
    unfinished are said once (``dlprof finish`` makes them final)."""
    if not path:
        run = newest_run()
    else:
        named = runs_dir() / path
        run = load(named if not Path(path).exists() and (named / MANIFEST_NAME).is_file() else Path(path))
    if note_unfinished:
        _note_unfinished_saves(run)
    return run


def _note_unfinished_saves(run: Run) -> None:
    from dlprof.keys import RunStatus
    from dlprof.store.save_jobs import pending_ranks

    if run.status is RunStatus.RUNNING:
        return  # a live writer is still finishing its saves
    left = sum(pending.left() for pending in pending_ranks(run.path))
    if left:
        who = "its killed processes" if run.status is RunStatus.KILLED else "its processes"
        print(f"dlprof: {printable(str(run.path))}: {left} save(s) {who} left are not final, "
              f"so the profilers' traces they hold are not read; `dlprof finish {printable(str(run.path))}` "
              "makes them final", file=sys.stderr)


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


class AliasedOption(click.Option):
    """An option that also answers to older names, which its help leaves out.

    ``click.option("-o", "--output", cls=AliasedOption, hidden_aliases=("--out",))`` parses
    ``--out DIR`` as ``--output DIR``; ``--help`` shows ``-o, --output``.
    """

    def __init__(self, param_decls: Sequence[str], hidden_aliases: Sequence[str] = (), **attrs: Any) -> None:
        super().__init__([*param_decls, *hidden_aliases], **attrs)
        self.hidden_aliases = tuple(hidden_aliases)

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        every = self.opts
        self.opts = [name for name in every if name not in self.hidden_aliases]
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts = every


class AliasedChoice(click.Choice[str]):
    """A choice that also takes older names of its values, which help leaves out: ``--format
    text`` is ``--format table`` where ``text`` was once the name."""

    def __init__(self, choices: Sequence[str], aliases: Mapping[str, str] | None = None) -> None:
        super().__init__(list(choices), case_sensitive=False)
        self.aliases = {old.lower(): new for old, new in (aliases or {}).items()}

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        if isinstance(value, str) and value.lower() in self.aliases:
            value = self.aliases[value.lower()]
        chosen: str = super().convert(value, param, ctx)
        return chosen


run_argument = click.argument("run", required=False, metavar="[RUN]")

# Where ``--dir`` leaves the runs directory for :func:`runs_dir` (the invocation's shared meta,
# so a command run in-process after another never inherits it).
_RUNS_DIR_KEY = "dlprof.runs_dir"


def _keep_runs_dir(context: click.Context, _parameter: click.Parameter, value: Path | None) -> None:
    if value is not None:
        context.meta[_RUNS_DIR_KEY] = value


# --dir on every command that finds runs by name or takes the newest, or makes one: the
# directory they are in.
runs_dir_option = click.option(
    "--dir", "runs_directory", type=click.Path(file_okay=False, path_type=Path), default=None,
    expose_value=False, callback=_keep_runs_dir, is_eager=True, metavar="DIRECTORY",
    help=f"Directory of runs: where the newest is found, RUN names one, and new runs go. [default: {RUNS_DIR}]")

def within_option(what: str) -> Callable[..., Any]:
    """``--within NAME``: only what lies inside a slice of that name (a region such as train or
    eval, a step), on every command that can cut a run so.

    Args:
        what: what is kept, as the help's subject ("Only ops", "Only the steps").
    """
    return click.option("--within", default=None, metavar="NAME",
                        help=f"{what} inside a slice of this name: a region (train, eval), a step.")


# --rank on every command that can show one rank of a job alone.
rank_option = click.option("--rank", type=click.IntRange(min=0), default=None, metavar="N",
                           help="Only this rank of a job (default: every rank).")


def output_option(help_text: str, path_type: click.Path, hidden_aliases: Sequence[str] = ()) -> Callable[..., Any]:
    """``-o/--output PATH``, for every file or directory a command writes.

    Args:
        help_text: what is written there, and where it goes without the option.
        path_type: what the path may be (a file, a directory).
        hidden_aliases: older names the option still answers to (``--out``).

    Returns:
        The click decorator; the value reaches the command as ``output``.
    """
    return click.option("-o", "--output", "output", cls=AliasedOption, hidden_aliases=hidden_aliases,
                        type=path_type, default=None, help=help_text)


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
