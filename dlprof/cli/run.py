"""``dlprof run``: profile a Python script or module, then print where the run is and its top ops."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import click

from dlprof.cli.common import UsageError, output_option, runs_dir, runs_dir_option
from dlprof.cli.table_options import limit_option
from dlprof.config import RUNS_DIR
from dlprof.keys import RunStatus
from dlprof.text import printable

# Everything else is imported when the command runs: `dlprof --help` loads this module too.

# The exit status under --strict of a run saved as degraded by a script that exited 0.
STRICT_DEGRADED_EXIT = 3

HELP = """Run a Python script (or -m module) under the profiler.

The script runs as `python script.py args` would run it; its exit code passes through. The run
is written to -o DIR, by default <YYYYmmdd-HHMMSS>-<script>/ under --dir (./dlprof-runs), even if the script
fails or is interrupted. A DIR that already holds a run is refused unless --force (which
replaces it); one that holds other files is always refused.

\b
Examples:
  dlprof run train.py --epochs 1
  dlprof run -o runs/base --schedule 1,1,1,5,1 train.py
  dlprof run -o runs/base --force train.py     # replace the run in runs/base
  dlprof run --collectors layers train.py     # per-layer time only, lowest overhead
  dlprof run -m mypkg.train --lr 0.1
  dlprof run --counters task-clock,page-faults train.py   # CPU counters per step and region
  dlprof run --with-stack train.py             # Python stacks of ops, for dlprof tree --view code
  dlprof run --memory-cap 256 --save-seconds 5 long_job.py   # tighter bounds on a long run
  dlprof run -n 5 train.py                     # print the 5 most expensive ops at the end (0: none)
  dlprof run --dir runs train.py               # -> runs/<time>-train; then dlprof top --dir runs
  dlprof run --nproc 2 ddp_train.py            # two ranks (torchrun), one run directory
  torchrun --nproc-per-node 2 -m dlprof run ddp_train.py   # the same, started by torchrun
  dlprof run --strict --collectors torch,cupti train.py   # a collector that cannot record is an error

