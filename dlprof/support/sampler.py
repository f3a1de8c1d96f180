"""A background thread that takes a sample every so often: what the host and NVML samplers share."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

# Intervals up to this long are slept; longer ones wait on the stop event.
SLEEP_UP_TO_S = 0.02


class PeriodicSampler:
    """Calls ``sample`` every ``interval_s`` seconds on a daemon thread, until stopped."""

    def __init__(self, sample: Callable[[], None], interval_s: float, name: str) -> None:
        self._sample = sample
        self._interval_s = interval_s
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling and wait for the thread; the caller takes any last sample itself."""
        self._stopping.set()
        self._thread.join()

    def _loop(self) -> None:
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

    def __init__(self, read: Callable[[], T], interval_s: float, name: str) -> None:
        self._read = read
        self._lock = threading.Lock()
        self._times: list[int] = []
        self._values: list[T] = []
        self._sampler = PeriodicSampler(self.take, interval_s, name)

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
        """Stop the thread and take the last reading."""
        self._sampler.stop()
        self.take()

    def drain(self) -> tuple[list[int], list[T]]:
        """The readings taken since the last drain, with their times (epoch ns)."""
        with self._lock:
            times, values = self._times, self._values
            self._times, self._values = [], []
        return times, values
