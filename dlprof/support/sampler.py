"""A background thread that takes a sample every so often: what the host and NVML samplers share.

A sample that raises ends the thread (no traceback on the program's stderr): ``on_failure`` is
told what it raised, on the sampler's thread, and :meth:`PeriodicSampler.stop` still returns.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from dlprof.text import printable

T = TypeVar("T")

# Intervals up to this long are slept; longer ones wait on the stop event.
SLEEP_UP_TO_S = 0.02


class PeriodicSampler:
    """Calls ``sample`` every ``interval_s`` seconds on a daemon thread, until stopped."""

    def __init__(self, sample: Callable[[], None], interval_s: float, name: str,
                 on_failure: Callable[[BaseException], None] | None = None) -> None:
        """Args:
        sample: takes one sample.
        interval_s: the time between two.
        name: the thread's name (``dlprof-...``).
        on_failure: told what a sample raised (the thread then ends); None: one line on stderr.
        """
        self._sample = sample
        self._interval_s = interval_s
        self._on_failure = on_failure
        self.failed = False  # a sample raised: the thread ended
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling and wait for the thread; the caller takes any last sample itself."""
        self._stopping.set()
        if threading.current_thread() is not self._thread:  # stopped from its own failure
            self._thread.join()

    def _loop(self) -> None:
        try:
            self._take_samples()
        except Exception as failure:  # noqa: BLE001  a thread's traceback would land on the program's stderr
            self.failed = True
            if self._on_failure is not None:
                self._on_failure(failure)
            else:
                print(f"dlprof: {self._thread.name} stopped: {printable(f'{type(failure).__name__}: {failure}')}",
                      file=sys.stderr)

    def _take_samples(self) -> None:
        if self._interval_s <= SLEEP_UP_TO_S:
            # At short intervals the wake-ups are the cost: a sleeping thread's cost about half
            # of those of one waiting on an Event, and stop() waits at most one interval.
            while not self._stopping.is_set():
                time.sleep(self._interval_s)
                if not self._stopping.is_set():
                    self._sample()
            return
        while not self._stopping.wait(self._interval_s):
            self._sample()


class TimedSamples(Generic[T]):
    """Readings taken every ``interval_s`` on a thread (and once at start and stop), kept with
    their times until drained."""

    def __init__(self, read: Callable[[], T], interval_s: float, name: str,
                 on_failure: Callable[[BaseException], None] | None = None) -> None:
        self._read = read
        self._lock = threading.Lock()
        self._times: list[int] = []
        self._values: list[T] = []
        self._sampler = PeriodicSampler(self.take, interval_s, name, on_failure)

    def start(self) -> None:
        self.take()
        self._sampler.start()

    def take(self) -> None:
        now = time.time_ns()
        value = self._read()
        with self._lock:
            self._times.append(now)
            self._values.append(value)

    def stop(self) -> None:
        """Stop the thread and take the last reading (none after a reading failed)."""
        self._sampler.stop()
        if not self._sampler.failed:
            self.take()

    def drain(self) -> tuple[list[int], list[T]]:
        """The readings taken since the last drain, with their times (epoch ns)."""
        with self._lock:
            times, values = self._times, self._values
            self._times, self._values = [], []
        return times, values
