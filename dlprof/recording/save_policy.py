"""When a session saves, and where: at step boundaries, unless memory cannot wait.

A save stops the framework profilers and takes what they hold: torch.profiler's stop and export
run on the program's thread holding the GIL, about 7 µs per event on a CPU, so every save is a
pause of the program. dlprof records each as a ``profiler`` slice (:mod:`dlprof.recording.pauses`)
that no analysis counts as the user's time, and this policy keeps them where they cost least:

- **memory**: dlprof's own memory is estimated from its events (the slice buffer's, counted; the
  framework profilers', from the rate at which they came before the last save, or before any save
  from the process's growth while torch.profiler records), each counted at what it takes until the
  profiler's stop has built its results (:data:`BYTES_PER_EVENT`). At a step boundary a save is
  made when the next step, as long as the last, would take the estimate past
  :data:`PRESSING_SHARE` of the cap; inside a step only when it nears the cap all the same (a
  step longer than the last): past :data:`PRESSING_SHARE` at a moment with no layer or region
  open, past :data:`URGENT_SHARE` wherever the program is (waiting would pass the cap). The
  process's own growth counts as well, against the whole cap (predicted at a boundary, past it
  anywhere): an event rate learned in a quiet phase must not let memory run away, and while
  torch.profiler records, the heap grows with the tensors the program frees between its events
  (on a GPT-style model on a CPU, about 12 kB per event in the first cycle, reused after it).
- **time**: ``--save-seconds`` after the last save, at a step boundary. By default (10 s) only if
  the save's pause (the events it holds at the cost per event the saves so far took) keeps
  dlprof's pauses within the pause budget (``pause_share``, 2% of the time recorded): a torch
  program's events cost more than that, so it saves by memory, and collectors whose saves cost
  little save by time. A ``--save-seconds`` the user sets is kept whatever it costs.
- **first save**: a second into recording, at the first step boundary or, in the first step, a
  moment when no layer or region is open, to learn how fast events come and what a save costs
  per event.
- **owed**: a save due at a step boundary that would cut a C++ range there (the step ended
  inside the backward or a compiled region: :meth:`SaveClock.request`) is made at the next
  moment in the step when no layer or region is open, or at the next boundary.

A program with no steps (none ended so far) is one long step: the watchdog saves it at a moment
when no layer or region is open (:class:`MidStepSaves`), for the same reasons. Memory that cannot
wait is saved wherever the program is, between two bytecodes::

    clock = SaveClock(SaveLimits())
    if clock.at_boundary(pending_slices=len(buffer), step_ns=last_step_ns):   # a step ends
        clock.begin_save(); ...; clock.saved(framework_events, slices, pause_ns)
    requests = MidStepSaves(clock, save=..., pending_events=..., has_steps=..., quiet=...)
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
from enum import Enum
from types import FrameType

from dlprof.support.dynamo import keep_out_of_dynamo
from dlprof.support.import_watch import ImportWatch

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
# How often the process's memory is read, at most.
_MEMORY_CHECK_NS = 50_000_000
# The signal whose handler makes a save (a real one is ignored: nothing uses it, and its default
# is to be ignored).
SAVE_SIGNAL = signal.SIGURG
# dlprof modules that are on the stack under the program itself, not above it.
_UNDER_THE_PROGRAM = ("dlprof.recording.runner", "dlprof.cli", "dlprof.__main__")

# What a framework profiler's event takes until it is saved (torch 2.13's Kineto, CPU, shapes and
# memory recorded, measured): about 450 bytes while recording, then 1,800 more once the stop has
# built its results, held until the export is written. The cap bounds the sum.
RECORDING_BYTES_PER_EVENT = 450
BYTES_PER_EVENT = 2_300
# A slice of dlprof's own buffer (steps, regions, layers), in its columns and then as Arrow.
SLICE_BYTES = 120
# Bytes of a saved profiler trace per event (Kineto's Chrome JSON: 300 to 400): how the events of
# a save are counted before it is converted.
TRACE_BYTES_PER_EVENT = 350
# The share of the cap past which a save cannot wait for a step boundary: the rest is the room
# the watchdog needs to get to it. Past PRESSING_SHARE (a step longer than the one before it) a
# save inside the step waits for a moment with no layer or region open, if one comes in time.
URGENT_SHARE = 0.9
PRESSING_SHARE = 0.8
# The first save, to learn the event rate and a save's cost per event, a second into recording.
FIRST_SAVE_NS = 1_000_000_000
# What a save costs per event before one has been measured (torch.profiler's stop and export).
FIRST_GUESS_S_PER_EVENT = 10e-6
_CAP_CEILING = 2 << 30


def default_memory_cap() -> int:
    """The smaller of 2 GiB and a tenth of this machine's memory."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * _PAGE
    except (OSError, ValueError, AttributeError):
        return _CAP_CEILING
    return min(_CAP_CEILING, max(16 << 20, total // 10))


@dataclass(frozen=True)
class SaveLimits:
    """What saves are made for."""

    # At most this long between two saves, as far as the pause budget allows.
    seconds: float = 10.0
    # What profiling may hold above the program's own memory: the estimate of dlprof's events,
    # each counted until its profiler's stop has built its results.
    memory_bytes: int = _CAP_CEILING
    # dlprof's pauses for saves by time stay within this share of the time recorded (None: no
    # budget, saves every ``seconds``).
    pause_share: float | None = 0.02
    # At most this many events per save (None: as many as the memory cap holds).
    events: int | None = None


class Due(Enum):
    """Why a save is due."""

    FIRST = "the first save: how fast events come and what a save costs"
    TIME = "the seconds between saves have passed"
    MEMORY = "the next step would take dlprof's memory near the cap"
    URGENT = "memory is at the cap"
    REQUESTED = "a step boundary's save waited for a C++ range to end"


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
            records: before any save has measured the event rate, its growth is its events).
        """
        self.limits = limits
        self._memory = memory
        self._growth_counts_events = growth_counts_events
        self._began = time.perf_counter_ns()
        self._events_per_second = 0.0  # the framework profilers', over the last save's window
        self._seconds_per_event = FIRST_GUESS_S_PER_EVENT
        self._paused_ns = 0  # saves' pauses so far
        self._time_deferred = False
        self.saves = 0
        self.deferred = 0  # saves due by time that waited, for the pause budget
        self.overflows = 0  # saves made with the estimate (or the process's growth) past the cap
        self.peak_held_bytes = 0
        self.longest_between_saves_ns = 0  # what a run killed at the worst moment would have lost
        self.saving = False  # a save is under way: none is due until it is made
        self._recorded_s = 0.0
        self.restart()

    def restart(self) -> None:
        """A save was just made (or collectors just started: what they took is not events)."""
        self.saving = False
        now = time.perf_counter_ns()
        self._saved_at = now
        self._checked_at = now
        self._baseline = self._memory()
        self._growth = 0
        self._time_deferred = False
        self._requested = False

    def request(self) -> None:
        """A save was due at a step boundary where none could be made (inside a C++ range): one
        is due from now on, inside the step where nothing is open or at the next boundary,
        until it is made."""
        self._requested = True

    @property
    def requested(self) -> bool:
        """Whether a step boundary's save is owed (see :meth:`request`)."""
        return self._requested

    def begin_recording(self) -> None:
        """Recording begins: the pause budget counts from now."""
        self._began = time.perf_counter_ns()
        self.restart()

    def begin_save(self, pending_slices: int = 0) -> None:
        """A save begins, with ``pending_slices`` of dlprof's own: what was recorded since the
        last one ends here."""
        held = self.held_bytes(pending_slices)
        self.saving = True
        self._recorded_s = (time.perf_counter_ns() - self._saved_at) / 1e9
        self.peak_held_bytes = max(self.peak_held_bytes, held)
        if held > self.limits.memory_bytes or self._growth > self.limits.memory_bytes:
            self.overflows += 1

    def ended(self) -> None:
        """The run ends (its last save is made after the collectors stopped, so it teaches
        nothing of the run): only the stretch since the save before counts."""
        self.longest_between_saves_ns = max(self.longest_between_saves_ns, time.perf_counter_ns() - self._saved_at)

    def saved(self, framework_events: int, slices: int, pause_ns: int) -> None:
        """A save was made: it held ``framework_events`` events of the profilers (estimated from
        their traces' sizes) and ``slices`` of dlprof's own, and paused the program
        ``pause_ns``. Learns the profilers' event rate and a save's cost per event from it."""
        if self._recorded_s > 0:
            self._events_per_second = framework_events / self._recorded_s
        events = framework_events + slices
        if events >= 1_000:  # a few events say little of the cost of many
            self._seconds_per_event = pause_ns / 1e9 / events
        self._paused_ns += pause_ns
        self.saves += 1
        self.longest_between_saves_ns = max(self.longest_between_saves_ns, time.perf_counter_ns() - self._saved_at)
        self.restart()

    def framework_events(self) -> float:
        """The framework profilers' events since the last save, estimated."""
        seconds = (time.perf_counter_ns() - self._saved_at) / 1e9
        if self._events_per_second > 0:
            return self._events_per_second * seconds
        if self._growth_counts_events():
            return max(0, self._read_growth()) / RECORDING_BYTES_PER_EVENT
        return 0.0

    def held_bytes(self, pending_slices: int = 0) -> int:
        """What dlprof holds now, estimated (see the module's docstring)."""
        return int(pending_slices * SLICE_BYTES + self.framework_events() * BYTES_PER_EVENT)

    def _read_growth(self) -> int:
        now = time.perf_counter_ns()
        if now - self._checked_at >= _MEMORY_CHECK_NS:
            self._checked_at = now
            self._growth = self._memory() - self._baseline
        return self._growth

    def _events_over(self, pending_slices: int) -> bool:
        limit = self.limits.events
        return limit is not None and pending_slices + self.framework_events() >= limit

    def urgent(self, pending_slices: int = 0) -> bool:
        """Whether memory cannot wait for a step boundary (the estimate past URGENT_SHARE of the
        cap, the process grown past the whole cap, or the event limit reached)."""
        return (self.held_bytes(pending_slices) >= URGENT_SHARE * self.limits.memory_bytes
                or self._read_growth() >= self.limits.memory_bytes or self._events_over(pending_slices))

    def pressing(self, pending_slices: int = 0) -> bool:
        """Whether memory nears the cap (past PRESSING_SHARE): a save inside a step is wanted at
        the next moment with no layer or region open."""
        return self.held_bytes(pending_slices) >= PRESSING_SHARE * self.limits.memory_bytes or self.urgent(pending_slices)

    def at_boundary(self, pending_slices: int = 0, step_ns: int = 0) -> Due | None:
        """Why a save is due at this step boundary, or None.

        Args:
            pending_slices: slices dlprof itself recorded since the last save.
            step_ns: how long the step that just ended took (the next is taken to be as long).
        """
        if self.saving:
            return None
        if self.urgent(pending_slices):
            return Due.URGENT
        if self._requested:
            return Due.REQUESTED
        since_ns = time.perf_counter_ns() - self._saved_at
        if since_ns > 0:
            # The next step, as long as the last, grows both as the steps since the save did.
            ahead = 1 + step_ns / since_ns
            if (self.held_bytes(pending_slices) * ahead >= PRESSING_SHARE * self.limits.memory_bytes
                    or self._read_growth() * ahead >= self.limits.memory_bytes):
                return Due.MEMORY
        return self.due_by_time(pending_slices)

    def due_by_time(self, pending_slices: int = 0) -> Due | None:
        """Why a save is due by time (the first save, or the seconds between saves, within the
        pause budget), or None."""
        now = time.perf_counter_ns()
        if self.saves == 0 and now - self._began >= min(FIRST_SAVE_NS, self.limits.seconds * 1e9):
            return Due.FIRST
        if (now - self._saved_at) / 1e9 < self.limits.seconds:
            return None
        expected_ns = (pending_slices + self.framework_events()) * self._seconds_per_event * 1e9
        share = self.limits.pause_share
        if share is None or self._paused_ns + expected_ns <= share * (now - self._began):
            return Due.TIME
        if not self._time_deferred:
            self._time_deferred = True
            self.deferred += 1
        return None

    def seconds_until_pressing(self, pending_slices: int = 0) -> float:
        """How long until memory nears the cap, at the rate events came (a guess)."""
        rate = self._events_per_second * BYTES_PER_EVENT
        if rate <= 0:
            return self.limits.seconds
        room = PRESSING_SHARE * self.limits.memory_bytes - self.held_bytes(pending_slices)
        return max(0.0, room / rate)

    def recorded_s(self) -> float:
        """Seconds since recording began."""
        return (time.perf_counter_ns() - self._began) / 1e9


class Ask(Enum):
    """What the watchdog asks of the main thread."""

    URGENT = "urgent"  # memory: save wherever the program is (between two bytecodes)
    QUIET = "quiet"  # memory nearing the cap, or a program without steps: once no layer or region is open


class MidStepSaves:
    """Saves inside a step: for memory that cannot wait, and in programs without steps."""

    def __init__(self, clock: SaveClock, save: Callable[[], None], pending_events: Callable[[], int],
                 has_steps: Callable[[], bool] = lambda: True, quiet: Callable[[], bool] = lambda: True,
                 interval_s: float = 0.1, would_split: Callable[[], bool] = lambda: False) -> None:
        """Args:
        clock: the session's save clock.
        save: makes a save inside the current step (called in the main thread).
        pending_events: slices dlprof itself recorded since the last save.
        has_steps: whether the program has ended a step yet (one that has saves at boundaries).
        quiet: whether no layer or region is open (where a program without steps may be saved).
        would_split: whether a save now would cut work one source times from work another
            times inside it (see Collector.save_would_split): then the watchdog asks again.
        interval_s: how often the watchdog looks, at most.
        """
        self._clock = clock
        self._save = save
        self._pending_events = pending_events
        self._has_steps = has_steps
        self._quiet = quiet
        self._interval_s = interval_s
        self._would_split = would_split
        self._asked: Ask | None = None
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

    def wanted(self) -> Ask | None:
        """What to ask of the main thread now, if anything."""
        if self._clock.saving:
            return None
        pending = self._pending_events()
        if self._clock.urgent(pending):
            return Ask.URGENT
        if self._clock.pressing(pending) or self._clock.requested:
            return Ask.QUIET
        # Before its first step ends, a program is saved where no layer or region is open: the
        # first save (that learns the event rate), and, once it has ended no step in its first
        # save_seconds (it has none), saves by time.
        due = None if self._has_steps() else self._clock.due_by_time(pending)
        if due is Due.FIRST or (due is not None and self._clock.recorded_s() >= self._clock.limits.seconds):
            return Ask.QUIET
        return None

    def _watch(self) -> None:
        wait_s = self._interval_s
        while not self._stopping.wait(wait_s):
            asked = self.wanted()
            if asked is None:
                # Where events come fast, look again before memory can pass the cap.
                wait_s = max(0.01, min(self._interval_s, self._clock.seconds_until_pressing(self._pending_events())))
                continue
            wait_s = self._interval_s
            self._asked = asked
            _thread.interrupt_main(SAVE_SIGNAL)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        asked = self._asked
        if asked is None or self._stopping.is_set():
            return  # a SIGURG of someone else's (out-of-band socket data)
        if in_dlprof_code(frame) or self._would_split():
            return  # dlprof's own code, or a backward, is under way here: the watchdog asks again
        if asked is Ask.QUIET and not self._quiet():
            return  # a layer or region is open: the watchdog asks again
        self._asked = None
        if self.wanted() is not None:
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
