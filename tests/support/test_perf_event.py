"""perf_event_open through ctypes: real counting of this process, no mocks."""

from __future__ import annotations

import mmap
import threading
import time

import pytest

from dlprof.support.perf_event import EVENTS, PerfCounters, available_events


def counters(names: list[str], scope: str = "thread") -> PerfCounters:
    """Open ``names`` or skip the test with perf_event_open's reason."""
    opened = PerfCounters(names, scope)
    if opened.failed:
        opened.close()
        pytest.skip(f"perf_event_open cannot count here: {opened.failed}")
    return opened


def burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        sum(range(1000))


def test_task_clock_follows_the_threads_cpu_time() -> None:
    opened = counters(["task-clock"])
    before, cpu_before = opened.read(), time.thread_time_ns()
    burn(0.2)
    counted = opened.read()[0] - before[0]
    cpu = time.thread_time_ns() - cpu_before
    opened.close()
    assert 0.5 * cpu <= counted <= 2 * cpu


def test_page_faults_rise_when_fresh_memory_is_touched() -> None:
    opened = counters(["page-faults"])
    # A fresh anonymous mapping: its pages cannot have been touched before (a bytearray may
    # reuse memory the allocator already holds).
    memory = mmap.mmap(-1, 64 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    before = opened.read()
    memory[::4096] = b"\1" * (len(memory) // 4096)
    after = opened.read()
    opened.close()
    memory.close()
    assert after[0] > before[0]


def test_context_switches_rise_across_sleeps() -> None:
    opened = counters(["context-switches"])
    if opened.user_only:
        pytest.skip("kernel mode not countable here: context switches read 0 in user mode")
    before = opened.read()
    for _ in range(5):
        time.sleep(0.002)
    after = opened.read()
    opened.close()
    assert after[0] >= before[0] + 5


def test_process_scope_counts_other_threads_thread_scope_does_not() -> None:
    started = threading.Event()
    go = threading.Event()

    def work() -> None:
        started.set()
        go.wait()
        burn(0.2)

    # One thread exists before the counters open (its own fd), one is created after (inherited).
    early = threading.Thread(target=work)
    early.start()
    started.wait()
    process = counters(["task-clock"], "process")
    thread = counters(["task-clock"], "thread")
    late = threading.Thread(target=work)
    process_before, thread_before = process.read()[0], thread.read()[0]
    late.start()
    go.set()
    early.join()
    late.join()
    process_counted = process.read()[0] - process_before
    thread_counted = thread.read()[0] - thread_before
    process.close()
    thread.close()
    assert process_counted >= 0.3e9  # both threads' 0.2 s each, loosely
    assert thread_counted < 0.1e9


def test_available_events_lists_every_event_with_a_reason_when_not_available() -> None:
    infos = available_events()
    assert [info.name for info in infos] == list(EVENTS)
    for info in infos:
        assert info.available or info.reason


def test_unknown_names_are_reported_not_raised() -> None:
    opened = PerfCounters(["no-such-counter"])
    assert opened.names == ()
    assert "unknown counter" in opened.failed["no-such-counter"]
    assert opened.read() == ()


def test_multiplexed_counts_are_scaled_and_marked() -> None:
    """Scaling as perf stat does, and rows marked scaled when a counter missed time in a slice."""
    from dlprof.store.counter_deltas import CounterDeltas, CounterReading
    from dlprof.support.perf_event import scale

    assert scale(1_000, 400, 400) == 1_000  # on the PMU all the time: exact
    assert scale(1_000, 400, 100) == 4_000  # a quarter of the time: times four
    assert scale(1_000, 400, 0) == 0
    deltas = CounterDeltas(["perf:cycles", "perf:task-clock"], "thread")
    deltas.record(1, CounterReading((0, 0), (0, 0)), CounterReading((10, 5), (0, 0)))
    deltas.record(2, CounterReading((10, 5), (0, 0)), CounterReading((50, 9), (300, 0)))
    deltas.record(3, (0, 0), (1, 1))  # a plain reading (PAPI): exact
    rows = [(r["slice_id"], r["metric"], r["method"]) for r in deltas.drain().to_pylist()]
    assert rows == [(1, "perf:cycles", "exact"), (1, "perf:task-clock", "exact"),
                    (2, "perf:cycles", "scaled"), (2, "perf:task-clock", "exact"),
                    (3, "perf:cycles", "exact"), (3, "perf:task-clock", "exact")]


def test_software_counters_read_with_their_times_are_never_scaled() -> None:
    from dlprof.store.counter_deltas import unobserved_ns
    from dlprof.support.perf_event import PerfCounters

    counters = PerfCounters(["task-clock", "page-faults"])
    if not counters.names:
        pytest.skip(f"perf_event cannot count here: {counters.failed}")
    before = counters.read()
    sum(range(100_000))
    after = counters.read()
    counters.close()
    assert unobserved_ns(after) == unobserved_ns(before) == (0,) * len(counters.names)
    assert after[0] > before[0]



def test_one_group_read_gives_every_counter() -> None:
    # Thread-scope counters are one perf_event group, read in one syscall through its leader.
    opened = counters(["task-clock", "page-faults", "context-switches"])
    before = opened.read()
    memory = mmap.mmap(-1, 16 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    memory[::4096] = b"\1" * (len(memory) // 4096)
    memory.close()
    deadline = time.thread_time_ns() + 2_000_000
    while time.thread_time_ns() < deadline:
        pass
    after = opened.read()
    opened.close()
    assert len(after) == 3
    assert after[0] - before[0] >= 1_000_000, "task-clock counted the 2 ms of CPU"
    assert after[1] > before[1], "page-faults counted the fresh pages"
