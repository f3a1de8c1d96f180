"""The PyTorch collector: torch.profiler (Kineto) for ops, shapes, FLOPs, memory and GPU activity.

The session starts it once the program has imported torch (its ``framework``), so a program that
never does (a Keras one) never runs torch.profiler. Kineto's results are never walked event by
event in Python (``prof.events()`` costs about 71 µs per event). At each save Kineto writes its
own Chrome trace in C++, which the session's finisher (:mod:`dlprof.recording.finisher`)
translates into the store with the rest of the save, in a child process while the program goes
on.

The profiler is driven by dlprof's own schedule, not torch.profiler's: each step's action puts it
in one of three states (idle, warming up, recording) through a table of transitions, and a save
cuts the recording where it stands (at a step boundary, or inside a step when the session saves
by time or memory) and starts the next one at once. The program's ``record_function`` ranges
open at a cut are ended in the recording that stops and entered again in the next
(:mod:`dlprof.support.torch_ranges`: exited later, they would write into the stopped
recording's freed buffers); no save is made inside a C++ range (an autograd node, a custom
``autograd.Function``'s forward).

torch.profiler records the ops of the thread that starts it (and the threads torch starts for
it); with ``all_threads`` Kineto's ``profile_all_threads`` records every Python thread's ops, but
then records no allocations (torch 2.13), so it is asked for, not the default. Python threads the
program starts while profiling are counted, and the manifest says whether their ops were recorded.
On a machine with CUDA, kernels, memcpy and memset are recorded
with their correlation to the launching op; on a CPU-only machine only CPU ops are, and the
manifest says so.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from enum import Enum
from typing import Any

from dlprof.collectors.base import Collector, CollectorContext
from dlprof.keys import CLOCK_MARKER
from dlprof.schedule import Action
from dlprof.store.manifest import ClockDomain, dropped_text
from dlprof.store.save_jobs import Cycle, CycleJob
from dlprof.support.chatter import hidden_chatter
from dlprof.support.thread_watch import ThreadWatch
from dlprof.support.torch_ranges import RangeCuts


class _State(Enum):
    IDLE = "idle"
    WARMING = "warming"  # Kineto prepared (its start-up cost paid), nothing kept yet
    RECORDING = "recording"


_STATE_OF_ACTION = {
    Action.NONE: _State.IDLE,
    Action.WARMUP: _State.WARMING,
    Action.RECORD: _State.RECORDING,
    Action.RECORD_AND_SAVE: _State.RECORDING,
}

# What torch.profiler must do to go from one state to another (as torch.profiler's own
# action_map): "prepare" warms Kineto up, "start" begins keeping events, "stop" ends that,
# "save" exports what was kept. Warming up and stopping without recording keeps nothing.
_TRANSITIONS: dict[tuple[_State, _State], tuple[str, ...]] = {
    (_State.IDLE, _State.WARMING): ("prepare",),
    (_State.IDLE, _State.RECORDING): ("prepare", "start"),
    (_State.WARMING, _State.RECORDING): ("start",),
    (_State.WARMING, _State.IDLE): ("start", "stop"),
    (_State.RECORDING, _State.IDLE): ("stop", "save"),
    (_State.RECORDING, _State.WARMING): ("stop", "save", "prepare"),
}
# A save while recording: cut here and prepare the next recording, which starts once dlprof's
# pause of the program is over (resume()), so that the ranges the program has open (ended at
# cut()) enter it again after the pause, not inside it.
_CUT = ("stop", "save", "prepare")


class TorchCollector(Collector):
    name = "torch"
    description = "torch.profiler (Kineto): ops with shapes, FLOPs and memory; GPU kernels on CUDA"
    requires = ("torch", "torch")
    framework = "torch"
    default = True
    cupti_priority = 0  # Kineto subscribes to CUPTI on a CUDA machine
    events_show_in_memory = True

    def start(self, context: CollectorContext) -> None:
        import torch
        from torch._C._profiler import _ExperimentalConfig
        from torch.profiler import ProfilerActivity
        from torch.profiler.profiler import _KinetoProfile

        self._context = context
        config = context.config
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        else:
            self.notes.append("no CUDA device: CPU ops only (no kernels, memcpy or memset)")
        self._cycle = 0
        self._state = _State.IDLE
        self._clock_bounds: list[tuple[int, int]] = []
        self._clock_offsets: list[int] = []
        self._dropped: dict[str, int] = {}  # Kineto events the conversions dropped as damaged, per reason
        self._marker: tuple[int, int] | None = None
        self._resuming = False  # a save stopped the recording: resume() starts the next
        # dlprof saves every cycle itself; torch's reminder that cycles are cleared is noise here.
        warnings.filterwarnings("ignore", message=".*Profiler clears events", category=UserWarning)
        self._kineto: Any = _KinetoProfile(
            activities=activities,
            record_shapes=config.record_shapes,
            profile_memory=config.profile_memory,
            with_flops=config.with_flops,
            with_stack=config.with_stack,
            # trace_only: Kineto skips building the event tree that only prof.events() reads
            # (the trace is the same); Python stacks need that tree.
            experimental_config=_ExperimentalConfig(
                profile_all_threads=config.all_threads, trace_only=not config.with_stack
            ),
        )
        self._steps: dict[str, Callable[[], None]] = {
            "prepare": self._kineto.prepare_trace,
            "start": self._start_recording,
            "stop": self._stop_recording,
            "save": self._save_cycle,
        }
        if config.all_threads and config.profile_memory:
            self.notes.append(ALL_THREADS_NOTE)
        self._threads = ThreadWatch()
        self._ranges = RangeCuts()
        self._ranges.install()
        self._enter(_STATE_OF_ACTION[context.action])

    def on_step(self, step: int, previous: Action, action: Action) -> None:
        self._enter(_STATE_OF_ACTION[action])

    def cut(self) -> None:
        if self._state is _State.RECORDING:
            self._ranges.stopping()

    def save(self) -> None:
        if self._state is _State.RECORDING:
            self._run(_CUT)
            self._resuming = True

    def resume(self) -> None:
        if self._resuming:
            self._resuming = False
            self._run(("start",))
        elif self._state is _State.RECORDING:
            self._ranges.started()  # cut() without a save (a schedule's boundary)

    def save_would_split(self) -> bool:
        return self._state is _State.RECORDING and self._ranges.inside_cpp_range()

    def stop(self) -> None:
        self._enter(_State.IDLE)
        self._ranges.uninstall()
        if self._ranges.splits:
            split = ", ".join(f"{name}: {n}" for name, n in self._ranges.splits.most_common(5))
            self.notes.append(f"{sum(self._ranges.splits.values())} torch range(s) open at a save were split there, "
                              f"one slice per recording they span ({split})")
        self._threads.close()
        if self._threads.names:
            names = ", ".join(sorted(set(self._threads.names))[:5])
            self.notes.append(
                f"{len(self._threads.names)} other Python thread(s) started while profiling ({names}): "
                + ("their ops recorded (all threads)" if self._context.config.all_threads
                   else "any torch ops they ran were not recorded (--all-threads records them, "
                        "without allocations)")
            )

    def converted(self, result: dict[str, Any]) -> None:
        for reason, count in result.get("dropped", {}).items():
            self._dropped[reason] = self._dropped.get(reason, 0) + int(count)
        known = {d.get("id") for d in self._context.devices}
        self._context.devices.extend(d for d in result.get("devices", []) if d.get("id") not in known)
        if result.get("clock_bounds_ns") is not None:
            self._clock_bounds.append(tuple(result["clock_bounds_ns"]))
            self._clock_offsets.append(int(result["clock_offset_ns"]))

    def after_conversions(self) -> None:
        if self._dropped:
            self.notes.append(f"{sum(self._dropped.values()):,} Kineto events dropped as damaged "
                              f"({dropped_text(dict(sorted(self._dropped.items())))})")
        saved = self._context.run_dir / "kineto"
        for directory in (saved / f"rank={self._context.config.rank}", saved):
            if directory.is_dir() and not any(directory.iterdir()):
                directory.rmdir()
        if self._clock_offsets:
            low = max(b[0] for b in self._clock_bounds)
            high = min(b[1] for b in self._clock_bounds)
            self._context.clocks.append(
                ClockDomain(
                    name="kineto",
                    method=f"record_function marker '{CLOCK_MARKER}' timed on both clocks",
                    offset_ns=max(self._clock_offsets, key=abs),
                    bounds_ns=(low, high),
                )
            )

    # --- the state machine ------------------------------------------------------------------

    def _enter(self, state: _State) -> None:
        steps = _TRANSITIONS.get((self._state, state), ())
        self._state = state
        self._run(steps)

    def _run(self, steps: tuple[str, ...]) -> None:
        if not steps:
            return
        with hide_kineto_chatter():
            for step in steps:
                self._steps[step]()

    def _start_recording(self) -> None:
        self._kineto.start_trace()
        self._ranges.started()
        self._mark_clock()

    def _stop_recording(self) -> None:
        self._ranges.stopping()
        self._kineto.stop_trace()

    def _mark_clock(self) -> None:
        """Time an empty torch range with dlprof's clock, to map Kineto's clock onto it."""
        from torch.profiler import record_function

        before = time.perf_counter_ns()
        with record_function(CLOCK_MARKER):
            pass
        after = time.perf_counter_ns()
        offset = self._context.slices.to_epoch_ns
        self._marker = (before + offset, after + offset)

    def _save_cycle(self) -> None:
        directory = self._context.run_dir / "kineto" / f"rank={self._context.config.rank}"
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"cycle-{self._cycle:05d}.json"
        self._kineto.export_chrome_trace(str(path))
        # Its results (about 1.8 kB an event) are written: free them now, not at the next
        # prepare_trace, which the run's last cycle never reaches (the finisher converting it
        # would otherwise run beside them).
        self._kineto.profiler = None
        job = CycleJob(
            trace=path,
            rank=self._context.config.rank,
            cycle=self._cycle,
            pid=os.getpid(),
            marker_window_ns=self._marker,
        )
        self._cycle += 1
        self._context.convert(Cycle(self.name, job))


ALL_THREADS_NOTE = ("all threads: Kineto's profile_all_threads records no allocations (torch 2.13); "
                    "memory not recorded")
# What Kineto prints on the process's stderr each time it starts or stops a trace.
_KINETO_CHATTER = (b"USDT:", b"STAGE:")


def hide_kineto_chatter() -> AbstractContextManager[None]:
    """Hold fd 2 while Kineto starts or stops, then pass on everything but its chatter.

    Kineto writes ``USDT: ... profiler_start`` lines from C++ straight to file descriptor 2;
    anything else written meanwhile (by any thread) is shown once the moment has passed.
    """
    return hidden_chatter(lambda line: line.startswith(_KINETO_CHATTER))


COLLECTOR = TorchCollector
