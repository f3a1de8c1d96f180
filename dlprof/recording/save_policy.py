"""When a session saves: at the end of a profiling cycle, and at the latest when too many seconds,
events or bytes of memory have gathered since the last save, whichever comes first.

Steps are the natural place to save: the session asks :meth:`SaveClock.due` at every step
boundary (a clock reading; the process's memory is read at most every 50 ms). A program with
no steps, or with steps longer than the limits, is saved inside a step: a watchdog thread that
finds a save overdue asks the main thread for one as a signal handler would be
(``_thread.interrupt_main(SIGURG)``: no signal is sent, so no system call of the program's is
interrupted, a blocking socket read in a library's C++ included), and the handler saves between
two bytecodes of the program, unless dlprof's own code is under way there or a collector says a
save would cut its work in two (a backward under way: see ``Collector.save_would_split``), in
which case the watchdog asks again shortly. A program blocked in C code the whole time is saved when it returns. So
memory stays bounded and a run killed at any moment keeps all but its last few seconds::

    clock = SaveClock(SaveLimits())
    if clock.due(pending_events=len(buffer)):   # at a step boundary
        save(); clock.restart()
    requests = MidStepSaves(clock, save=lambda: session.save_within_step())
    requests.start() ... requests.stop()
"""

from __future__ import annotations

import _thread
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

from dlprof.support.dynamo import keep_out_of_dynamo
from dlprof.support.import_watch import ImportWatch

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
# How often the process's memory is read at step boundaries, at most.
_MEMORY_CHECK_NS = 50_000_000
# The signal whose handler makes a save (a real one is ignored: nothing uses it, and its default
# is to be ignored).
SAVE_SIGNAL = signal.SIGURG
# dlprof modules that are on the stack under the program itself, not above it.
_UNDER_THE_PROGRAM = ("dlprof.recording.runner", "dlprof.cli", "dlprof.__main__")


# Memory a profiler takes per event: torch 2.13's Kineto keeps about 80 bytes per CPU op while
# recording, then builds its results at stop, about 5 kB per event. So the growth of the
# process counts events as they come, before any save says how fast they come.
RECORDING_BYTES_PER_EVENT = 100
STOP_BYTES_PER_EVENT = 5_000
# Bytes of a saved profiler trace per event (Kineto's Chrome JSON: 300 to 400): how the events of
# a save are counted before it is converted.
TRACE_BYTES_PER_EVENT = 350


