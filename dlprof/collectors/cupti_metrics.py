"""The ``cupti_metrics`` collector: GPU performance metrics over time (CUPTI PM sampling), and per kernel.

    dlprof run --collectors cupti_metrics,cupti train_cupy.py
    dlprof run --collectors cupti_metrics,torch --counters smsp__inst_executed.sum train.py

Built on ``cupti.pm_sampling`` (``dlprof[gpu]``). Metrics are Perfworks names (they contain
``__``) taken from ``ProfileConfig.counters`` (``--counters``); with none named there, the four
of :data:`DEFAULT_METRICS`. Before sampling starts, each name is checked against the GPU's chip
with ``cupti.profiler_host``; a name the chip does not know is left out and said so in the
manifest. The GPU samples every :data:`SAMPLE_INTERVAL_NS` while the schedule records; a thread
decodes the hardware buffer every :data:`DRAIN_SECONDS` so that it does not overflow.

What is written:

* the **counters** table: one row per sample and metric, track ``cupti.<metric>``, device
  ``cuda:N``, at the sample's end;
* the **metrics** table: ``cupti:<metric>`` per kernel slice (method ``sampled``), the samples
  shared among kernels by proportional overlap, short kernels pooled per name
  (:mod:`dlprof.store.sample_attribution` says how, and where the method is weak).
  The kernels are those the ``cupti`` or ``torch`` collector recorded in the same run; this
  collector is stopped after them (the session starts it first) and reads their slices back.

PM sample timestamps are taken to be on CUPTI's GPU timestamp clock, as activity records are, and
are mapped to epoch ns the same way (:func:`dlprof.collectors.cupti.sample_cupti_clock`).

Not verified on GPU hardware: the development machines have no NVIDIA driver, and without
``libcuda.so.1`` neither cupti-python (it asks the driver for its version before loading CUPTI)
nor ``libcupti`` itself (``cuptiProfilerHostGetSupportedChips`` returns CUPTI_ERROR_UNKNOWN) will
run even the host-side metric queries.
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
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dlprof.collectors.base import CollectorContext
from dlprof.collectors.cupti import CuptiBacked, sample_cupti_clock
from dlprof.keys import Kind, StoreTable
from dlprof.schedule import Action
from dlprof.store.manifest import ClockDomain
from dlprof.store.sample_attribution import Attribution, attribute_samples
from dlprof.store.writer import CHUNK_GLOB, rank_dir

DEFAULT_METRICS = (
    "smsp__inst_executed.sum",
    "sm__warps_active.sum",
    "sm__cycles_active.sum",
    "smsp__inst_executed_op_global_ld.sum",
)
SAMPLE_INTERVAL_NS = 100_000  # 10k samples a second: fine enough for kernels of a few 100 us
DRAIN_SECONDS = 0.25
HARDWARE_BUFFER_BYTES = 128 * 1024 * 1024
MAX_SAMPLES_PER_DECODE = 100_000
TRACK_PREFIX = "cupti."
METRIC_PREFIX = "cupti:"
SAMPLED = "sampled"
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


def chip_counters(chip: str) -> list[MetricInfo]:
    """Every base counter metric of the chip, as ``.sum`` (a count over each sample), described."""
    host_module: Any = importlib.import_module("cupti.profiler_host")
    host = host_module.ProfilerHost(chip, host_module.ProfilerType.PM_SAMPLING)
    host.initialize()
    try:
        names = host.get_base_metrics(host_module.MetricType.COUNTER)
    finally:
        host.deinitialize()
    valid, _ = check_metrics(chip, [f"{name}.sum" for name in names])
    return valid


def samples_to_counters(start: np.ndarray, end: np.ndarray, values: np.ndarray,
                        metrics: Sequence[str], device: int, clock_offset_ns: int, pid: int) -> pa.Table:
    """PM samples as counters-table rows: one per sample and metric, at the sample's end.

    Args:
        start: sample starts, CUPTI clock ns (unused but for the shape: the end marks a sample).
        end: sample ends, CUPTI clock ns.
        values: (samples, metrics) metric values.
        metrics: the metric names, in ``values``' column order.
        device: the CUDA device index.
        clock_offset_ns: added to CUPTI timestamps to reach epoch ns.
        pid: the profiled process.

    Returns:
        Rows with track ``cupti.<metric>``, metric-major.
    """
    n_samples, n_metrics = len(start), len(metrics)
    n = n_samples * n_metrics
    tracks = pa.DictionaryArray.from_arrays(
        pa.array(np.repeat(np.arange(n_metrics, dtype=np.int32), n_samples)),
        pa.array([TRACK_PREFIX + m for m in metrics], pa.string()))
    return pa.table({
        "pid": pa.array(np.full(n, pid, dtype=np.int64)),
        "device": pa.array([f"cuda:{device}"] * n, pa.string()).dictionary_encode(),
        "track": tracks,
        "ts_ns": pa.array(np.tile(np.asarray(end, dtype=np.int64) + clock_offset_ns, n_metrics)),
        "value": pa.array(np.asarray(values, dtype=np.float64).reshape(n_samples, n_metrics).T.reshape(-1)),
        "unit": pa.array(["count"] * n, pa.string()).dictionary_encode(),
    })


def kernel_metrics(slice_ids: np.ndarray, attribution: Attribution, metrics: Sequence[str]) -> pa.Table:
    """Per-kernel values as metrics-table rows ``cupti:<metric>``, method ``sampled``."""
    n_kernels, n_metrics = len(slice_ids), len(metrics)
    n = n_kernels * n_metrics
    return pa.table({
        "slice_id": pa.array(np.tile(np.asarray(slice_ids, dtype=np.int64), n_metrics)),
        "metric": pa.DictionaryArray.from_arrays(
            pa.array(np.repeat(np.arange(n_metrics, dtype=np.int32), n_kernels)),
            pa.array([METRIC_PREFIX + m for m in metrics], pa.string())),
        "value": pa.array(attribution.kernel_values.T.reshape(-1)),
        "scope": pa.array(["kernel"] * n, pa.string()).dictionary_encode(),
        "method": pa.array([SAMPLED] * n, pa.string()).dictionary_encode(),
    })


def read_kernels(run_dir: Any, rank: int, device: int) -> pa.Table:
    """The kernel slices of one device written so far in this rank's chunks: id, name, start, end."""
    columns = ["id", "kind", "device", "name", "start_ns", "dur_ns"]
    paths = sorted(rank_dir(run_dir, StoreTable.SLICES, rank).glob(CHUNK_GLOB))
    strings = {"kind", "device", "name"}
    tables = []
    for path in paths:
        table = pq.read_table(path, columns=columns)
        # Chunks dictionary-encode their strings each with its own dictionary: plain strings join.
        tables.append(pa.table({c: table[c].cast(pa.string()) if c in strings else table[c] for c in columns}))
    if not tables:
        return pa.table({c: pa.array([], pa.string() if c in strings else pa.int64()) for c in columns})
    table = pa.concat_tables(tables)
    mask = pc.and_(pc.equal(table["kind"], str(Kind.KERNEL)), pc.equal(table["device"], f"cuda:{device}"))
    return table.filter(mask).sort_by("start_ns")


