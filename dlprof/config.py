"""How a profiling session is set up: one frozen dataclass, each field with its reason."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from dlprof.schedule import Schedule

RUNS_DIR = Path("dlprof-runs")
_CAP_CEILING = 2 << 30
DEFAULT_SAVE_SECONDS = 10.0
DEFAULT_PAUSE_SHARE = 0.02


def default_memory_cap() -> int:
    """What profiling may hold by default: the smaller of 2 GiB and a tenth of this machine's
    memory (at least 16 MiB)."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return _CAP_CEILING
    return min(_CAP_CEILING, max(16 << 20, total // 10))


def save_limits(save_seconds: float | None) -> tuple[float, float | None]:
    """ProfileConfig's save_seconds and pause_share for a --save-seconds (``save_seconds=``) the
    user set, kept whatever the saves' pauses cost, or did not (None: the default, within the
    pause budget)."""
    return (DEFAULT_SAVE_SECONDS, DEFAULT_PAUSE_SHARE) if save_seconds is None else (save_seconds, None)


@dataclass(frozen=True)
class ProfileConfig:
    """Everything a :class:`dlprof.recording.session.Session` needs to know before it starts."""

    # The run directory; None: ./dlprof-runs/<YYYYmmdd-HHMMSS>-<name>.
    out: Path | None = None
    # Names the run directory and the manifest (the script's name under `dlprof run`).
    name: str = "profile"
    # Collector names (see dlprof.collectors.registry); None: every collector in the default set.
    # Framework collectors wait for the program to import their framework.
    collectors: tuple[str, ...] | None = None
    # Which steps are recorded; None records every step.
    schedule: Schedule | None = None
    # Steps per save when no schedule is given (None: no save by count). Saves also come when
    # dlprof's own memory would pass memory_cap_bytes, at a step boundary when the next step
    # would pass it, inside a step only when it cannot wait; and every save_seconds at a step
    # boundary (dlprof.recording.save_policy). They bound the memory profilers hold, and what a
    # run killed at any moment loses.
    flush_steps: int | None = None
    save_seconds: float = DEFAULT_SAVE_SECONDS
    # At most this many events per save (None: as many as the memory cap holds).
    save_events: int | None = None
    memory_cap_bytes: int = field(default_factory=default_memory_cap)
    # Saves by time wait while their pauses would pass this share of the time recorded; None:
    # every save_seconds whatever they cost (a user who sets --save-seconds chose that).
    pause_share: float | None = DEFAULT_PAUSE_SHARE
    # Take steps from the optimizer's step() (dlprof run) rather than prof.step() only.
    auto_steps: bool = False
    # Seconds between host samples (CPU %, RSS).
    host_interval_s: float = 0.1
    # torch.profiler options: input shapes, allocations, FLOPs, Python stacks.
    record_shapes: bool = True
    profile_memory: bool = True
    with_flops: bool = True
    with_stack: bool = False
    # torch.profiler: record the ops of every Python thread, not only of the one that starts
    # profiling (Kineto's profile_all_threads, which records no allocations in torch 2.13).
    all_threads: bool = False
    # The command line recorded in the manifest.
    command: tuple[str, ...] = ()
    # This process's rank in a distributed job, and the job's size (see dlprof.distributed).
    rank: int = 0
    world_size: int = 1
    # CPU counters (perf_event names: task-clock, page-faults...) per step and region; the
    # counters collector counts them.
    counters: tuple[str, ...] = ()
    # "thread": the thread that starts the session; "process": every thread of the process.
    counter_scope: str = "thread"
    # A collector that cannot record (one asked for that cannot run here, one that fails to
    # start or stops recording) is an error, not a degraded run: at start where it is known
    # then, at the end otherwise.
    strict: bool = False

    @property
    def effective_schedule(self) -> Schedule:
        # Without flush_steps the cycles' ends are not saves (see saves_by_schedule).
        return self.schedule or Schedule.every_step(self.flush_steps or Schedule.active)

    @property
    def saves_by_schedule(self) -> bool:
        """Whether the schedule's cycles end in saves (a schedule given, or flush_steps): else
        saves come by memory and time only."""
        return self.schedule is not None or self.flush_steps is not None
