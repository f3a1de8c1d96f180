"""dlprof's own pauses: each interval in which dlprof holds the program's thread, as a slice.

A save stops the framework profilers and takes their events on the program's thread, a profiler
cycle's stop and start at a schedule's boundary does too, and a forked child writes its slices
there: the program waits. Each such interval is recorded as a slice of kind ``profiler`` on the
thread it held, so that nesting puts it inside whatever the program had open (a step, a layer, a
region) and every analysis leaves it out of the user's time (the store's ``pause_ns``, see
:mod:`dlprof.store.nesting`), and the run's manifest sums them up (``dlprof info``)::

    pauses = Pauses(session.slices)
    began = time.perf_counter_ns()
    ...                                     # dlprof's work on the program's thread
    pauses.record(began, PauseCause.SAVE, inside_step=False, inside_layer=False)
    manifest.saving["pauses"] = pauses.summary()

A pause's slice lands in the slice buffer after the save it times has drained it, so it is saved
with the next save; the last save, at the end of the run, holds the program no more and is not
recorded.
"""

from __future__ import annotations

import threading
import time
from enum import StrEnum
from typing import Any

from dlprof.keys import Kind
from dlprof.store.slice_buffer import SliceBuffer

# Pauses inside a step longer than this (unless memory forced them) are the ones a user sees.
NOTICEABLE_NS = 50_000_000


class PauseCause(StrEnum):
    """Why dlprof held the program's thread: the name of the pause's slice."""

    SAVE = "dlprof::save"  # at a step boundary (or, without steps, where no layer or region was open)
    SAVE_INSIDE_STEP = "dlprof::save inside a step"
    SAVE_FOR_MEMORY = "dlprof::save for memory"  # memory could not wait for a step boundary
    CYCLE = "dlprof::profiler cycle"  # a schedule's stop or start of the profilers, at a boundary
    FLUSH = "dlprof::flush"  # a forked child writing what it recorded


class Pauses:
    """Records dlprof's pauses of the program and sums them up."""

    def __init__(self, slices: SliceBuffer) -> None:
        self._slices = slices
        self._kind = slices.kind_code(Kind.PROFILER)
        self._names = {cause: slices.intern(cause) for cause in PauseCause}
        self._lock = threading.Lock()
        self.count = 0
        self.total_ns = 0
        self.longest_ns = 0
        self.inside_steps = 0
        self.inside_layers = 0
        self.for_memory = 0
        self.longest_unforced_in_step_ns = 0  # the longest pause inside a step that memory did not force

    def record(self, began_ns: int, cause: PauseCause, inside_step: bool, inside_layer: bool) -> int:
        """Record the pause from ``began_ns`` (``perf_counter_ns``) to now on this thread;
        ``inside_step``: inside a training step (not step 0, which holds the program's start-up),
        ``inside_layer``: inside a layer's forward.

        Returns:
            Its length in nanoseconds.
        """
        ended = time.perf_counter_ns()
        length = ended - began_ns
        self._slices.record(self._kind, self._names[cause], threading.get_native_id(), began_ns, ended)
        with self._lock:
            self.count += 1
            self.total_ns += length
            self.longest_ns = max(self.longest_ns, length)
            self.inside_steps += inside_step
            self.inside_layers += inside_layer
            self.for_memory += cause is PauseCause.SAVE_FOR_MEMORY
            if inside_step and cause is not PauseCause.SAVE_FOR_MEMORY:
                self.longest_unforced_in_step_ns = max(self.longest_unforced_in_step_ns, length)
        return length

    def reset(self) -> None:
        """In a forked child: the parent's pauses are the parent's."""
        with self._lock:
            self.count = self.total_ns = self.longest_ns = 0
            self.inside_steps = self.inside_layers = self.for_memory = self.longest_unforced_in_step_ns = 0

    def summary(self) -> dict[str, Any]:
        """The manifest's ``saving.pauses``: count, total and longest (ms), how many fell inside
        steps and inside layers, how many memory forced, the longest inside a step it did not."""
        return {
            "count": self.count,
            "total_ms": round(self.total_ns / 1e6, 1),
            "longest_ms": round(self.longest_ns / 1e6, 1),
            "inside_steps": self.inside_steps,
            "inside_layers": self.inside_layers,
            "for_memory": self.for_memory,
            "longest_unforced_inside_step_ms": round(self.longest_unforced_in_step_ns / 1e6, 1),
        }
