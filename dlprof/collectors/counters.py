"""The ``counters`` collector: CPU counters per step and per region (perf_event), and backend probes.

    dlprof run --counters task-clock,page-faults --counter-scope thread train.py
    with dlprof.profile(counters=["task-clock"]) as prof: ...

The collector opens the counters named in ``ProfileConfig.counters`` at start and installs its
:meth:`CountersCollector.read` as the session's counter reader; the session reads it at step and
region boundaries and writes the deltas as metrics rows ``perf:<name>``. PAPI preset names
(``PAPI_TOT_INS``, ``PAPI_TOT_CYC``...) are counted with PAPI (python-papi's low-level API, in the
thread that starts the session) as ``papi:<name>``. A counter that cannot be counted here is
reported once (stderr and the manifest's collector notes) and the run goes on without it. :func:`backend_status` says, per backend (perf_event, PAPI, CUPTI, NVML), whether it
can count here and, if not, why in one line.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from dlprof.collectors.base import Collector, CollectorContext
from dlprof.collectors.cupti_metrics import is_gpu_metric
from dlprof.store.counter_deltas import CounterReading, unobserved_ns
from dlprof.support.perf_event import BACKEND, EVENTS, CounterInfo, PerfCounters, supported

METRIC_PREFIX = "perf:"
PAPI_PREFIX = "papi:"
PAPI_NAME = re.compile(r"PAPI_[A-Z0-9_]+")


@dataclass(frozen=True)
class BackendStatus:
    """One counter backend: can it count here, and if not, why."""

    name: str
    available: bool
    reason: str = ""


def _not_installed(package: str, extra: str) -> str:
    return f"{package} is not installed (pip install 'dlprof[{extra}]')"


def papi_unusable() -> str:
    """Why PAPI cannot count here ("" when it can): python-papi missing, or every component disabled.

    Initialises the library (idempotent). The reason is PAPI's own: each component's
    ``disabled_reason`` (on a VM without a PMU: ``perf_event: Unknown libpfm4 related error``).
    """
    if importlib.util.find_spec("pypapi") is None:
        return _not_installed("python-papi", "papi")
    try:
        papi: Any = importlib.import_module("pypapi.papi_low")
        papi.library_init()
        components = [papi.get_component_info(i) for i in range(papi.num_components())]
    except Exception as error:  # noqa: BLE001  any failure of the library is the one-line reason
        return f"PAPI does not initialise: {type(error).__name__}: {error}"
    if any(not c.disabled for c in components):
        return ""
    disabled = "; ".join(f"{c.name}: {c.disabled_reason}" for c in components)
    return f"every PAPI component is disabled ({disabled or 'none compiled in'})"


# Common PAPI presets ``dlprof counters`` lists; any PAPI_* preset name can be asked for.
PAPI_EVENTS = {
    "PAPI_TOT_INS": "instructions completed",
    "PAPI_TOT_CYC": "total cycles",
    "PAPI_L1_DCM": "level-1 data cache misses",
    "PAPI_L2_TCM": "level-2 cache misses",
    "PAPI_BR_MSP": "mispredicted conditional branches",
    "PAPI_FP_OPS": "floating-point operations",
}


def papi_events() -> list[CounterInfo]:
    """The common PAPI presets, each with whether PAPI can count it here and, if not, why."""
    reason = papi_unusable()
    infos = []
    for name, description in PAPI_EVENTS.items():
        why = reason
        if not why:
            papi: Any = importlib.import_module("pypapi.papi_low")
            try:
                answer = papi.query_named_event(name)
                code = answer[0] if isinstance(answer, tuple) else 0
            except Exception as error:  # noqa: BLE001
                code, why = -1, f"{type(error).__name__}: {error}"
            if code < 0 and not why:
                why = f"PAPI cannot count it here (PAPI error {code})"
        infos.append(CounterInfo(name, "PAPI", description, "count", not why, why))
    return infos


def papi_status() -> BackendStatus:
    """PAPI through python-papi: it disables its perf_event component where there is no PMU."""
    reason = papi_unusable()
    if reason:
        return BackendStatus("PAPI", False, reason)
    return BackendStatus("PAPI", True, "counts PAPI_* preset events (dlprof run --counters PAPI_TOT_INS)")


@dataclass
class PapiCounters:
    """PAPI preset events in one event set, counting the thread that opens it (low-level API)."""

    asked: tuple[str, ...]
    names: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    _eventset: int | None = None

    def __post_init__(self) -> None:
        if not self.asked:
            return
        reason = papi_unusable()
        if reason:
            self.failed = dict.fromkeys(self.asked, reason)
            return
        papi: Any = importlib.import_module("pypapi.papi_low")
        self._papi = papi
        eventset = int(papi.create_eventset())
        for name in self.asked:
            try:
                papi.add_event(eventset, papi.event_name_to_code(name))
            except Exception as error:  # noqa: BLE001  PapiError and kin: PAPI's reason
                self.failed[name] = f"PAPI: {type(error).__name__}: {error}"
            else:
                self.names.append(name)
        if self.names:
            try:
                papi.start(eventset)
            except Exception as error:  # noqa: BLE001
                self.failed.update(dict.fromkeys(self.names, f"PAPI: {type(error).__name__}: {error}"))
                self.names = []
        if not self.names:
            papi.cleanup_eventset(eventset)
            papi.destroy_eventset(eventset)
            return
        self._eventset = eventset

    def read(self) -> tuple[int, ...]:
        """One value per counted name, counted since start."""
        if self._eventset is None:
            return ()
        return tuple(int(v) for v in self._papi.read(self._eventset))

    def close(self) -> None:
        if self._eventset is None:
            return
        eventset, self._eventset = self._eventset, None
        self._papi.stop(eventset)
        self._papi.cleanup_eventset(eventset)
        self._papi.destroy_eventset(eventset)


def cupti_status() -> BackendStatus:
    if importlib.util.find_spec("cupti") is None:
        return BackendStatus("CUPTI", False, _not_installed("cupti-python", "gpu"))
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return BackendStatus("CUPTI", False, "no CUDA driver (libcuda.so.1 not found); without it "
                             "cupti-python cannot load CUPTI, not even to list a chip's metrics")
    return BackendStatus("CUPTI", True, "samples GPU metrics with --collectors cupti_metrics "
                         "(--counters smsp__inst_executed.sum,...)")


def nvml_status() -> BackendStatus:
    """NVML through nvidia-ml-py: the ``nvml`` sampler collector (read-only)."""
    from dlprof.collectors.nvml import NvmlCollector

    ok, reason = NvmlCollector.available()
    if not ok:
        return BackendStatus("NVML", False, reason.replace("pynvml is", "nvidia-ml-py is"))
    return BackendStatus("NVML", True, "samples GPUs with --collectors nvml (not per region)")


def rapl_status() -> BackendStatus:
    """RAPL through perf_event's power PMU: the ``rapl`` sampler collector."""
    from dlprof.collectors.rapl import RaplCollector

    ok, reason = RaplCollector.available()
    if not ok:
        return BackendStatus("RAPL", False, reason.removeprefix("RAPL: "))
    return BackendStatus("RAPL", True, "samples CPU package energy with --collectors rapl (joules per step)")