A run whose recording is not whole (a collector asked for that cannot run here, one that could
not start or stopped recording) is saved as degraded, and a warning saying why is the last line.
With --strict that is an error: before the script starts where it is known then (exit 2,
nothing written), else once the run is saved (exit 3, unless the script's own exit code is not 0).

Under torchrun every rank writes its own partition of one run directory: -o DIR, or the
DLPROF_RUN_DIR variable, or a name every rank derives from the launcher (pid and start time).
"""


class _SavingStatus:
    """A spinner on stderr while the run is saved (nothing shows while the script runs).

    Its refresh runs on a thread of dlprof's own name (``dlprof-status``): rich's own refresh
    thread is named like the program's (``Thread-1``), and the torch collector, which notes the
    threads the program starts, would count it as one of them.
    """

    REFRESH_S = 0.08  # the spinner's frame rate, as rich's status spinner

    def __init__(self) -> None:
        from rich.console import Console

        self._console = Console(stderr=True)
        self._live: Any = None
        self._spinner: Any = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def update(self, phase: str) -> None:
        from rich.live import Live
        from rich.spinner import Spinner

        if self._live is None:
            self._spinner = Spinner("dots", text=phase)
            self._live = Live(self._spinner, console=self._console, transient=True, auto_refresh=False)
            self._live.start()
            self._thread = threading.Thread(target=self._refresh, name="dlprof-status", daemon=True)
            self._thread.start()
        else:
            self._spinner.update(text=phase)
            self._live.refresh()

    def _refresh(self) -> None:
        while not self._stopping.wait(self.REFRESH_S):
            self._live.refresh()

    def __enter__(self) -> _SavingStatus:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
        if self._live is not None:
            self._live.stop()


def rank_table_state(rank: int, rank_status: RunStatus, job_status: RunStatus) -> str:
    """What the title of one rank's end-of-run table says of the job.

    A rank prints as soon as its own part is saved; the job reads ``running`` until every rank
    has saved, so saying ``running`` alone would be untrue of the rank shown.
    """
    job = "other ranks still saving" if job_status is RunStatus.RUNNING else f"job {job_status}"
    return f"rank {rank} {rank_status}; {job}"


def _print_top(run_dir: Path, collectors: tuple[str, ...], rows: int, rank: int | None = None,
               rank_status: RunStatus | None = None) -> None:
    from dlprof.cli.top import print_top
    from dlprof.keys import GroupKey
    from dlprof.store.reader import load

    try:
        loaded = load(run_dir)
        state = None if rank is None or rank_status is None else rank_table_state(rank, rank_status, loaded.status)
        print_top(loaded, kind="op" if {"torch", "tensorflow"} & set(collectors) else "module",
                  by=None, group_by=GroupKey.NAME, limit=rows, rank=rank, state=state)
    except UsageError as error:
        print(f"dlprof: {printable(str(error))}", file=sys.stderr)


def _default_run_dir(label: str, shared: bool) -> Path | None:
    """The run directory under --dir when one was given, named as the session names it (one
    name every rank of a job derives alike when ``shared``); None leaves the session's own
    default (./dlprof-runs)."""
    if runs_dir() == RUNS_DIR:
        return None
    from dlprof.distributed import shared_run_dir
    from dlprof.recording.session import new_run_dir

    return shared_run_dir(label, runs_dir()) if shared else new_run_dir(label, runs_dir())


def _launch(nproc: int, run_dir: Path, top_rows: int) -> int:
    """--nproc: the same command for every rank, less --nproc and the top table, via torchrun."""
    from dlprof.recording.launcher import LaunchError, launch_ranks
    from dlprof.store.reader import RunError, load

    context = click.get_current_context()
    args: list[str] = []
    for param in context.command.params:
        value = context.params.get(param.name or "")
        if not isinstance(param, click.Option) or param.name in ("nproc", "limit", "output", "force"):
            continue
        if param.is_flag:
            args += [param.opts[0]] if value else []
        elif value is not None and value != param.default:
            args += [param.opts[-1], str(value)]
    args += ["--limit", "0", *context.params["target_and_args"]]
    try:
        torchrun_code = launch_ranks(nproc, run_dir, args)
    except LaunchError as error:
        raise UsageError(str(error)) from None
    try:
        _record_job_command(run_dir)
        loaded = load(run_dir)
    except RunError as error:
        print(f"dlprof: {printable(str(error))}", file=sys.stderr)
        return torchrun_code or 1
    manifest = loaded.manifest
    detail = f": {manifest.error}" if manifest.error else ""
    print(f"dlprof: run {loaded.status} ({len(manifest.ranks)} ranks, "
          f"{sum(manifest.counts.values())} events){printable(detail)}: {printable(run_dir)}", file=sys.stderr)
    if top_rows and manifest.counts.get("slices"):
        collectors = tuple(info.name for info in manifest.collectors if info.active)
        _print_top(run_dir, collectors, top_rows)
    # The failing rank's own exit code, where torchrun only says that one failed.
    exit_code = manifest.exit_code or torchrun_code
    if manifest.degraded:
        _warn_degraded(manifest.degraded, run_dir, "")
        if context.params["strict"] and exit_code == 0:
            exit_code = STRICT_DEGRADED_EXIT
    return exit_code


def _prepare_out(out: Path, force: bool) -> None:
    """Refuse an -o that holds a run (unless --force, which removes it) or other files."""
    from dlprof.store.new_run import RunExistsError, prepare_run_dir

    try:
        prepare_run_dir(out, force)
    except RunExistsError as error:
        raise UsageError(str(error)) from None
    except OSError as error:
        raise UsageError(f"{out}: cannot replace the run ({error.strerror or error})") from None


def _record_job_command(run_dir: Path) -> None:
    """The job's manifest names the command the user typed, not torchrun's for each rank."""
    from dlprof.store.manifest import MANIFEST_NAME, Manifest
    from dlprof.store.reader import RunError

    if (run_dir / MANIFEST_NAME).is_file():
        try:
            job = Manifest.read(run_dir)
        except (OSError, ValueError, TypeError, KeyError) as error:
            raise RunError(f"{run_dir / MANIFEST_NAME}: unreadable manifest ({error})") from None
        job.command = list(sys.argv)
        job.write(run_dir)


def _counters(text: str | None) -> tuple[str, ...]:
    """Counter names; a name dlprof does not know at all is a usage error (exit 2), while a known
    counter that cannot be counted here is reported at start and the run goes on without it."""
    if text is None:
        return ()
    from dlprof.collectors.counters import known_counter
    from dlprof.support.perf_event import EVENTS

    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if not known_counter(n)]
    if not names or unknown:
        raise UsageError(f"--counters: unknown counter {', '.join(unknown) or '(none named)'}; "
                         f"see dlprof counters (known: {', '.join(EVENTS)}, PAPI_* presets)")
    return names


def _collectors(text: str | None) -> tuple[str, ...] | None:
    """The collectors named, each checked; None for the default set."""
    from dlprof.collectors.registry import UnknownCollectorError, collector_class

    if text is None:
        return None
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise UsageError("--collectors: name at least one collector")
    for name in names:
        try:
            collector_class(name)
        except UnknownCollectorError as error:
            raise UsageError(f"--collectors: {error}") from None
    return names


class _CollectorsOption(click.Option):
    """--collectors, whose help names the collectors only when help is asked for (finding the
    default set imports every collector's module)."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        from dlprof.collectors.registry import default_collectors, selectable

        self.help = (f"Comma-separated collectors: {', '.join(selectable())}. "
                     f"Default: {','.join(default_collectors())} (each framework's collectors "
                     "start once the program imports it).")
        return super().get_help_record(ctx)


@click.command(
    "run",
    help=HELP,
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@output_option("Run directory to write (default: <time>-<script> under --dir).", click.Path(file_okay=False),
               hidden_aliases=("--out",))
@runs_dir_option
@click.option("--force", is_flag=True, help="Replace the run already in -o DIR.")
@click.option("-m", "module", default=None, metavar="MODULE",
              help="Run a library module as a script, as python -m does.")
@click.option("--collectors", cls=_CollectorsOption, default=None, metavar="NAME,...",
              help="Comma-separated collectors.")
@click.option("--schedule", default=None, metavar="SKIP,WAIT,WARMUP,ACTIVE,REPEAT",
              help="Profile only some steps, as torch.profiler.schedule (default: every step).")
@click.option("--no-auto-steps", is_flag=True,
              help="Do not end a step at each optimizer.step() or Keras fit batch; only "
                   "prof.step()/dlprof.step() do.")
@limit_option("Rows of the top-ops table printed at the end", hidden_aliases=("--top",))
@click.option("--counters", "counters", default=None, metavar="NAME,...",
              help="CPU counters per step and region (see dlprof counters); adds the counters collector.")
@click.option("--counter-scope", type=click.Choice(["thread", "process"]), default="thread",
              show_default=True, help="Count the thread that starts profiling, or every thread.")
@click.option("--with-stack", is_flag=True,
              help="Record the Python stack of every op (torch collector; costly), for dlprof tree --view code.")
@click.option("--save-seconds", type=click.FloatRange(min=0.1), default=None, metavar="S",
              help="Save at least this often, at step boundaries (without steps: where no layer or "
                   "region is open), whatever the pauses cost: a run killed loses what came since its "
                   "last save. Default: about every 10 s while those pauses stay under 2% of the run "
                   "(dlprof info says the longest stretch between saves).")
@click.option("--memory-cap", "memory_cap_mib", type=click.IntRange(min=16), default=None,
              metavar="MIB",
              help="What profiling may hold above the program's own memory: saves come before "
                   "dlprof's events would pass it, at step boundaries, inside a step only when "
                   "they cannot wait. Default: the smaller of 2048 and a tenth of this machine's memory.")
@click.option("--all-threads", is_flag=True,
              help="Record the torch ops of every Python thread, not only the main one's "
                   "(torch.profiler then records no allocations).")
@click.option("--nproc", type=click.IntRange(min=1), default=None, metavar="N",
              help="Start N ranks on this machine with torchrun (--standalone); one run for all.")
@click.option("--strict", is_flag=True,
              help="A collector that cannot record is an error, not a degraded run: exit 2 before the "
                   "script starts where that is known then, else exit 3 once the run is saved.")
@click.argument("target_and_args", nargs=-1, type=click.UNPROCESSED, metavar="SCRIPT [ARGS]...")
def command(output: str | None, force: bool, module: str | None, collectors: str | None, schedule: str | None,
            no_auto_steps: bool, limit: int, counters: str | None, counter_scope: str,
             with_stack: bool, save_seconds: float | None, memory_cap_mib: int | None, all_threads: bool,
             nproc: int | None, strict: bool, target_and_args: tuple[str, ...]) -> int:
    from dlprof.recording.runner import Target

    if module:
        target = Target(module, is_module=True, args=target_and_args)
    elif target_and_args:
        target = Target(target_and_args[0], is_module=False, args=target_and_args[1:])
    else:
        raise UsageError("dlprof run: name a script to run (dlprof run train.py) or -m module")
    from dlprof.config import ProfileConfig, default_memory_cap, save_limits
    from dlprof.distributed import RankEnvironment
    from dlprof.recording.collector_set import CollectorError
    from dlprof.recording.runner import TargetError, run_target
    from dlprof.recording.session import new_run_dir
    from dlprof.schedule import Schedule, ScheduleError

    chosen = _collectors(collectors)
    counter_names = _counters(counters)
    if with_stack and chosen is not None and "torch" not in chosen:
        raise UsageError("--with-stack: Python stacks come from the torch collector; add it to --collectors")
    try:
        parsed_schedule = Schedule.parse(schedule) if schedule else None
        target.check()
        place = RankEnvironment.from_environment()
    except (ScheduleError, TargetError, ValueError) as error:
        raise UsageError(str(error)) from None
    if output and not place.distributed:  # ranks of a job share -o: the launcher checked it
        _prepare_out(Path(output), force)
    if nproc is not None:
        return _launch(nproc, Path(output) if output else new_run_dir(target.label, runs_dir()), limit)
    seconds, pause_share = save_limits(save_seconds)
    config = ProfileConfig(
        rank=place.rank,
        world_size=place.world_size,
        out=Path(output) if output else _default_run_dir(target.label, place.world_size > 1),
        name=target.label,
        collectors=chosen,
        schedule=parsed_schedule,
        auto_steps=not no_auto_steps,
        counters=counter_names,
        counter_scope=counter_scope,
        with_stack=with_stack,
        all_threads=all_threads,
        save_seconds=seconds,
        pause_share=pause_share,
        memory_cap_bytes=memory_cap_mib << 20 if memory_cap_mib is not None else default_memory_cap(),
        command=tuple(sys.argv) if sys.argv and sys.argv[0] else ("dlprof", "run", target.name),
        strict=strict,
    )
    from dlprof.store.writer_lock import RunInUseError

    try:
        with _SavingStatus() as saving:
            outcome = run_target(target, config, saving.update)
    except CollectorError as error:  # --strict, before the script started
        raise UsageError(f"--strict: {error}; the script was not run") from None
    except RunInUseError as error:  # raised before the program starts: it never ran
        raise UsageError(str(error)) from None
    sys.stdout.flush()
    status = outcome.manifest.status
    who = f"rank {place.rank} of " if place.distributed else ""
    print(f"dlprof: {who}run {status} ({sum(outcome.manifest.counts.values())} events): {printable(outcome.run_dir)}",
          file=sys.stderr)
    # Under torchrun the other ranks may still be writing: rank 0 shows its own part only.
    if limit and outcome.signum is None and place.rank == 0:
        active = tuple(info.name for info in outcome.manifest.collectors if info.active)
        _print_top(outcome.run_dir, active, limit, rank=0 if place.distributed else None,
                   rank_status=status)
    exit_code = outcome.exit_code
    if outcome.manifest.degraded:
        _warn_degraded(outcome.manifest.degraded, outcome.run_dir, who)
        if strict and exit_code == 0:
            exit_code = STRICT_DEGRADED_EXIT
    if outcome.signum is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(outcome.signum, signal.SIG_DFL)
        os.kill(os.getpid(), outcome.signum)
    return exit_code


def _warn_degraded(degraded: list[str], run_dir: Path, who: str) -> None:
    """The last line of the output: the recording is not whole, and why (after the table, which
    a person would otherwise read as the whole profile)."""
    from dlprof.store.manifest import degraded_line

    sys.stdout.flush()
    print(f"dlprof: warning: {who}run degraded, recording not whole: {degraded_line(degraded)} ({run_dir})",
          file=sys.stderr)
    sys.stderr.flush()
