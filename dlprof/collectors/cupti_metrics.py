"""The ``cupti_metrics`` collector: GPU performance metrics over time (CUPTI PM sampling), and per kernel.

    dlprof run --collectors cupti_metrics,cupti train_cupy.py
    dlprof run --collectors cupti_metrics,torch --counters smsp__inst_executed.sum train.py

Built on ``cupti.pm_sampling`` (``dlprof[gpu]``). Metrics are Perfworks names (they contain
``__``) taken from ``ProfileConfig.counters`` (``--counters``); with none named there, the four
of :data:`DEFAULT_METRICS`. Before sampling starts, each name is checked against the GPU's chip
with ``cupti.profiler_host``. Chips differ in what they can sample: a name the chip does not
offer is replaced by the first of its equivalents that it does
(:mod:`dlprof.hardware.pm_metrics`; on GH100, the global-load count), and the note says which;
one with no equivalent on the chip is left out, the note naming the chip's related counters.
The GPU samples every :data:`SAMPLE_INTERVAL_NS` while the schedule records; a thread decodes
the hardware buffer every :data:`DRAIN_SECONDS` so that it does not overflow, and each save
writes the samples decoded so far.

What is written, per sample, to the **counters** table on device ``cuda:N`` at the sample's end:
one row per metric on track ``cupti.<metric>`` (the name actually sampled) and its length on
``cupti.sample_duration`` (:mod:`dlprof.store.pm_samples`). Per-kernel values (the **metrics**
table, ``cupti:<metric>``, method ``sampled``) are not this collector's: once the run is final,
the store shares the samples among the kernels that the ``cupti`` or ``torch`` collector
recorded (:func:`dlprof.store.pm_samples.attribute_rank`), whatever order the collectors stopped
in; this collector then notes what was attributed.

PM sample timestamps are taken to be on CUPTI's GPU timestamp clock, as activity records are, and
are mapped to epoch ns the same way (:func:`dlprof.collectors.cupti.sample_cupti_clock`).

Verified on GPU hardware only as far as the GPU check's report says: on an H200 (2026-11-27)
three of the four defaults were sampled and the fourth was refused, before equivalents were
chosen; attribution in the store has run on recorded records only.
"""

from __future__ import annotations

import importlib
import os
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from dlprof.collectors.base import CollectorContext
from dlprof.collectors.cupti import CuptiBacked, sample_cupti_clock
from dlprof.hardware.pm_metrics import DEFAULT_METRICS, equivalents, related
from dlprof.schedule import Action
from dlprof.store.manifest import ClockDomain
from dlprof.store.pm_samples import DURATION_TRACK, TRACK_PREFIX, read_summary

SAMPLE_INTERVAL_NS = 100_000  # 10k samples a second: fine enough for kernels of a few 100 us
DRAIN_SECONDS = 0.25
HARDWARE_BUFFER_BYTES = 128 * 1024 * 1024
MAX_SAMPLES_PER_DECODE = 100_000
# A Perfworks metric name: unit__counter, then optional rollups (".sum", ".avg.per_second").
PERFWORKS_NAME = re.compile(r"[a-z0-9]+__[a-z0-9_]+(\.[a-z0-9_]+)*")

PERMISSION_MESSAGE = (
    "GPU performance counters are restricted to administrators on this machine "
    "(CUPTI_ERROR_INSUFFICIENT_PRIVILEGES): an administrator enables them for all users with the "
    "NVreg_RestrictProfilingToAdminUsers=0 option of the nvidia kernel module (or run as root / "
    "with CAP_SYS_ADMIN); see https://developer.nvidia.com/ERR_NVGPUCTRPERM"
)


def is_gpu_metric(name: str) -> bool:
    """Whether a ``--counters`` name is a Perfworks GPU metric (for this collector, not perf/PAPI)."""
    return PERFWORKS_NAME.fullmatch(name) is not None


def chosen_metrics(counters: Iterable[str]) -> tuple[str, ...]:
    """The GPU metrics named among ``counters``, or :data:`DEFAULT_METRICS` when there are none."""
    named = tuple(dict.fromkeys(n for n in counters if is_gpu_metric(n)))
    return named or DEFAULT_METRICS


