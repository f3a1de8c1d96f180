"""SIGTERM under a session: an exception in the main thread while the program runs, so that it
unwinds and the run is saved; held while the run is saved, then acted on. And the status a run
ends with, from what ended the program.

    guard = SigtermGuard()
    guard.install()      # at start: SIGTERM raises Interrupted in the main thread
    guard.hold()         # while saving: a SIGTERM waits
    guard.restore()      # the handler found at start is back; a held SIGTERM is sent again
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

from dlprof.keys import RunStatus


class Interrupted(BaseException):
    """Raised in the main thread when SIGTERM arrives, so the program unwinds and the run is saved."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


def _raise_interrupted(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signum)


class SigtermGuard:
    """The session's SIGTERM handling (only where the program left SIGTERM to its default)."""

    def __init__(self) -> None:
        self._previous: Callable[[int, FrameType | None], object] | int | None = None
        self._held = False

    def install(self) -> None:
        """Turn SIGTERM into an exception, so the program unwinds and the run is saved."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            self._previous = signal.signal(signal.SIGTERM, _raise_interrupted)

    def hold(self) -> None:
        """While the run is saved, a SIGTERM waits: a launcher stopping every rank after one
        failed (torchrun does) must not cut the others' saving short."""
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._note)

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self._held = True

    def restore(self) -> None:
        """Put back the handler found at start, then act on a SIGTERM held while saving."""
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None
        if self._held:
            self._held = False
            os.kill(os.getpid(), signal.SIGTERM)


def status_for(error: BaseException | None) -> RunStatus:
    """The run status that ending with ``error`` (None: normally) gives."""
    if error is None:
        return RunStatus.COMPLETE
    if isinstance(error, (KeyboardInterrupt, Interrupted)):
        return RunStatus.INTERRUPTED
    if isinstance(error, SystemExit) and error.code in (None, 0):
        return RunStatus.COMPLETE
    return RunStatus.FAILED
