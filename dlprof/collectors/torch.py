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
``autograd.Function``'s forward, torch.compile compiling or a compiled region running).

One process records one torch.profiler at a time. The collector does not start while the
program's own records (it says so, and the run is degraded), and when the program starts one
while dlprof's records, dlprof's recording ends there and records no more
(:mod:`dlprof.support.torch_profilers`): the program's profiler works as without dlprof, and the
run is degraded from that step on.

torch.profiler records the ops of the thread that starts it (and the threads torch starts for
it); with ``all_threads`` Kineto's ``profile_all_threads`` records every Python thread's ops, but
then records no allocations (torch 2.13), so it is asked for, not the default. Python threads the
program starts while profiling are counted, and the manifest says whether their ops were recorded.
On a machine with CUDA, kernels, memcpy and memset are recorded
with their correlation to the launching op; on a CPU-only machine only CPU ops are, and the
manifest says so.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from enum import Enum
from pathlib import Path
from typing import Any

from dlprof.collectors.base import Collector, CollectorContext
from dlprof.keys import CLOCK_MARKER
from dlprof.schedule import Action
from dlprof.store.manifest import ClockDomain, dropped_text
from dlprof.store.save_jobs import Cycle, CycleJob
from dlprof.support.chatter import hidden_chatter
from dlprof.support.dynamo import compiled_graphs, keep_out_of_dynamo, nested_codes
from dlprof.support.thread_watch import ThreadWatch
from dlprof.support.torch_features import (
    experimental_config,
    missing_apis,
    skip_python_events,
    torch_features,
)
from dlprof.support.torch_profilers import ProgramProfilers
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

        features = torch_features()
        lacking = missing_apis(features)
        if lacking is not None:
            raise RuntimeError(lacking)
        from torch.profiler import ProfilerActivity
        from torch.profiler.profiler import _KinetoProfile

        self._profiler_enabled = torch._C._autograd._profiler_enabled
        if self._profiler_enabled():
            raise ProfilerBusy(BUSY)
        self._context = context
        self._features = features
        config = context.config
        activities = [ProfilerActivity.CPU]
        self._cuda = torch.cuda.is_available()
        if self._cuda:
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
        # trace_only: Kineto skips building the event tree that only prof.events() reads (the
        # trace is the same); Python stacks need that tree. Each field only where torch has it.
        kineto_config, missing = experimental_config(features, all_threads=config.all_threads,
                                                     trace_only=not config.with_stack)
        self.notes.extend(missing)
        self._kineto: Any = _KinetoProfile(
            activities=activities,
            record_shapes=config.record_shapes,
            profile_memory=config.profile_memory,
            with_flops=config.with_flops,
            with_stack=config.with_stack,
            experimental_config=kineto_config,
        )
        self._steps: dict[str, Callable[[], None]] = {
            "prepare": self._prepare,
            "start": self._start_recording,
            "stop": self._stop_recording,
            "save": self._save_cycle,
        }
        self._all_threads = config.all_threads and features.all_threads  # asked for, and torch has it
        if self._all_threads and config.profile_memory:
            self.notes.append(ALL_THREADS_NOTE)
        self._step = 0
        self._gave_way = False  # the program's own profiler took Kineto: nothing more is recorded
        self._threads = ThreadWatch()
        # Their wrappers run inside the program's calls: a failure of theirs stops this collector.
        self._ranges = RangeCuts(on_failure=self.hook_failed)
        self._programs = ProgramProfilers(on_program_profiler=self._give_way, on_failure=self.hook_failed)
        self._ranges.install()
        self._programs.install()
        # Their wrappers run wherever the program enters a range or starts a profiler, compiled
        # code's uncompiled frames included.
        self._outside_dynamo = keep_out_of_dynamo([*nested_codes(RangeCuts.install),
                                                   *nested_codes(ProgramProfilers.install)])
        try:
            self._enter(_STATE_OF_ACTION[context.action])
        except BaseException:
            self._programs.uninstall()
            self._ranges.uninstall()
            self._threads.close()
            self._outside_dynamo.cancel()
            raise

    def on_step(self, step: int, previous: Action, action: Action) -> None:
        self._enter(_STATE_OF_ACTION[action])  # what it finds lost was lost in the step ending now
        self._step = step

    def cut(self) -> None:
        if self._state is _State.RECORDING:
            self._ranges.stopping()

    def save(self) -> None:
        if self._state is _State.RECORDING and not self._lost():
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
        self._programs.uninstall()
        self._ranges.uninstall()
        self._outside_dynamo.cancel()
        if self._ranges.splits:
            split = ", ".join(f"{name}: {n}" for name, n in self._ranges.splits.most_common(5))
            self.notes.append(f"{sum(self._ranges.splits.values())} torch range(s) open at a save were split there, "
                              f"one slice per recording they span ({split})")
        self._threads.close()
        if self._threads.failure:
            self.notes.append(f"the watch of the threads the program started stopped early ({self._threads.failure})")
        if compiled_graphs():
            self.notes.append(COMPILED_CUDA_NOTE if self._cuda else COMPILED_CPU_NOTE)
        if self._threads.names:
            names = ", ".join(sorted(set(self._threads.names))[:5])
            self.notes.append(
                f"{len(self._threads.names)} other Python thread(s) started while profiling ({names}): "
                + ("their ops recorded (all threads)" if self._all_threads
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
        if self._gave_way or self._lost():
            return
        steps = _TRANSITIONS.get((self._state, state), ())
        self._state = state
        self._run(steps)

    def _run(self, steps: tuple[str, ...]) -> None:
        if not steps:
            return
        with hide_kineto_chatter(), self._programs.own():
            for step in steps:
                try:
                    self._steps[step]()
                except BaseException:
                    # Whichever step failed (a cycle's trace not written: a full disk), Kineto
                    # no longer records: stopping it again would export a freed profile.
                    self._state = _State.IDLE
                    raise

    def _give_way(self) -> None:
        """The program prepares a torch.profiler of its own: end dlprof's recording here (saved
        as any cycle is), before the program's takes Kineto over, and record no more."""
        if self._gave_way:
            return
        self._enter(_State.IDLE)
        self._gave_way = True
        self.degraded.append(f"stopped recording at step {self._step}: the program started a torch.profiler "
                             "of its own (one process records one at a time); its torch ops from then on "
                             "are not recorded")

    def _lost(self) -> bool:
        """Whether the recording under way was ended by someone else (torch's profiler disabled
        by a call that prepared nothing): then nothing may be asked of it (its trace is gone)."""
        if self._state is not _State.RECORDING or self._profiler_enabled():
            return False
        if self._all_threads:
            # Kineto's profile_all_threads keeps its state process-wide: the thread's own flag
            # reads off while it records, so it cannot tell a recording ended by someone else.
            return False
        self._state = _State.IDLE
        self._gave_way = True
        self.degraded.append(f"stopped recording at step {self._step}: torch.profiler was stopped by the "
                             "program; the ops since the last save and from then on are not recorded")
        return True

    def _prepare(self) -> None:
        self._kineto.prepare_trace()
        # Where torch would turn every event into Python at each stop, it is told not to.
        skip_python_events(self._features, self._kineto.profiler)

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
        # Kineto says a failed write on fd 2 and raises nothing: the save says it once instead.
        with hidden_chatter(lambda line: any(words in line for words in _WRITE_FAILED)):
            self._kineto.export_chrome_trace(str(path))
        # Its results (about 1.8 kB an event) are written: free them now, not at the next
        # prepare_trace, which the run's last cycle never reaches (the finisher converting it
        # would otherwise run beside them).
        self._kineto.profiler = None
        if not path.is_file():
            raise _not_written(path)
        job = CycleJob(
            trace=path,
            rank=self._context.config.rank,
            cycle=self._cycle,
            pid=os.getpid(),
            marker_window_ns=self._marker,
        )
        self._cycle += 1
        self._context.convert(Cycle(self.name, job))


# What a compiled program's recording holds (torch 2.13): Dynamo's and Inductor's compile phases
# as ranges (their names: dynamo, inductor_compile, compile_fx_inner (dynamo_timed)...), each
# compiled call as Torch-Compiled Region, CompiledFunction and ## Call CompiledFxGraph <key> ##.
COMPILED_CPU_NOTE = (
    "torch.compile: compiled regions recorded (Torch-Compiled Region, CompiledFunction and their "
    "backward), with the ATen ops they call (extern kernels: convolutions, matmuls); Inductor's "
    "own C++ kernels (cpp_fused_*) are not recorded on a CPU unless the program sets "
    "torch._inductor.config.cpp.enable_kernel_profile = True: their time is the self time of "
    "'## Call CompiledFxGraph ##'; compiling is recorded as Dynamo's and Inductor's phases "
    "(dynamo, inductor_compile...), in the first calls")
COMPILED_CUDA_NOTE = (
    "torch.compile: compiled regions recorded (Torch-Compiled Region, CompiledFunction and their "
    "backward) with the Triton kernels Inductor launches (triton_*, named after the ops they fuse) "
    "and the ATen ops they call; compiling is recorded as Dynamo's and Inductor's phases "
    "(dynamo, inductor_compile...), in the first calls")


class ProfilerBusy(RuntimeError):
    """The program's own torch.profiler records: this process cannot record a second one."""


BUSY = ("the program's own torch.profiler is recording (one process records one at a time); "
        "profile outside it, or leave out the torch collector")
ALL_THREADS_NOTE = ("all threads: Kineto's profile_all_threads records no allocations (torch 2.13); "
                    "memory not recorded")
# What Kineto prints on the process's stderr each time it starts or stops a trace.
_KINETO_CHATTER = (b"USDT:", b"STAGE:")
# What a CUDA build of torch's Kineto prints at a save on a machine with no GPU driver (code 35:
# the driver is missing), once per process: the collector's own note already says no CUDA device.
_NO_DRIVER_CHATTER = b"gpuGetDeviceCount failed"


def is_kineto_chatter(line: bytes) -> bool:
    """Whether a line on fd 2 is Kineto's own, printed as it starts, stops or saves a trace."""
    return line.startswith(_KINETO_CHATTER) or (line.startswith(b"ERROR:") and _NO_DRIVER_CHATTER in line)


# What Kineto prints when it cannot write a trace (a full disk) or put it in place, leaving
# ``<trace>.tmp`` behind.
_WRITE_FAILED = (b"Failed to write to log file", b"Failed to rename")


def _not_written(path: Path) -> OSError:
    """The error of a trace Kineto could not write, its partial ``.tmp`` removed: ENOSPC when
    the disk has no more room than that partial file took (Kineto gives no reason)."""
    partial = path.with_name(path.name + ".tmp")
    try:
        written = partial.stat().st_size
        partial.unlink()
        room = shutil.disk_usage(path.parent).free
    except OSError:
        written, room = 0, 1 << 62  # no partial file: no sign of a full disk
    full = room <= written + (1 << 20)
    reason = os.strerror(errno.ENOSPC) if full else "torch.profiler could not write its trace"
    return OSError(errno.ENOSPC if full else errno.EIO, reason, str(path))


def hide_kineto_chatter() -> AbstractContextManager[None]:
    """Hold fd 2 while Kineto starts or stops, then pass on everything but its chatter.

    Kineto writes ``USDT: ... profiler_start`` lines from C++ straight to file descriptor 2;
    anything else written meanwhile (by any thread) is shown once the moment has passed.
    """
    return hidden_chatter(is_kineto_chatter)


COLLECTOR = TorchCollector
