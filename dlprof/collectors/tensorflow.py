"""The TensorFlow collector: TensorFlow's own profiler (XPlane) for ops, Keras layers, XLA ops,
tf.data and allocator events.

The session starts this collector once the program has imported TensorFlow (its
``framework``), never importing it itself: in a PyTorch program it costs nothing. Once
TensorFlow is there, ``tf.profiler.experimental.start/stop`` run once per profiling cycle of the
session's schedule (started at a cycle's first warm-up or recorded step, stopped after its last
recorded step), each cycle into its own directory of the run. A stopped cycle's XPlane is
translated with the save that ends it by the session's finisher (:mod:`dlprof.recording.finisher`),
in a low-priority child process while the program goes on, as Kineto's traces are.

Each cycle starts with a ``dlprof::clock_sync`` TraceMe timed with dlprof's clock too: it maps
TensorFlow's timestamps onto dlprof's, and puts the events of the thread that made it (the
training loop's) on that thread's id, so they nest under its steps and regions.

Under ``dlprof run`` (``auto_steps``) every training batch of ``keras.Model.fit`` ends a step
(:mod:`dlprof.collectors.keras_steps`). ``with_stack`` cannot turn on TensorFlow's Python
tracer (:data:`WITH_STACK_NOTE`); the manifest says so.
"""

from __future__ import annotations

import importlib.metadata
import re
import threading
import time
from pathlib import Path
from typing import Any

from dlprof.collectors.base import Collector, CollectorContext
from dlprof.keys import CLOCK_MARKER
from dlprof.schedule import Action
from dlprof.store.manifest import ClockDomain, dropped_text
from dlprof.store.save_jobs import Cycle, XPlaneJob
from dlprof.support.chatter import hidden_chatter

# What TensorFlow's profiler logs on fd 2 when it starts and stops (absl INFO lines of its
# profiler sources), and absl's note that logging is not initialised.
_CHATTER = re.compile(
    rb"^(I\d{4} [\d:.]+ +\d+ \w*(profiler|tracer|save_profile|xplane)\w*\.cc:\d+\]"
    rb"|WARNING: All log messages before absl::InitializeLog)"
)
_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly")
# TensorFlow's Python binding of its profiler (tf.profiler.experimental.start) hands every
# ProfilerOptions value to C++ as a type its session manager does not accept: each option logs
# "<name> expects an i value" and is ignored, python_tracer_level among them (TensorFlow 2.21).
WITH_STACK_NOTE = ("--with-stack: TensorFlow's profiler cannot be asked for Python frames through "
                   "its Python API (it ignores ProfilerOptions); no TensorFlow frames recorded")


def is_tensorflow_chatter(line: bytes) -> bool:
    return _CHATTER.match(line) is not None


