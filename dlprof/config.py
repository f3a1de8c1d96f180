"""How a profiling session is set up: one frozen dataclass, each field with its reason."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dlprof.schedule import Schedule

RUNS_DIR = Path("dlprof-runs")


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
    # Steps per save when no schedule is given; saves also come at the latest after
    # save_seconds, save_events events, or memory_cap_bytes / 2 of memory growth (whichever
    # first), inside a step if need be: they bound the memory profilers hold, and what a run
    # killed at any moment loses.
    flush_steps: int = 100
    save_seconds: float = 10.0
    save_events: int = 250_000
    memory_cap_bytes: int = 512 << 20
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
        return self.schedule or Schedule.every_step(self.flush_steps)