def chip_name(device: int) -> str:
    """The chip of CUDA device ``device`` as the profiler names it ("GA100", "GH100")."""
    cupti: Any = importlib.import_module("cupti.cupti")
    params = cupti.DeviceGetChipNameParams()
    params.struct_size = cupti.DEVICE_GET_CHIP_NAME_PARAMS_STRUCT_SIZE
    params.device_index = device
    cupti.device_get_chip_name(params.ptr)
    return str(params.p_chip_name)


@dataclass(frozen=True)
class MetricInfo:
    """One metric of a chip: what ``profiler_host`` says about it."""

    name: str
    description: str
    unit: str


def check_metrics(chip: str, metrics: Sequence[str]) -> tuple[list[MetricInfo], dict[str, str]]:
    """Which metrics the chip's PM sampling can collect, with their properties, and why not the rest.

    Args:
        chip: the chip name (:func:`chip_name`).
        metrics: Perfworks metric names.

    Returns:
        The metrics that pass with their description and unit, and the others with the reason.
    """
    host_module: Any = importlib.import_module("cupti.profiler_host")
    host = host_module.ProfilerHost(chip, host_module.ProfilerType.PM_SAMPLING)
    host.initialize()
    valid: list[MetricInfo] = []
    invalid: dict[str, str] = {}
    try:
        for name in metrics:
            try:
                properties = host.get_metric_properties(name)
            except ValueError as error:
                invalid[name] = str(error)
                continue
            valid.append(MetricInfo(name, str(properties.description), str(properties.hw_unit)))
    finally:
        host.deinitialize()
    return valid, invalid


def base_counters(chip: str) -> list[str]:
    """The base counter metrics the chip offers for PM sampling (names without a rollup)."""
    host_module: Any = importlib.import_module("cupti.profiler_host")
    cupti: Any = importlib.import_module("cupti.cupti")
    host = host_module.ProfilerHost(chip, host_module.ProfilerType.PM_SAMPLING)
    host.initialize()
    try:
        return [str(name) for name in host.get_base_metrics(cupti.MetricType.COUNTER)]
    finally:
        host.deinitialize()


@dataclass(frozen=True)
class MetricChoice:
    """The metrics to sample on one chip, and what to say about the others."""

    names: list[str]  # to configure, in the order asked for
    notes: list[str]  # one per name replaced by an equivalent or left out


def choose_metrics(chip: str, wanted: Sequence[str], valid: Iterable[str], invalid: dict[str, str],
                   offered: Sequence[str] = ()) -> MetricChoice:
    """For each wanted metric, the first of its equivalents the chip offers.

    Args:
        chip: the chip's name, for the notes.
        wanted: the metrics asked for (the defaults, or ``--counters``).
        valid: every name the chip's profiler host accepted.
        invalid: names it refused, with its reason.
        offered: the chip's base counters, to name related ones when no equivalent is offered.
    """
    accepted = set(valid)
    names: list[str] = []
    notes: list[str] = []
    for name in wanted:
        taken = next((other for other in equivalents(name) if other in accepted and other not in names), None)
        why = invalid.get(name, "not offered")
        if taken == name:
            names.append(name)
        elif taken is not None:
            names.append(taken)
            notes.append(f"{taken} sampled in place of {name} ({why})")
        else:
            tried = [other for other in equivalents(name) if other != name]
            near = related(name, list(offered))
            notes.append(f"{name} left out: {why}" + (f"; nor is {', '.join(tried)} offered on {chip}" if tried else "")
                         + (f"; related counters {chip} offers: {', '.join(near[:8])}" if near else ""))
    return MetricChoice(names, notes)


