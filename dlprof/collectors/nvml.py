"""The ``nvml`` collector: a background thread samples every NVIDIA GPU through NVML (nvidia-ml-py).

    dlprof run --collectors torch,host,nvml train.py

Every ``ProfileConfig.host_interval_s`` it reads, per GPU, utilization (GPU and memory, %),
memory used (bytes), power (W), SM clock (MHz) and temperature (C), into the counters table with
device ``cuda:<index>`` and tracks ``nvml.gpu_util``, ``nvml.mem_util``, ``nvml.memory_used``,
``nvml.power``, ``nvml.sm_clock``, ``nvml.temperature``.

Strictly read-only: it calls only ``nvmlInit``/``nvmlShutdown``, ``nvmlDeviceGetCount``,
``nvmlDeviceGetHandleByIndex`` and ``nvmlDeviceGet*`` queries; it never sets clocks, power limits,
modes or anything else on the device. A query a GPU does not support (``NVMLError_NotSupported``)
is noted once and that track is left out for that GPU.

The translation from readings to the Arrow counters table is :func:`readings_table`, a pure
function. Not verified on GPU hardware yet (the development machines have no NVIDIA driver).
"""

from __future__ import annotations

import importlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from dlprof.collectors.base import Collector, CollectorContext
from dlprof.support.sampler import PeriodicSampler

# (track, unit), in the order of Readings' fields.
TRACKS = (
    ("nvml.gpu_util", "%"),
    ("nvml.mem_util", "%"),
    ("nvml.memory_used", "bytes"),
    ("nvml.power", "W"),
    ("nvml.sm_clock", "MHz"),
    ("nvml.temperature", "C"),
)


@dataclass(frozen=True)
class Readings:
    """One GPU's values at one instant; None where the GPU does not support the query."""

    gpu_util: float | None
    mem_util: float | None
    memory_used: float | None
    power: float | None  # watts
    sm_clock: float | None
    temperature: float | None

    def values(self) -> tuple[float | None, ...]:
        return (self.gpu_util, self.mem_util, self.memory_used, self.power, self.sm_clock,
                self.temperature)


Sample = tuple[int, int, Readings]  # (ts_ns, device index, readings)


def readings_table(samples: Sequence[Sample], pid: int) -> pa.Table:
    """Samples as counters-table rows: one row per (sample, supported track), device ``cuda:<i>``."""
    devices: list[str] = []
    tracks: list[str] = []
    units: list[str] = []
    times: list[int] = []
    values: list[float] = []
    for ts_ns, index, readings in samples:
        for (track, unit), value in zip(TRACKS, readings.values(), strict=True):
            if value is None:
                continue
            devices.append(f"cuda:{index}")
            tracks.append(track)
            units.append(unit)
            times.append(ts_ns)
            values.append(float(value))
    n = len(values)
    return pa.table(
        {
            "pid": pa.array(np.full(n, pid, dtype=np.int64)),
            "device": pa.array(devices, type=pa.string()).dictionary_encode(),
            "track": pa.array(tracks, type=pa.string()).dictionary_encode(),
            "ts_ns": pa.array(times, type=pa.int64()),
            "value": pa.array(values, type=pa.float64()),
            "unit": pa.array(units, type=pa.string()).dictionary_encode(),
        }
    )


def init_error(error: BaseException) -> str:
    """``nvmlInit``'s failure as one line."""
    if type(error).__name__ == "NVMLError_LibraryNotFound":
        return "NVML library not found (no NVIDIA driver)"
    return f"nvmlInit failed: {type(error).__name__}: {error}"


def read_device(pynvml: Any, handle: Any, unsupported: set[str]) -> Readings:
    """One GPU's readings through read-only ``nvmlDeviceGet*`` queries.

    A query that fails is recorded in ``unsupported`` (by track name) and reads None.
    """

    def query(track: str, get: Callable[[], float]) -> float | None:
        if track in unsupported:
            return None
        try:
            return float(get())
        except pynvml.NVMLError:
            unsupported.add(track)
            return None

    utilization: Any = None
    if not {"nvml.gpu_util", "nvml.mem_util"} <= unsupported:
        try:
            utilization = pynvml.nvmlDeviceGetUtilizationRates(handle)
        except pynvml.NVMLError:
            unsupported.update(("nvml.gpu_util", "nvml.mem_util"))
    return Readings(
        gpu_util=None if utilization is None else float(utilization.gpu),
        mem_util=None if utilization is None else float(utilization.memory),
        memory_used=query("nvml.memory_used", lambda: pynvml.nvmlDeviceGetMemoryInfo(handle).used),
        power=query("nvml.power", lambda: pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0),
        sm_clock=query("nvml.sm_clock", lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
        temperature=query("nvml.temperature",
                          lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)),
    )


class NvmlCollector(Collector):
    name = "nvml"
    description = "NVML sampler: per-GPU utilization, memory used, power, SM clock, temperature"
    requires = ("pynvml", "gpu")
    distribution = "nvidia-ml-py"

    @classmethod
    def available(cls) -> tuple[bool, str]:
        ok, reason = super().available()
        if not ok:
            return ok, reason
        try:
            pynvml = importlib.import_module("pynvml")
        except Exception as error:  # noqa: BLE001  a broken install is the reason
            return False, f"pynvml does not import: {type(error).__name__}: {error}"
        try:
            pynvml.nvmlInit()
        except Exception as error:  # noqa: BLE001  NVMLError_* and kin: the reason
            return False, init_error(error)
        pynvml.nvmlShutdown()
        return True, ""


    def start(self, context: CollectorContext) -> None:
        self._context = context
        self._pynvml: Any = importlib.import_module("pynvml")
        self._pynvml.nvmlInit()
        count = int(self._pynvml.nvmlDeviceGetCount())
        self._handles = [self._pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self._unsupported: list[set[str]] = [set() for _ in self._handles]
        if not self._handles:
            self.notes.append("NVML sees no GPU")
        self._samples: list[Sample] = []
        self._lock = threading.Lock()
        self._sampler = PeriodicSampler(self._sample, context.config.host_interval_s, "dlprof-nvml",
                                        lambda failure: self.hook_failed("its sampler thread", failure))
        self._sampler.start()

    def _sample(self) -> None:
        now = time.time_ns()
        taken = [(now, index, read_device(self._pynvml, handle, self._unsupported[index]))
                 for index, handle in enumerate(self._handles)]
        with self._lock:
            self._samples.extend(taken)

    def stop(self) -> None:
        self._sampler.stop()
        if self._handles and not self._sampler.failed:
            self._sample()
        self.save()
        for index, unsupported in enumerate(self._unsupported):
            for track in sorted(unsupported):
                self.notes.append(f"cuda:{index}: {track} not supported by this GPU or driver")
        self._pynvml.nvmlShutdown()

    def save(self) -> None:
        with self._lock:
            samples, self._samples = self._samples, []
        if samples:
            self._context.sink.append_counters(readings_table(samples, os.getpid()), "nvml")


COLLECTOR = NvmlCollector
