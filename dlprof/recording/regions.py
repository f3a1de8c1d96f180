"""User regions: named ranges in the user's code, like TAU's timers or torch's ``record_function``.

    with dlprof.region("data"):
        batch = next(loader)

    @dlprof.region("validate")
    def validate(model): ...

Regions nest, work in any thread, and cost one clock reading on entry and one append on exit;
with no session recording they cost a function call. A region still open when the session saves
is handed over as open, so what it holds nests under it even when it spans many saves. With CPU counters configured, each
boundary also reads the counters (one read(2) per counter) and the deltas become metrics rows.

Inside a function torch.compile compiles, a region does nothing: while Dynamo traces it, its
entry tests ``torch.compiler.is_compiling()`` first (torch is never imported from here) and
leaves the region unopened, so Dynamo folds it away (no graph break, no guard that changes), and
the compiled graph runs without it. A region around a call of compiled code is timed as any.

A failure of dlprof's there (a counter that cannot be read) stops the recording
(``Session.stop_recording``); the block itself is the program's, and what it raises passes on.
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import ContextDecorator
from types import TracebackType

from dlprof.recording.session import active_session


class region(ContextDecorator):
    """A named range recorded as a slice of kind ``region`` in the active session."""

    __slots__ = ("_counts", "_id", "_session", "_start", "_tid", "name")

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("a region needs a non-empty name")
        self.name = name
        self._start = -1

    def _recreate_cm(self) -> region:
        # A decorated function may run recursively or in several threads at once.
        return region(self.name)

    def __enter__(self) -> region:
        if _compiling():  # first: Dynamo then traces nothing of the session's
            self._start = -1
            return self
        session = active_session()
        if session is not None and session.recording:
            self._session = session
            reader = session.counter_reader
            try:
                # Counters are read outside the timed interval, so reading them is not region time.
                self._counts = reader() if reader is not None else None
            except Exception as failure:  # noqa: BLE001  dlprof's failure is never the program's
                session.stop_recording(failure)
                self._start = -1
                return self
            self._tid = threading.get_native_id()
            self._id = -1  # a save that finds the region open gives it one
            session.open_regions[id(self)] = self
            self._start = time.perf_counter_ns()
        else:
            self._start = -1
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._start >= 0:
            end = time.perf_counter_ns()
            session = self._session
            session.open_regions.pop(id(self), None)
            try:
                slice_id = session.slices.record(session.region_kind, session.slices.intern(self.name),
                                                 self._tid, self._start, end, -1, self._id)
                counts = self._counts
                if counts is not None:
                    reader = session.counter_reader
                    session.record_counts(slice_id, counts, reader() if reader is not None else ())
            except Exception as failure:  # noqa: BLE001  dlprof's failure is never the program's
                session.stop_recording(failure)
            self._start = -1
            if session.save_waiting:
                session.save_waited()


def _compiling() -> bool:
    """Whether torch.compile's Dynamo is tracing the caller; False where the program has not
    imported torch (it is not imported for the asking)."""
    torch = sys.modules.get("torch")
    return torch is not None and bool(torch.compiler.is_compiling())