def samples_to_counters(start: np.ndarray, end: np.ndarray, values: np.ndarray,
                        metrics: Sequence[str], device: int, clock_offset_ns: int, pid: int) -> pa.Table:
    """PM samples as counters-table rows, at each sample's end: one per metric, and its length.

    Args:
        start: sample starts, CUPTI clock ns.
        end: sample ends, CUPTI clock ns.
        values: (samples, metrics) metric values.
        metrics: the metric names, in ``values``' column order.
        device: the CUDA device index.
        clock_offset_ns: added to CUPTI timestamps to reach epoch ns.
        pid: the profiled process.

    Returns:
        Rows with track ``cupti.<metric>`` (unit count), then :data:`DURATION_TRACK` (unit ns),
        track-major.
    """
    n_samples, n_metrics = len(start), len(metrics)
    columns = np.column_stack([np.asarray(values, dtype=np.float64).reshape(n_samples, n_metrics),
                               np.asarray(end, dtype=np.int64) - np.asarray(start, dtype=np.int64)])
    n_tracks = n_metrics + 1
    n = n_samples * n_tracks
    tracks = pa.DictionaryArray.from_arrays(
        pa.array(np.repeat(np.arange(n_tracks, dtype=np.int32), n_samples)),
        pa.array([TRACK_PREFIX + m for m in metrics] + [DURATION_TRACK], pa.string()))
    units = pa.DictionaryArray.from_arrays(
        pa.array(np.repeat(np.array([0] * n_metrics + [1], dtype=np.int32), n_samples)),
        pa.array(["count", "ns"], pa.string()))
    return pa.table({
        "pid": pa.array(np.full(n, pid, dtype=np.int64)),
        "device": pa.array([f"cuda:{device}"] * n, pa.string()).dictionary_encode(),
        "track": tracks,
        "ts_ns": pa.array(np.tile(np.asarray(end, dtype=np.int64) + clock_offset_ns, n_tracks)),
        "value": pa.array(columns.T.reshape(-1)),
        "unit": units,
    })


@dataclass
class _Device:
    """One GPU's PM sampling session and what its drain thread decoded since the last save."""

    index: int
    chip: str
    sampler: Any  # cupti.pm_sampling.Collector
    metrics: list[str]
    running: bool = False
    starts: list[np.ndarray] = field(default_factory=list)
    ends: list[np.ndarray] = field(default_factory=list)
    values: list[np.ndarray] = field(default_factory=list)
    samples: int = 0  # written so far


