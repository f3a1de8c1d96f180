"""The sampling thread the host, NVML and RAPL collectors share, on a real thread and clock."""

from __future__ import annotations

import itertools
import time

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
