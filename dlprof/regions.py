"""User regions: named ranges in the user's code, like TAU's timers or torch's ``record_function``.

    with dlprof.region("data"):
        batch = next(loader)

    @dlprof.region("validate")
    def validate(model): ...

Regions nest, work in any thread, and cost one clock reading on entry and one append on exit;
with no session recording they cost a function call. With CPU counters configured, each
boundary also reads the counters (one read(2) per counter) and the deltas become metrics rows.
"""

from __future__ import annotations

import time
from contextlib import ContextDecorator
from types import TracebackType

from dlprof.session import active_session


class region(ContextDecorator):
    """A named range recorded as a slice of kind ``region`` in the active session."""

    __slots__ = ("_counts", "_session", "_start", "name")

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("a region needs a non-empty name")
        self.name = name
        self._start = -1

    def _recreate_cm(self) -> region:
        # A decorated function may run recursively or in several threads at once.
        return region(self.name)

    def __enter__(self) -> region:
        session = active_session()
        if session is not None and session.recording:
            self._session = session
            reader = session.counter_reader
            # Counters are read outside the timed interval, so reading them is not region time.
            self._counts = reader() if reader is not None else None
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
            counts = self._counts
            if counts is None:
                session.record_region(session.slices.intern(self.name), self._start, end)
            else:
                reader = session.counter_reader
                after = reader() if reader is not None else ()
                session.record_region_counts(session.slices.intern(self.name), self._start, end,
                                             counts, after)
            self._start = -1
