"""The PyTorch collector: torch.profiler (Kineto) for ops, shapes, FLOPs, memory and GPU activity.

Kineto's results are never walked event by event in Python (``prof.events()`` costs about 71 µs
per event). At the end of each cycle Kineto writes its own Chrome trace in C++, and
:mod:`dlprof.collectors.kineto_cycle` translates it into the store, in a low-priority child
process while the program goes on, and in this process for the cycle that ends with the program.

On a machine with CUDA, kernels, memcpy and memset are recorded with their correlation to the
launching op; on a CPU-only machine only CPU ops are, and the manifest says so.
"""

from __future__ import annotations

import os
import time
import warnings
from contextlib import AbstractContextManager
from typing import Any

from dlprof.collectors.base import Collector, CollectorContext
from dlprof.collectors.kineto_cycle import CycleJob, convert_cycle
from dlprof.collectors.profiler_cycles import BackgroundConverter, hidden_chatter
from dlprof.importers.kineto import CLOCK_MARKER
from dlprof.schedule import Action
from dlprof.store.manifest import ClockDomain


class TorchCollector(Collector):
    name = "torch"
    description = "torch.profiler (Kineto): ops with shapes, FLOPs and memory; GPU kernels on CUDA"
    requires = ("torch", "torch")



    def start(self, context: CollectorContext) -> None:
        import torch
        from torch.profiler import ProfilerAction, ProfilerActivity, profile

        self._context = context
        config = context.config
        schedule = config.effective_schedule
        torch_action = {
            Action.NONE: ProfilerAction.NONE,
            Action.WARMUP: ProfilerAction.WARMUP,
            Action.RECORD: ProfilerAction.RECORD,
            Action.RECORD_AND_SAVE: ProfilerAction.RECORD_AND_SAVE,
        }
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        else:
            self.notes.append("no CUDA device: CPU ops only (no kernels, memcpy or memset)")
        self._cycle = 0
        self._clock_bounds: list[tuple[int, int]] = []
        self._clock_offsets: list[int] = []
        self._marker: tuple[int, int] | None = None
        self._background: BackgroundConverter[CycleJob] = BackgroundConverter(
            "dlprof-kineto", "dlprof.collectors.kineto_cycle", convert_cycle, self._finish
        )
        # dlprof saves every cycle itself; torch's reminder that cycles are cleared is noise here.
        warnings.filterwarnings("ignore", message=".*Profiler clears events", category=UserWarning)
        self._profiler: Any = profile(
            activities=activities,
            schedule=lambda step: torch_action[schedule.action(step)],
            on_trace_ready=self._on_trace_ready,
            record_shapes=config.record_shapes,
            profile_memory=config.profile_memory,
            with_flops=config.with_flops,
            with_stack=config.with_stack,
        )
        with hide_kineto_chatter():
            self._profiler.start()
        if context.action.records:
            self._mark_clock()

    def on_step(self, step: int, previous: Action, action: Action) -> None:
        if previous is action and action is not Action.RECORD_AND_SAVE:
            self._profiler.step()  # no start or stop: nothing to hide, no syscalls
        else:
            with hide_kineto_chatter():
                self._profiler.step()
        if action.records and (previous is Action.RECORD_AND_SAVE or not previous.records):
            self._mark_clock()

    def stop(self) -> None:
        with hide_kineto_chatter():
            self._profiler.stop()
        self._background.close()
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

    def _mark_clock(self) -> None:
        """Time an empty torch range with dlprof's clock, to map Kineto's clock onto it."""
        from torch.profiler import record_function

        before = time.perf_counter_ns()
        with record_function(CLOCK_MARKER):
            pass
        after = time.perf_counter_ns()
        offset = self._context.slices.to_epoch_ns
        self._marker = (before + offset, after + offset)

    def _on_trace_ready(self, profiler: Any) -> None:
        directory = self._context.run_dir / "kineto" / f"rank={self._context.config.rank}"
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"cycle-{self._cycle:05d}.json"
        profiler.export_chrome_trace(str(path))
        job = CycleJob(
            trace=path,
            run_dir=self._context.run_dir,
            rank=self._context.config.rank,
            cycle=self._cycle,
            pid=os.getpid(),
            marker_window_ns=self._marker,
        )
        self._cycle += 1
        self._background.submit(job)

    def _finish(self, result: dict[str, Any]) -> None:
        known = {d.get("id") for d in self._context.devices}
        self._context.devices.extend(d for d in result.get("devices", []) if d.get("id") not in known)
        if result.get("clock_bounds_ns") is not None:
            self._clock_bounds.append(tuple(result["clock_bounds_ns"]))
            self._clock_offsets.append(int(result["clock_offset_ns"]))


# What Kineto prints on the process's stderr each time it starts or stops a trace.
_KINETO_CHATTER = (b"USDT:", b"STAGE:")


def hide_kineto_chatter() -> AbstractContextManager[None]:
    """Hold fd 2 while Kineto starts or stops, then pass on everything but its chatter.

    Kineto writes ``USDT: ... profiler_start`` lines from C++ straight to file descriptor 2;
    anything else written meanwhile (by any thread) is shown once the moment has passed.
    """
    return hidden_chatter(lambda line: line.startswith(_KINETO_CHATTER))


COLLECTOR = TorchCollector
