"""Notice the Python threads a program starts, at the cost of one call per thread.

    watch = ThreadWatch()      # threads started from now on are counted
    ...
    watch.close()
    watch.names                # ["loader", "Thread-3 (work)"]

``threading.setprofile`` hands every thread started through ``threading`` a profile function,
called once as the thread begins; it notes the thread and removes itself from that thread, so
the thread runs unprofiled from its first call on. A program that set its own
``threading.setprofile`` keeps it, and its threads go unnoticed.

The profile function runs as the program's thread begins: a failure of its own closes the watch
(``failure`` says why) and never reaches the thread.
"""

from __future__ import annotations

import sys
import threading
from types import FrameType
from typing import Any


class ThreadWatch:
    """The names of threads started while it is open, dlprof's own (``dlprof-*``) left out."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.failure = ""  # why the watch closed early ("" while it works)
        self._lock = threading.Lock()
        self._installed = threading.getprofile() is None
        if self._installed:
            threading.setprofile(self._first_call)

    def _first_call(self, frame: FrameType, event: str, arg: Any) -> None:
        sys.setprofile(None)
        try:
            name = threading.current_thread().name
            if not name.startswith("dlprof"):
                with self._lock:
                    self.names.append(name)
        except Exception as failure:  # noqa: BLE001  dlprof's failure is never the program's thread's
            self.failure = f"{type(failure).__name__}: {failure}"
            self.close()

    def close(self) -> None:
        if self._installed and threading.getprofile() == self._first_call:
            threading.setprofile(None)
        self._installed = False
