"""The sampling thread the host, NVML and RAPL collectors share, on a real thread and clock."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from dlprof.support.sampler import TimedSamples


def test_readings_are_taken_at_start_on_the_thread_and_at_stop_and_drained_once() -> None:
    counter = itertools.count()
    samples = TimedSamples(lambda: next(counter), 0.005, "test-sampler")
    began = time.time_ns()
    samples.start()
    time.sleep(0.1)
    first_times, first = samples.drain()
    samples.stop()
    last_times, last = samples.drain()
    values = first + last
    assert first[0] == 0, "a reading at start"
    assert len(first) >= 5, "the thread samples meanwhile"
    assert values == list(range(len(values))), "each reading once, in order"
    times = first_times + last_times
    assert times == sorted(times) and times[0] >= began
    assert last and samples.drain() == ([], []), "the last reading taken at stop, then nothing"


def test_a_reading_that_fails_ends_the_thread_without_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, the exception ended the thread through threading.excepthook: a traceback on the
    program's stderr."""
    hooked: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: hooked.append(args.exc_value))
    told: list[str] = []
    readings = iter([1, 2])

    def read() -> int:
        return next(readings)  # StopIteration at the third reading: the source is gone

    samples = TimedSamples(read, 0.005, "dlprof-test", lambda failure: told.append(type(failure).__name__))
    samples.start()
    deadline = time.monotonic() + 5
    while not told and time.monotonic() < deadline:
        time.sleep(0.01)
    samples.stop()
    assert told == ["StopIteration"] and hooked == []
    assert samples.drain()[1] == [1, 2], "what was read before is kept; no reading at stop"
