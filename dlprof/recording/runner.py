"""``dlprof run``: execute a script or module as ``__main__`` inside a session.

The target sees what ``python script.py args`` would give it: ``sys.argv``, ``sys.path[0]`` (the
script's directory, or the working directory for ``-m``), ``__name__ == "__main__"``. Its exit
code passes through; an exception prints its traceback as Python would (without dlprof's frames)
and the run is saved as ``failed``; Ctrl-C and SIGTERM save it as ``interrupted``.
"""

from __future__ import annotations

import importlib.util
import os
import runpy
import signal
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from dlprof.config import ProfileConfig
from dlprof.keys import SeriesSource
from dlprof.recording.failures import say_stopped, source_stopped_reason
from dlprof.recording.session import Session
from dlprof.recording.sigterm import Interrupted
from dlprof.store.manifest import Manifest
from dlprof.support.mllog import MllogEvent, tee_mllog


class TargetError(Exception):
    """The script or module to run cannot be found."""


@dataclass(frozen=True)
class Target:
    """What to run: a script path or a module name, and its arguments."""

    name: str
    is_module: bool
    args: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """A short name for the run directory."""
        if self.is_module:
            return self.name.rsplit(".", 1)[-1]
        return Path(self.name).stem

    def check(self) -> None:
        """Raise :class:`TargetError` if the target does not exist."""
        if self.is_module:
            # Looked up where it will run from: the working directory first, as python -m has it.
            with _path0(os.getcwd()):
                try:
                    found = importlib.util.find_spec(self.name) is not None
                except (ImportError, ValueError):
                    found = False
            if not found:
                raise TargetError(f"no module named {self.name!r}")
            return
        path = Path(self.name)
        if path.is_dir():
            if not (path / "__main__.py").is_file():  # python runs a directory's __main__.py
                raise TargetError(f"{self.name}: a directory with no __main__.py, not a script")
        elif not path.exists():
            raise TargetError(f"{self.name}: no such file")
        elif not path.is_file():
            raise TargetError(f"{self.name}: not a regular file")


@dataclass(frozen=True)
class Outcome:
    """How the profiled program ended."""

    exit_code: int
    manifest: Manifest
    run_dir: Path
    signum: int | None = None  # the signal that interrupted it, to re-raise on exit


def run_target(
    target: Target, config: ProfileConfig, report: Callable[[str], None] | None = None
) -> Outcome:
    """Run ``target`` under a session configured by ``config``; never raises for its errors.

    Args:
        target: the script or module and its arguments.
        config: the session's settings.
        report: told which phase of saving the run begins, once the target has ended.
    """
    target.check()
    session = Session(config)
    saved_argv, saved_path0 = list(sys.argv), sys.path[0] if sys.path else None
    error: BaseException | None = None
    exit_code = 0
    signum: int | None = None
    # The program's globals are kept until the session has stopped: torch's Python tracer names
    # frames (with_stack) from code objects it holds no reference to, so the functions of a
    # program torn down before then would be named "unknown", or worse.
    program_globals: dict[str, object] = {}
    session.start()
    try:
        # MLPerf's ``:::MLLOG`` lines the program prints become series rows (support/mllog.py).
        with tee_mllog(lambda event: _record_mllog(session, event), _stop_reading_mllog(session)):
            if target.is_module:
                sys.argv = [target.name, *target.args]
                _set_path0(os.getcwd())
                program_globals = runpy.run_module(target.name, run_name="__main__", alter_sys=True)
            else:
                script = os.path.abspath(target.name)
                sys.argv = [target.name, *target.args]
                _set_path0(os.path.dirname(os.path.realpath(script)))
                program_globals = runpy.run_path(target.name, run_name="__main__")
    except SystemExit as exit_request:
        exit_code = _exit_code(exit_request)
        error = exit_request if exit_code else None
    except KeyboardInterrupt as interrupt:
        error, signum = interrupt, signal.SIGINT
        exit_code = 128 + signal.SIGINT
    except Interrupted as interrupt:
        error, signum = interrupt, interrupt.signum
        exit_code = 128 + interrupt.signum
    except BaseException as failure:  # noqa: BLE001  the script's own error: report it as Python would
        error = failure
        exit_code = 1
        _print_user_traceback(failure)
    finally:
        sys.argv = saved_argv
        if saved_path0 is not None:
            sys.path[0] = saved_path0
        else:
            sys.path[:1] = []
        manifest = session.stop(error, exit_code, report)
        program_globals.clear()
        if session.forks.in_child:
            # A child the program forked that ended here (sys.exit, the end of the script):
            # what follows is the parent's. Leave as multiprocessing's children do, without the
            # static destructors that hang a forked copy of torch.profiler's process.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(exit_code)
    return Outcome(exit_code, manifest, session.run_dir, signum)


def _record_mllog(session: Session, event: MllogEvent) -> None:
    """An MLPerf line as a series row at the line's own time: numbers and interval marks
    (run_start, eval_stop...); settings given as text (the benchmark's name) are left out."""
    if event.value is not None or event.interval:
        split = "eval" if event.key.startswith("eval") else "train"
        session.log(SeriesSource.MLPERF, split, [(event.key, event.value)], epoch=event.epoch,
                    samples=event.samples, ts_ns=event.time_ns)


def _stop_reading_mllog(session: Session) -> Callable[[BaseException], None]:
    """What the MLPerf line reader does when it fails: says so once (stdout's and stderr's
    readers stop alike) and reads no more; the program's output goes on."""
    said: list[str] = []

    def failed(failure: BaseException) -> None:
        if not said:
            said.append(source_stopped_reason("MLPerf log reader", "a line the program printed", failure,
                                              session.step_number))
            say_stopped(said[0], session.manifest.degraded)

    return failed


def _set_path0(directory: str) -> None:
    """Make ``directory`` the first entry of ``sys.path``, as Python makes a script's own."""
    if sys.path:
        sys.path[0] = directory
    else:
        sys.path.append(directory)


@contextmanager
def _path0(directory: str) -> Iterator[None]:
    """``directory`` first on ``sys.path`` within the block."""
    saved = list(sys.path)
    _set_path0(directory)
    try:
        yield
    finally:
        sys.path[:] = saved


def _exit_code(exit_request: SystemExit) -> int:
    """What the interpreter would exit with for this ``sys.exit()``."""
    code = exit_request.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _print_user_traceback(error: BaseException) -> None:
    """Print the traceback from the first frame outside dlprof and runpy."""
    tb: TracebackType | None = error.__traceback__
    while tb is not None and _is_ours(str(tb.tb_frame.f_globals.get("__name__", ""))):
        tb = tb.tb_next
    traceback.print_exception(type(error), error, tb)


def _is_ours(module: str) -> bool:
    return module == "runpy" or module == "dlprof" or module.startswith("dlprof.")