class PmSamplingCollector(CuptiBacked):
    name = "cupti_metrics"
    description = "CUPTI PM sampling: GPU metrics over time, and per kernel by attribution"
    cupti_module = "cupti.pm_sampling"
    # Early, so that sampling covers the other collectors' start and stop.
    start_order = 10

    def start(self, context: CollectorContext) -> None:
        self._context = context
        self._devices: list[_Device] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._cupti: Any = importlib.import_module("cupti.cupti")
        pm_sampling: Any = importlib.import_module("cupti.pm_sampling")
        metrics = chosen_metrics(context.config.counters)
        for index in range(self._device_count()):
            device = self._open(pm_sampling, index, metrics)
            if device is not None:
                self._devices.append(device)
        if not self._devices:
            self.active = False
            return
        offset, uncertainty = sample_cupti_clock(self._cupti.get_timestamp)
        self._offset_ns = offset
        context.clocks.append(ClockDomain(
            name="cupti_pm_sampling",
            method="PM sample timestamps + (time_ns - cupti.get_timestamp) sampled at start",
            offset_ns=offset, bounds_ns=(offset - uncertainty, offset + uncertainty)))
        self._thread = threading.Thread(target=self._drain_loop, name="dlprof-pm-sampling", daemon=True)
        self._thread.start()
        if context.action.records:
            self._sample(True)

    def _device_count(self) -> int:
        driver: Any = importlib.import_module("cuda.bindings.driver")
        driver.cuInit(0)
        error, count = driver.cuDeviceGetCount()
        if int(error) != 0:
            self.notes.append(f"cuDeviceGetCount failed: {error}")
            return 0
        return int(count)

    def _choose(self, index: int, metrics: Sequence[str]) -> tuple[str, list[str]] | None:
        """The device's chip and the metrics to sample on it (notes say what was replaced)."""
        try:
            chip = chip_name(index)
            candidates = list(dict.fromkeys(other for name in metrics for other in equivalents(name)))
            valid, invalid = check_metrics(chip, candidates)
        except Exception as error:  # noqa: BLE001  the device is left out, with CUPTI's reason
            self.notes.append(f"cuda:{index}: metrics not checked: {type(error).__name__}: {error}")
            return None
        accepted = [m.name for m in valid]
        offered: list[str] = []
        if any(not set(equivalents(name)) & set(accepted) for name in metrics):
            try:
                offered = base_counters(chip)
            except Exception as error:  # noqa: BLE001  only the note's list of related counters is lost
                self.notes.append(f"cuda:{index} ({chip}): its counters not listed: {type(error).__name__}: {error}")
        choice = choose_metrics(chip, metrics, accepted, invalid, offered)
        self.notes.extend(f"cuda:{index} ({chip}): {note}" for note in choice.notes)
        return (chip, choice.names) if choice.names else None

    def _open(self, pm_sampling: Any, index: int, metrics: Sequence[str]) -> _Device | None:
        """Choose the metrics for the device's chip, then enable and configure its sampler."""
        chosen = self._choose(index, metrics)
        if chosen is None:
            return None
        chip, names = chosen
        sampler = pm_sampling.Collector(device_index=index)
        try:
            sampler.enable()
        except PermissionError:
            self.notes.append(PERMISSION_MESSAGE)
            return None
        except Exception as error:  # noqa: BLE001
            self.notes.append(f"cuda:{index}: PM sampling not enabled: {type(error).__name__}: {error}")
            return None
        try:
            self._configure(pm_sampling, sampler, names)
        except Exception as error:  # noqa: BLE001
            sampler.disable()
            self.notes.append(f"cuda:{index} ({chip}): PM sampling not configured: {error}")
            return None
        self.notes.append(f"cuda:{index} ({chip}): sampling {', '.join(names)} every "
                          f"{SAMPLE_INTERVAL_NS} ns while the schedule records")
        return _Device(index, chip, sampler, names)

    def _configure(self, pm_sampling: Any, sampler: Any, names: list[str]) -> None:
        sampler.configure(metrics=names, hardware_buffer_size=HARDWARE_BUFFER_BYTES,
                          sampling_interval=SAMPLE_INTERVAL_NS,
                          trigger_mode=pm_sampling.TriggerMode.GPU_TIME_INTERVAL)

    # --- sampling and draining ------------------------------------------------------------

    def _sample(self, on: bool) -> None:
        with self._lock:
            for device in self._devices:
                if on and not device.running:
                    device.sampler.start()
                elif not on and device.running:
                    device.sampler.stop()
                device.running = on

    def on_step(self, step: int, previous: Action, action: Action) -> None:
        """Sample only in the schedule's recording steps."""
        if self._devices:
            self._sample(action.records)

    def _drain_loop(self) -> None:
        while not self._stopping.wait(DRAIN_SECONDS):
            self._drain()

    def _drain(self) -> None:
        """Decode each device's hardware buffer and keep the samples as arrays."""
        with self._lock:
            for device in self._devices:
                try:
                    data = device.sampler.decode(MAX_SAMPLES_PER_DECODE)
                except Exception as error:  # noqa: BLE001  noted once; the thread goes on
                    note = f"cuda:{device.index}: decoding failed: {type(error).__name__}: {error}"
                    if note not in self.notes:
                        self.notes.append(note)
                    continue
                samples = list(data)  # evaluates each completed sample's metrics on the host
                if not samples:
                    continue
                device.starts.append(np.array([x.start_timestamp for x in samples], dtype=np.int64))
                device.ends.append(np.array([x.end_timestamp for x in samples], dtype=np.int64))
                device.values.append(np.array([x.metric_values for x in samples], dtype=np.float64))

    def save(self) -> None:
        """Decode what the GPU has sampled so far and write every sample since the last save."""
        if not self._devices:
            return
        self._drain()
        pid = os.getpid()
        with self._lock:
            for device in self._devices:
                if not device.starts:
                    continue
                start, end = np.concatenate(device.starts), np.concatenate(device.ends)
                values = np.concatenate(device.values)
                device.starts, device.ends, device.values = [], [], []
                device.samples += len(start)
                self._context.sink.append_counters(
                    samples_to_counters(start, end, values, device.metrics, device.index, self._offset_ns, pid),
                    "pm_sampling")

    def stop(self) -> None:
        if not self._devices:
            return
        self._sample(False)
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
        self.save()
        for device in self._devices:
            device.sampler.disable()
            if not device.samples:
                self.notes.append(f"cuda:{device.index}: no completed samples")

    def after_conversions(self) -> None:
        """The run is final and its samples attributed: say what was done, per device."""
        if not self._devices:
            return
        summary = read_summary(self._context.run_dir, self._context.config.rank)
        if summary is not None:
            self.notes.extend(summary.notes())


COLLECTOR = PmSamplingCollector
