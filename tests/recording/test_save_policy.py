"""When saves are due: dlprof's own memory against the cap (predicted at step boundaries, pressing
or urgent inside a step), saves by time within the pause budget, the first save. A fake clock and
a fake reading of the process's memory stand in for time and /proc, so every figure is exact."""

from __future__ import annotations

import os

import pytest

from dlprof.config import ProfileConfig, default_memory_cap
from dlprof.recording import save_policy
from dlprof.recording.save_policy import (
    BYTES_PER_EVENT,
    RECORDING_BYTES_PER_EVENT,
    SLICE_BYTES,
    Ask,
    Due,
    MidStepSaves,
    SaveClock,
    SaveLimits,
)

MIB = 1 << 20


class FakeTime:
    """perf_counter_ns that moves only when told."""

    def __init__(self) -> None:
        self.ns = 1_000_000_000_000

    def perf_counter_ns(self) -> int:
        return self.ns

    def advance(self, seconds: float) -> None:
        self.ns += int(seconds * 1e9)


@pytest.fixture
def fake_time(monkeypatch: pytest.MonkeyPatch) -> FakeTime:
    fake = FakeTime()
    monkeypatch.setattr(save_policy, "time", fake)
    return fake


class FakeMemory:
    def __init__(self) -> None:
        self.bytes = 1 << 30

    def __call__(self) -> int:
        return self.bytes


def _clock(fake_time: FakeTime, cap_mib: int = 100, seconds: float = 10.0, grows: bool = True,
           memory: FakeMemory | None = None) -> SaveClock:
    clock = SaveClock(SaveLimits(seconds=seconds, memory_bytes=cap_mib * MIB), memory=memory or FakeMemory(),
                      growth_counts_events=lambda: grows)
    clock.begin_recording()
    return clock


def _learn_rate(clock: SaveClock, fake_time: FakeTime, events_per_second: float, pause_s: float = 0.0) -> None:
    """A save after one second that held ``events_per_second`` framework events."""
    fake_time.advance(1.0)
    clock.begin_save()
    clock.saved(int(events_per_second), 0, int(pause_s * 1e9))


def test_a_step_boundary_saves_when_the_next_step_would_pass_the_cap(fake_time: FakeTime) -> None:
    clock = _clock(fake_time)
    _learn_rate(clock, fake_time, events_per_second=10_000)  # 23 MB of held events a second
    fake_time.advance(2.0)  # 46 MB held: a step of 2.5 s would make 103.5, past 80% of 100 MiB
    assert clock.held_bytes() == 20_000 * BYTES_PER_EVENT
    assert clock.at_boundary(step_ns=2_500_000_000) is Due.MEMORY
    assert clock.at_boundary(step_ns=500_000_000) is None, "a short step fits: the save waits"
    assert not clock.pressing() and not clock.urgent()


def test_inside_a_step_memory_presses_then_cannot_wait(fake_time: FakeTime) -> None:
    clock = _clock(fake_time)
    _learn_rate(clock, fake_time, events_per_second=10_000)
    saves = MidStepSaves(clock, save=lambda: None, pending_events=lambda: 0, has_steps=lambda: True)
    fake_time.advance(3.75)  # 86.25 MB: past 80% of the cap (83.9 MB)
    assert clock.pressing() and not clock.urgent()
    assert saves.wanted() is Ask.QUIET, "pressing: at a moment with no layer or region open"
    fake_time.advance(0.5)  # 97.75 MB: past 90% (94.4 MB)
    assert saves.wanted() is Ask.URGENT
    assert clock.seconds_until_pressing() == 0.0


def test_dlprofs_own_slices_count_as_memory(fake_time: FakeTime) -> None:
    clock = _clock(fake_time, cap_mib=1, grows=False)
    slices = int(0.9 * MIB / SLICE_BYTES) + 1
    assert not clock.urgent(slices - 2) and clock.urgent(slices)


def test_before_any_save_the_process_growth_while_torch_records_counts_its_events(fake_time: FakeTime) -> None:
    memory = FakeMemory()
    clock = _clock(fake_time, memory=memory)
    memory.bytes += 10 * MIB
    fake_time.advance(0.1)  # the memory is read at most every 50 ms
    assert clock.framework_events() == pytest.approx(10 * MIB / RECORDING_BYTES_PER_EVENT)
    # Once a save has measured the event rate, growth is no longer taken for events (on a GPU
    # the process grows for reasons not dlprof's), unless it passes the whole cap.
    _learn_rate(clock, fake_time, events_per_second=100)
    memory.bytes += 60 * MIB
    fake_time.advance(0.1)
    assert clock.framework_events() < 100, "the rate's 9 events, not 60 MiB of growth"
    assert not clock.urgent()
    memory.bytes += 50 * MIB
    fake_time.advance(0.1)
    assert clock.urgent(), "the process grew past the whole cap since the last save"