def backend_status() -> list[BackendStatus]:
    """Every counter backend, perf_event first."""
    ok, reason = supported()
    return [BackendStatus(BACKEND, ok, reason), papi_status(), cupti_status(), nvml_status(), rapl_status()]


class CountersCollector(Collector):
    name = "counters"
    description = "CPU counters per step and region through Linux perf_event_open and PAPI"
    # First: the collectors after it find its counter reader in the context when they start.
    start_order = 0

    @classmethod
    def available(cls) -> tuple[bool, str]:
        return supported()

    def start(self, context: CollectorContext) -> None:
        config = context.config
        # GPU metrics (Perfworks names) are the cupti_metrics collector's, not CPU counters.
        perf_names = [n for n in config.counters if not PAPI_NAME.fullmatch(n) and not is_gpu_metric(n)]
        papi_names = tuple(n for n in config.counters if PAPI_NAME.fullmatch(n))
        self._counters = PerfCounters(perf_names, config.counter_scope)
        self._tid = threading.get_native_id()
        if papi_names and config.counter_scope != "thread":
            self._papi = PapiCounters(())
            self._papi.failed = dict.fromkeys(papi_names, "PAPI counts in thread scope only")
        else:
            self._papi = PapiCounters(papi_names)
        for name, why in {**self._counters.failed, **self._papi.failed}.items():
            note = f"{name}: not counted: {why}"
            self.notes.append(note)
            print(f"dlprof: counter {note}", file=sys.stderr)
        mode = ", user mode only" if self._counters.user_only else ""
        for name in self._counters.names:
            self.notes.append(f"{name}: {BACKEND}, {config.counter_scope} scope{mode}")
        for name in self._papi.names:
            self.notes.append(f"{name}: PAPI, thread scope")
        if not config.counters:
            self.notes.append("no counters asked for (--counters, profile(counters=...))")
        if self._counters.names or self._papi.names:
            context.counter_reader = self.read
            context.counter_metrics = (tuple(METRIC_PREFIX + n for n in self._counters.names)
                                       + tuple(PAPI_PREFIX + n for n in self._papi.names))
            context.counter_scope = config.counter_scope

    def read(self) -> tuple[int, ...]:
        """Counter values now; empty from another thread in thread scope (they are not its counts)."""
        if self._counters.scope == "thread" and threading.get_native_id() != self._tid:
            return ()
        if not self._papi.names:
            return self._counters.read()
        if threading.get_native_id() != self._tid:
            return ()
        perf = self._counters.read()
        papi = self._papi.read()
        return CounterReading((*perf, *papi), (*unobserved_ns(perf), *(0,) * len(papi)))

    def stop(self) -> None:
        self._counters.close()
        self._papi.close()


def known_counter(name: str) -> bool:
    """Whether ``name`` is a counter dlprof knows (countable here or not): perf names, PAPI_*,
    Perfworks GPU metrics (checked against the chip when the cupti_metrics collector starts)."""
    return name in EVENTS or PAPI_NAME.fullmatch(name) is not None or is_gpu_metric(name)


COLLECTOR = CountersCollector