@dataclass
class _Device:
    """One GPU's PM sampling session and what its drain thread decoded so far."""

    index: int
    chip: str
    sampler: Any  # cupti.pm_sampling.Collector
    metrics: list[str]
    running: bool = False
    starts: list[np.ndarray] = field(default_factory=list)
    ends: list[np.ndarray] = field(default_factory=list)
    values: list[np.ndarray] = field(default_factory=list)


class PmSamplingCollector(CuptiBacked):
    name = "cupti_metrics"
    description = "CUPTI PM sampling: GPU metrics over time, and per kernel by attribution"
    cupti_module = "cupti.pm_sampling"
    # Early, so that it stops after the collectors whose kernels its samples are shared among.
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

    def _open(self, pm_sampling: Any, index: int, metrics: Sequence[str]) -> _Device | None:
        """Check the metrics against the device's chip, then enable and configure its sampler."""
        try:
            chip = chip_name(index)
            valid, invalid = check_metrics(chip, metrics)
        except Exception as error:  # noqa: BLE001  the device is left out, with CUPTI's reason
            self.notes.append(f"cuda:{index}: metrics not checked: {type(error).__name__}: {error}")
            return None
        for name, why in invalid.items():
            self.notes.append(f"cuda:{index} ({chip}): {name} left out: {why}")
        if not valid:
            return None
        names = [m.name for m in valid]
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

    def stop(self) -> None:
        if not self._devices:
            return
        self._sample(False)
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
        self._drain()
        pid = os.getpid()
        for device in self._devices:
            device.sampler.disable()
            if not device.starts:
                self.notes.append(f"cuda:{device.index}: no completed samples")
                continue
            start, end = np.concatenate(device.starts), np.concatenate(device.ends)
            values = np.concatenate(device.values)
            self._context.sink.append_counters(
                samples_to_counters(start, end, values, device.metrics, device.index, self._offset_ns, pid),
                "pm_sampling")
            self._write_kernel_metrics(device, start + self._offset_ns, end + self._offset_ns, values)

    def _write_kernel_metrics(self, device: _Device, start: np.ndarray, end: np.ndarray,
                              values: np.ndarray) -> None:
        kernels = read_kernels(self._context.run_dir, self._context.config.rank, device.index)
        if kernels.num_rows == 0:
            self.notes.append(f"cuda:{device.index}: no kernel slices to attribute samples to "
                              "(collect them with the cupti or torch collector)")
            return
        order = np.argsort(start, kind="stable")
        k_start = kernels["start_ns"].to_numpy()
        attribution = attribute_samples(start[order], end[order], values[order], k_start,
                                        k_start + kernels["dur_ns"].to_numpy(),
                                        [str(n) for n in kernels["name"].to_pylist()])
        self._context.sink.append_metrics(
            kernel_metrics(kernels["id"].to_numpy(), attribution, device.metrics), "pm_sampling")
        if attribution.names:
            self.notes.append(f"cuda:{device.index}: {int(attribution.short.sum())} kernels shorter "
                              f"than the {attribution.interval_ns} ns sampling interval were "
                              f"given their name's pooled value ({len(attribution.names)} names)")


COLLECTOR = PmSamplingCollector
