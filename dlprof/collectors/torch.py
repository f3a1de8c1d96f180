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
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dlprof.collectors.base import Collector, CollectorContext
from dlprof.collectors.kineto_cycle import CycleJob, convert_cycle
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
        self._pending: deque[CycleJob] = deque()
        self._clock_bounds: list[tuple[int, int]] = []
        self._clock_offsets: list[int] = []
        self._marker: tuple[int, int] | None = None
        self._background = _BackgroundConverter(self)
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
        while self._pending:
            self._finish(convert_cycle(self._pending.popleft()))
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
        self._pending.append(job)
        self._background.wake()

    def _finish(self, result: dict[str, Any]) -> None:
        known = {d.get("id") for d in self._context.devices}
        self._context.devices.extend(d for d in result.get("devices", []) if d.get("id") not in known)
        if result.get("clock_bounds_ns") is not None:
            self._clock_bounds.append(tuple(result["clock_bounds_ns"]))
            self._clock_offsets.append(int(result["clock_offset_ns"]))


# What Kineto prints on the process's stderr each time it starts or stops a trace.
_KINETO_CHATTER = (b"USDT:", b"STAGE:")


@contextmanager
def hide_kineto_chatter() -> Iterator[None]:
    """Hold fd 2 while Kineto starts or stops, then pass on everything but its chatter.

    Kineto writes ``USDT: ... profiler_start`` lines from C++ straight to file descriptor 2;
    anything else written meanwhile (by any thread) is shown once the moment has passed.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().splitlines(keepends=True)
                    if not line.startswith(_KINETO_CHATTER)]
            if kept:
                os.write(2, b"".join(kept))


class _BackgroundConverter:
    """Converts saved cycles one at a time in a child process at the lowest CPU priority."""

    def __init__(self, owner: TorchCollector) -> None:
        self._owner = owner
        self._wakeup = threading.Event()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="dlprof-kineto", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wakeup.set()

    def close(self) -> None:
        """Let the conversion in flight finish; the caller converts what is left."""
        self._closing = True
        self._wakeup.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            self._wakeup.wait()
            self._wakeup.clear()
            while not self._closing and len(self._owner._pending) > 0:
                job = self._owner._pending.popleft()
                self._owner._finish(_convert_in_child(job))
            if self._closing:
                return


def _convert_in_child(job: CycleJob) -> dict[str, Any]:
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    completed = subprocess.run(
        # -P: the profiled program's working directory must not shadow the child's imports.
        [sys.executable, "-P", "-m", "dlprof.collectors.kineto_cycle", job.to_json()],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if completed.returncode != 0:
        # The child failed (out of memory, killed): convert here instead, nothing is lost.
        return convert_cycle(job)
    return CycleJob.result_from_json(completed.stdout)


COLLECTOR = TorchCollector