def test_saves_by_time_stay_within_the_pause_budget(fake_time: FakeTime) -> None:
    clock = _clock(fake_time, cap_mib=100_000, seconds=10.0)
    # The first save, a second in: it learns 1,000 events a second, and 10 us per event.
    _learn_rate(clock, fake_time, events_per_second=1_000, pause_s=0.01)
    fake_time.advance(10.0)  # 10,000 events: a 100 ms save; 2% of 11 s is 220 ms
    assert clock.due_by_time() is Due.TIME
    clock.begin_save()
    clock.saved(10_000, 0, 2_000_000_000)  # that save took 2 s (200 us an event)
    fake_time.advance(10.0)  # the next would take 2 s more: 4.01 s of pauses in 21 s is past 2%
    assert clock.due_by_time() is None and clock.at_boundary() is None
    assert clock.deferred == 1
    fake_time.advance(1.0)
    assert clock.due_by_time() is None and clock.deferred == 1, "deferred once per stretch"
    fake_time.advance(400.0)  # 2% of 421 s: room for both
    assert clock.due_by_time() is None, "so many events now that the save would take 82 s"
    assert clock.saves == 2


def test_the_first_save_comes_a_second_into_recording(fake_time: FakeTime) -> None:
    clock = _clock(fake_time)
    fake_time.advance(0.9)
    assert clock.at_boundary() is None
    fake_time.advance(0.2)
    assert clock.at_boundary() is Due.FIRST
    clock.begin_save()
    fake_time.advance(0.05)
    clock.saved(500, 20, 50_000_000)
    assert clock.longest_between_saves_ns == 1_150_000_000
    assert clock.at_boundary() is None


def test_a_program_without_steps_is_saved_at_quiet_moments_once_it_has_none(fake_time: FakeTime) -> None:
    clock = _clock(fake_time, seconds=10.0, grows=False)
    steps = MidStepSaves(clock, save=lambda: None, pending_events=lambda: 0, has_steps=lambda: True)
    stepless = MidStepSaves(clock, save=lambda: None, pending_events=lambda: 0, has_steps=lambda: False)
    fake_time.advance(0.5)
    assert stepless.wanted() is None
    fake_time.advance(0.6)
    assert stepless.wanted() is Ask.QUIET, "the first save, in the first step, where nothing is open"
    assert steps.wanted() is None, "a program with steps makes it at a boundary"
    clock.begin_save()
    clock.saved(100, 10, 1_000_000)
    fake_time.advance(5.0)
    assert stepless.wanted() is None, "the seconds between saves have not passed"
    fake_time.advance(6.0)
    assert stepless.wanted() is Ask.QUIET, "no step in its first save_seconds: saves by time where nothing is open"
    assert steps.wanted() is None, "a program with steps saves by time at its boundaries only"


def test_the_default_cap_is_the_smaller_of_2_gib_and_a_tenth_of_memory() -> None:
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert default_memory_cap() == min(2 << 30, memory // 10)
    assert ProfileConfig().memory_cap_bytes == default_memory_cap()


def test_a_save_interval_the_user_set_is_kept_whatever_it_costs(fake_time: FakeTime) -> None:
    clock = SaveClock(SaveLimits(seconds=1.0, memory_bytes=100_000 * MIB, pause_share=None))
    clock.begin_recording()
    _learn_rate(clock, fake_time, events_per_second=10_000, pause_s=5.0)  # a save that took 5 s
    fake_time.advance(1.0)
    assert clock.due_by_time() is Due.TIME
    assert ProfileConfig().pause_share == 0.02 and save_policy.SaveLimits().pause_share == 0.02


def test_a_step_boundary_saves_before_the_process_would_grow_past_the_cap(fake_time: FakeTime) -> None:
    """While torch.profiler records, the heap grows with the program's freed tensors, beyond what
    the events themselves hold: a boundary saves before the next step would take that growth
    past the cap, rather than memory forcing a save inside the step."""
    memory = FakeMemory()
    clock = _clock(fake_time, memory=memory)
    _learn_rate(clock, fake_time, events_per_second=10)  # the events alone hold next to nothing
    memory.bytes += 60 * MIB
    fake_time.advance(1.0)
    assert clock.at_boundary(step_ns=500_000_000) is None, "60 MiB, and 30 more in the next step"
    assert clock.at_boundary(step_ns=1_000_000_000) is Due.MEMORY, "60 more would pass 100 MiB"
    assert not clock.urgent()