class TensorFlowCollector(Collector):
    name = "tensorflow"
    description = "TensorFlow's profiler (XPlane): ops, Keras layers, XLA ops, tf.data, allocators"
    requires = ("tensorflow", "tf")
    framework = "tensorflow"
    default = True

    @classmethod
    def version(cls) -> str:
        for distribution in _DISTRIBUTIONS:
            try:
                return importlib.metadata.version(distribution)
            except importlib.metadata.PackageNotFoundError:
                continue
        return ""

    def start(self, context: CollectorContext) -> None:
        import tensorflow

        self._context = context
        self._tf: Any = tensorflow
        self._cycle = 0
        self._logdir: Path | None = None  # the cycle being recorded, while the profiler runs
        self._warming = False  # the cycle has not reached its first recorded step
        self._keep_from_ns: int | None = None  # where its first recorded step began
        self._marker: tuple[tuple[int, int], int] | None = None
        self._clocks: list[ClockDomain] = []
        self._events = 0
        self._seconds = 0.0
        self._dropped: dict[str, int] = {}  # XPlane events the conversions dropped as damaged, per reason
        self._lock = threading.Lock()
        if context.config.with_stack:
            self.notes.append(WITH_STACK_NOTE)
        if context.action is not Action.NONE:
            self._begin(context.action)

    def on_step(self, step: int, previous: Action, action: Action) -> None:
        if action is Action.NONE and self._logdir is not None:
            self._end_cycle()
        elif action is not Action.NONE and self._logdir is None:
            self._begin(action)
        elif action.records and self._warming:
            self._warming = False
            self._keep_from_ns = self._now_ns()  # warm-up is over: keep what starts from here

    def save(self) -> None:
        """End the cycle here, and begin the next one at once if the step goes on recording."""
        if self._logdir is not None:
            self._end_cycle()
            if self._context.action is not Action.NONE:
                self._begin(self._context.action)

    def stop(self) -> None:
        if self._logdir is not None:
            self._end_cycle()

    def after_conversions(self) -> None:
        if self._clocks:
            self._context.clocks.append(_combined(self._clocks))
        if self._events:
            self.notes.append(f"{self._events} XPlane events in {self._cycle} cycle(s), converted in "
                              f"{self._seconds:.2f} s ({self._seconds / self._events * 1e6:.1f} us per event)")
        if self._dropped:
            self.notes.append(f"{sum(self._dropped.values()):,} XPlane events dropped as damaged "
                              f"({dropped_text(self._dropped)})")

    # --- cycles -------------------------------------------------------------------------

    def _begin(self, action: Action) -> None:
        profiler = self._tf.profiler.experimental
        config = self._context.config
        logdir = self._context.run_dir / "tensorflow" / f"rank={config.rank}" / f"cycle-{self._cycle:05d}"
        with hidden_chatter(is_tensorflow_chatter):
            try:
                # No ProfilerOptions: their defaults (host tracer 2, device tracer 1, Python tracer
                # off) are what is wanted, and TensorFlow's Python binding rejects every option
                # passed (see WITH_STACK_NOTE).
                profiler.start(str(logdir))
            except self._tf.errors.AlreadyExistsError as error:  # the program's own profiler
                note = f"cycle {self._cycle} not recorded: {error.message}"
                if note not in self.notes:
                    self.notes.append(note)
                return
        self._logdir = logdir
        self._warming = not action.records
        self._keep_from_ns = None
        self._mark_clock(profiler)

    def _mark_clock(self, profiler: Any) -> None:
        """Time an empty TraceMe with dlprof's clock, to map TensorFlow's clock onto it."""
        before = time.perf_counter_ns()
        with profiler.Trace(CLOCK_MARKER):
            pass
        after = time.perf_counter_ns()
        offset = self._context.slices.to_epoch_ns
        self._marker = ((before + offset, after + offset), threading.get_native_id())

    def _end_cycle(self) -> None:
        assert self._logdir is not None
        with hidden_chatter(is_tensorflow_chatter):
            self._tf.profiler.experimental.stop()
        if self._warming:  # the program ended before the cycle recorded a step: keep nothing
            self._keep_from_ns = self._now_ns()
        window, tid = self._marker if self._marker is not None else (None, None)
        config = self._context.config
        self._context.convert(Cycle(self.name, XPlaneJob(
            logdir=self._logdir, rank=config.rank, cycle=self._cycle,
            pid=self._context.slices.pid, marker_window_ns=window, marker_tid=tid,
            keep_from_ns=self._keep_from_ns,
        )))
        self._cycle += 1
        self._logdir = None
        self._marker = None

    def _now_ns(self) -> int:
        return time.perf_counter_ns() + self._context.slices.to_epoch_ns

    def converted(self, result: dict[str, Any]) -> None:
        with self._lock:  # called from the finisher's thread and from the session's stop
            self._clocks.extend(ClockDomain(**_clock_fields(c)) for c in result.get("clocks", []))
            known = {d.get("id") for d in self._context.devices}
            self._context.devices.extend(d for d in result.get("devices", []) if d.get("id") not in known)
            self._events += int(result.get("events", 0))
            self._seconds += float(result.get("seconds", 0.0))
            for reason, count in result.get("dropped", {}).items():
                self._dropped[reason] = self._dropped.get(reason, 0) + int(count)
            for problem in result.get("problems", []):
                self.notes.append(problem)


def _clock_fields(data: dict[str, Any]) -> dict[str, Any]:
    bounds = data.get("bounds_ns")
    return {**data, "bounds_ns": tuple(bounds) if bounds is not None else None}


def _combined(clocks: list[ClockDomain]) -> ClockDomain:
    """One clock domain for every cycle: the largest shift, and the bounds every cycle allows."""
    bounded = [c.bounds_ns for c in clocks if c.bounds_ns is not None]
    bounds = (max(b[0] for b in bounded), min(b[1] for b in bounded)) if bounded else None
    return ClockDomain(
        name="xplane",
        method=clocks[0].method,
        offset_ns=max((c.offset_ns for c in clocks), key=abs),
        bounds_ns=bounds,
    )


COLLECTOR = TensorFlowCollector