@dataclass(frozen=True)
class SaveLimits:
    """At most this much between two saves."""

    seconds: float = 10.0
    # Events recorded by every source, estimated from how fast earlier saves filled.
    events: int = 250_000
    # What profiling may take above the program's own memory: saves come often enough that
    # stopping a profiler (STOP_BYTES_PER_EVENT) takes at most half of it (the profilers' own
    # state and buffers take the rest), and a save is made when the process grew by half of
    # it. A save that finds all of it used is counted (SaveClock.overflows).
    memory_bytes: int = 512 << 20

    @property
    def events_per_save(self) -> int:
        return max(1_000, min(self.events, self.memory_bytes // 2 // STOP_BYTES_PER_EVENT))


def resident_bytes() -> int:
    """This process's resident memory, from /proc (0 where there is none)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


class SaveClock:
    """What has gathered since the last save, against the limits."""

    def __init__(self, limits: SaveLimits, memory: Callable[[], int] = resident_bytes,
                 growth_counts_events: Callable[[], bool] = lambda: False) -> None:
        """Args:
        limits: the limits.
        memory: reads the process's resident memory.
        growth_counts_events: whether the process's growth counts events (while torch.profiler
            records: it keeps RECORDING_BYTES_PER_EVENT per event and little else grows).
        """
        self.limits = limits
        self._memory = memory
        self._growth_counts_events = growth_counts_events
        self._events_per_second = 0.0
        self.overflows = 0  # saves that found memory grown past the whole limit
        self.peak_growth_bytes = 0
        self.saving = False  # a save is under way: none is due until it is made
        self._recorded_s = 0.0
        self.restart()

    def restart(self) -> None:
        """A save was just made (or recording began)."""
        self.saving = False
        now = time.perf_counter_ns()
        self._saved_at = now
        self._checked_at = now
        self._baseline = self._memory()
        self._growth = 0
        self._events_due = False
        self._requested = ""

    def request(self, reason: str) -> None:
        """A save was due where none could be made (a step boundary inside a C++ range): one is
        due from now on, for ``reason``, until it is made."""
        self._requested = reason

    def begin_save(self) -> None:
        """A save begins: what was recorded since the last one ends here."""
        self.saving = True
        self._recorded_s = (time.perf_counter_ns() - self._saved_at) / 1e9

    def learn(self, events: int) -> None:
        """How many events the save under way holds (estimated from its traces' sizes): how
        many profilers are taken to hold after so many seconds without saying."""
        if self._recorded_s > 0 and events > 0:
            self._events_per_second = events / self._recorded_s

    def due(self, pending_events: int = 0) -> str | None:
        """Why a save is due now, or None.

        Args:
            pending_events: events dlprof itself recorded since the last save.
        """
        if self.saving:
            return None
        if self._requested:
            return self._requested
        now = time.perf_counter_ns()
        seconds = (now - self._saved_at) / 1e9
        if seconds >= self.limits.seconds:
            return f"{self.limits.seconds:g} s since the last save"
        if now - self._checked_at >= _MEMORY_CHECK_NS:
            self._checked_at = now
            self._growth = self._memory() - self._baseline
            self.peak_growth_bytes = max(self.peak_growth_bytes, self._growth)
        events = pending_events + self._events_per_second * seconds
        if self._growth_counts_events():
            events = max(events, self._growth / RECORDING_BYTES_PER_EVENT)
        if events >= self.limits.events_per_save:
            self._events_due = True
            return f"about {self.limits.events_per_save:,} events since the last save"
        if self._growth >= self.limits.memory_bytes // 2:
            if self._growth >= self.limits.memory_bytes:
                self.overflows += 1
            return f"memory grew {self._growth >> 20} MiB since the last save"
        return None

    def seconds_until_due(self, pending_events: int = 0) -> float:
        """How long until the events expected make a save due (a guess from how fast they came)."""
        rate = self._events_per_second
        if rate <= 0:
            return self.limits.seconds
        seconds = (time.perf_counter_ns() - self._saved_at) / 1e9
        return max(0.0, (self.limits.events_per_save - pending_events) / rate - seconds)

    def urgent(self) -> bool:
        """Whether the save due is for memory's sake: it cannot wait for a step boundary."""
        return self._events_due or self._growth >= self.limits.memory_bytes // 2


class MidStepSaves:
    """Saves inside a step, asked of the main thread when no step boundary comes in time."""

    def __init__(self, clock: SaveClock, save: Callable[[], None], pending_events: Callable[[], int],
                 grace_s: float = 0.5, interval_s: float = 0.1,
                 would_split: Callable[[], bool] = lambda: False) -> None:
        """Args:
        clock: the session's save clock.
        save: makes a save inside the current step (called in the main thread).
        pending_events: events dlprof itself recorded since the last save.
        would_split: whether a save now would cut work one source times from work another
            times inside it (see Collector.save_would_split): then the watchdog asks again.
        grace_s: how long a due save may wait for a step boundary before one is asked for.
        interval_s: how often the watchdog looks.
        """
        self._clock = clock
        self._save = save
        self._pending_events = pending_events
        self._grace_ns = int(grace_s * 1e9)
        self._interval_s = interval_s
        self._would_split = would_split
        self._asked = False
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._previous: Callable[[int, FrameType | None], object] | int | None = None
        self._outside_dynamo: ImportWatch | None = None
        self.saves = 0
        self.unavailable = ""  # why saves inside steps cannot be made here ("" when they can)

    def start(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            self.unavailable = "the session runs outside the main thread: saves only at step boundaries"
            return
        current = signal.getsignal(SAVE_SIGNAL)
        if current not in (signal.SIG_DFL, signal.SIG_IGN, None):
            self.unavailable = f"the program handles {SAVE_SIGNAL.name} itself: saves only at step boundaries"
            return
        # The handler may run between two bytecodes of a compiled region's own Python: Dynamo
        # must not compile it, nor the save it makes (support/dynamo.py).
        self._outside_dynamo = keep_out_of_dynamo([MidStepSaves._handle.__code__])
        self._previous = signal.signal(SAVE_SIGNAL, self._handle)
        # A real SIGURG (a socket's out-of-band data) must not interrupt the program's system calls.
        signal.siginterrupt(SAVE_SIGNAL, False)
        self._thread = threading.Thread(target=self._watch, name="dlprof-saves", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._outside_dynamo is not None:
            self._outside_dynamo.cancel()
        if self._previous is not None:
            signal.signal(SAVE_SIGNAL, self._previous)
            self._previous = None

    def _watch(self) -> None:
        overdue_since: int | None = None
        wait_s = self._interval_s
        while not self._stopping.wait(wait_s):
            wait_s = self._interval_s
            if self._clock.due(self._pending_events()) is None:
                overdue_since = None
                # Where events come fast, look again when enough will have come.
                wait_s = max(0.01, min(self._interval_s, self._clock.seconds_until_due(self._pending_events())))
                continue
            now = time.perf_counter_ns()
            overdue_since = overdue_since or now
            if now - overdue_since >= self._grace_ns or self._clock.urgent():
                self._asked = True
                _thread.interrupt_main(SAVE_SIGNAL)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if not self._asked or self._stopping.is_set():
            return  # a SIGURG of someone else's (out-of-band socket data)
        if in_dlprof_code(frame) or self._would_split():
            return  # dlprof's own code, or a backward, is under way here: the watchdog asks again
        self._asked = False
        if self._clock.due(self._pending_events()) is not None:
            self._save()
            self.saves += 1


def in_dlprof_code(frame: FrameType | None) -> bool:
    """Whether dlprof's code runs on this stack above the program (a hook, a region's end): a
    signal handler that finds it so must not save there."""
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if module.startswith("dlprof.") and not module.startswith(_UNDER_THE_PROGRAM):
            return True
        frame = frame.f_back
    return False
