"""dlprof's own failures while the program runs: never the program's.

A save can fail (the disk is full, the run directory was removed, a collector's save raised), and
it fails inside the program's own call: the optimizer's step ends a step, a region's end makes a
waiting save, the watchdog saves between two bytecodes. None of that may raise into the program.
A method of the session that can fail so is marked::

    @stops_recording_on_failure
    def end_step(self) -> None: ...

and a failure then stops the recording (``Session.stop_recording``: one line on stderr, the
collectors stopped, nothing more recorded, a reason in ``Manifest.degraded`` such as
``disk full after step 66: recording stopped``), while the program runs on to its own exit code.

A collector's own hooks (a module's forward hook, the optimizer's step hook, a DataLoader fetch,
a Keras callback) run inside the program's calls too. Each catches its own failures, never the
program's (the call it wraps runs outside its ``try``), and hands them to
``Collector.hook_failed``; the session stops that collector alone, says so in one line and keeps
the reason :func:`source_stopped_reason` words (``layers collector: recording failed
(OSError: ...) in its forward pre-hook after step 3: its recording stopped``).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from dlprof.store.safe_files import DISK_FULL, os_error_text
from dlprof.text import printable

Method = TypeVar("Method", bound=Callable[..., Any])


def stops_recording_on_failure(method: Method) -> Method:
    """Run ``method`` so that an exception from it stops the recording instead of reaching the
    program; once the recording has stopped, the method does nothing.

    A session never started is not guarded: ``step()`` outside a ``with`` block is the
    caller's mistake and raises as before.
    """
    @functools.wraps(method)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self._context is None:
            return method(self, *args, **kwargs)
        if self.recording_stopped:
            return None
        try:
            return method(self, *args, **kwargs)
        except Exception as failure:  # noqa: BLE001  dlprof's failure is never the program's
            self.stop_recording(failure)
            return None

    return guarded  # type: ignore[return-value]


def degraded_reason(failure: BaseException, step: int) -> str:
    """Why the recording stopped, as ``Manifest.degraded`` keeps it.

    Args:
        failure: what a save raised.
        step: the steps ended so far.

    Returns:
        ``"disk full after step 66: recording stopped"``, or the write error or the exception in
        words in place of ``disk full`` (:func:`failure_words`).
    """
    return f"{failure_words(failure)} after step {step}: recording stopped"


def source_stopped_reason(source: str, where: str, failure: BaseException, step: int) -> str:
    """Why one source of events (a collector, the MLPerf line reader) stopped recording, as
    ``Manifest.degraded`` keeps it.

    Args:
        source: what stopped (``layers collector``).
        where: what of it failed (``its forward pre-hook``, ``its save``).
        failure: what that raised.
        step: the steps ended so far.

    Returns:
        ``"layers collector: disk full in its save after step 66: its recording stopped"``, the
        failure in words as :func:`failure_words` gives them.
    """
    return f"{source}: {failure_words(failure)} in {where} after step {step}: its recording stopped"


def say_stopped(reason: str, degraded: list[str]) -> None:
    """One source stopped recording: ``reason`` joins the manifest's ``degraded`` and is said in
    one line on stderr; the program goes on."""
    degraded.append(reason)
    print(f"dlprof: {printable(reason)}; the program goes on", file=sys.stderr)


def disk_full(failure: BaseException) -> bool:
    """Whether ``failure`` is a write that found no room (the whole run's failure, whichever
    collector met it first)."""
    return isinstance(failure, OSError) and failure.errno in DISK_FULL


def failure_words(failure: BaseException) -> str:
    """What went wrong in a few words: ``disk full``, ``write error (<file>: <reason>)`` for a
    file that could not be written, ``I/O error (<reason>)`` for one that names no file (a
    counter that could not be read), or ``recording failed (<exception>: <message>)``."""
    if disk_full(failure):
        return "disk full"
    if isinstance(failure, OSError):
        return f"{'write' if failure.filename else 'I/O'} error ({os_error_text(failure)})"
    detail = " ".join(str(failure).split())[:200]
    return f"recording failed ({type(failure).__name__}{': ' + detail if detail else ''})"
