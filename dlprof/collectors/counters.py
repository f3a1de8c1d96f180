"""The ``counters`` collector: CPU counters per step and per region (perf_event), and backend probes.

    dlprof run --counters task-clock,page-faults --counter-scope thread train.py
    with dlprof.profile(counters=["task-clock"]) as prof: ...

The collector opens the counters named in ``ProfileConfig.counters`` at start and installs its
:meth:`CountersCollector.read` as the session's counter reader; the session reads it at step and
region boundaries and writes the deltas as metrics rows ``perf:<name>``. A counter that cannot be
counted here is reported once (stderr and the manifest's collector notes) and the run goes on
without it. :func:`backend_status` says, per backend (perf_event, PAPI, CUPTI, NVML), whether it
can count here and, if not, why in one line.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from dataclasses import dataclass

from dlprof.collectors.base import Collector, CollectorContext
from dlprof.collectors.perf_event import BACKEND, EVENTS, PerfCounters, supported

METRIC_PREFIX = "perf:"


@dataclass(frozen=True)
class BackendStatus:
    """One counter backend: can it count here, and if not, why."""

    name: str
    available: bool
    reason: str = ""


def _not_installed(package: str, extra: str) -> str:
    return f"{package} is not installed (pip install 'dlprof[{extra}]')"


def papi_status() -> BackendStatus:
    """PAPI through python-papi: it disables its perf_event component where there is no PMU."""
    if importlib.util.find_spec("pypapi") is None:
        return BackendStatus("PAPI", False, _not_installed("python-papi", "papi"))
    try:
        papi = importlib.import_module("pypapi.papi_high")
        papi.start_counters([0x80000000 | 0x3B])  # PAPI_TOT_CYC; fails with no usable component
        papi.stop_counters()
    except Exception as error:  # noqa: BLE001  any failure of the library is the one-line reason
        return BackendStatus("PAPI", False, f"components unusable here: {type(error).__name__}: {error}")
    return BackendStatus("PAPI", True, "no PAPI counting path in dlprof yet; perf_event serves counters")


def cupti_status() -> BackendStatus:
    if importlib.util.find_spec("cupti") is None:
        return BackendStatus("CUPTI", False, _not_installed("cupti-python", "gpu"))
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return BackendStatus("CUPTI", False, "no CUDA driver (libcuda.so.1 not found)")
    return BackendStatus("CUPTI", False, "no CUPTI counter collector in dlprof yet")


def nvml_status() -> BackendStatus:
    if importlib.util.find_spec("pynvml") is None:
        return BackendStatus("NVML", False, _not_installed("nvidia-ml-py", "gpu"))
    try:
        pynvml = importlib.import_module("pynvml")
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except Exception as error:  # noqa: BLE001  NVMLError_LibraryNotFound and kin: the reason
        return BackendStatus("NVML", False, f"{type(error).__name__}: {error}")
    return BackendStatus("NVML", False, "no NVML counter collector in dlprof yet")


def backend_status() -> list[BackendStatus]:
    """Every counter backend, perf_event first."""
    ok, reason = supported()
    return [BackendStatus(BACKEND, ok, reason), papi_status(), cupti_status(), nvml_status()]


class CountersCollector(Collector):
    name = "counters"
    description = "CPU counters per step and region through Linux perf_event_open"

    @classmethod
    def available(cls) -> tuple[bool, str]:
        return supported()

    def start(self, context: CollectorContext) -> None:
        config = context.config
        self._counters = PerfCounters(config.counters, config.counter_scope)
        self._tid = threading.get_native_id()
        for name, why in self._counters.failed.items():
            note = f"{name}: not counted: {why}"
            self.notes.append(note)
            print(f"dlprof: counter {note}", file=sys.stderr)
        mode = ", user mode only" if self._counters.user_only else ""
        for name in self._counters.names:
            self.notes.append(f"{name}: {BACKEND}, {config.counter_scope} scope{mode}")
        if not config.counters:
            self.notes.append("no counters asked for (--counters, profile(counters=...))")
        if self._counters.names:
            context.counter_reader = self.read
            context.counter_metrics = tuple(METRIC_PREFIX + n for n in self._counters.names)
            context.counter_scope = config.counter_scope

    def read(self) -> tuple[int, ...]:
        """Counter values now; empty from another thread in thread scope (they are not its counts)."""
        if self._counters.scope == "thread" and threading.get_native_id() != self._tid:
            return ()
        return self._counters.read()

    def stop(self) -> None:
        self._counters.close()


def known_counter(name: str) -> bool:
    """Whether ``name`` is a counter dlprof knows (countable here or not)."""
    return name in EVENTS


COLLECTOR = CountersCollector
