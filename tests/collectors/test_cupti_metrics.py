"""The cupti_metrics collector (CUPTI PM sampling): metric choice, tables, wiring, and (gpu) the chip.

No GPU or NVIDIA driver on the development machine: cupti-python refuses to load CUPTI without
``libcuda.so.1``, so the profiler-host checks against a real chip run only under ``gpu``. The
samples of the wiring test are cupti-python's own :class:`cupti.pm_sampling.Sample` records.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import dlprof
from dlprof.collectors.base import CollectorContext
from dlprof.collectors.cupti import NO_DRIVER, Record, driver_missing, records_to_slices
from dlprof.collectors.cupti_metrics import (
    DEFAULT_METRICS,
    PERMISSION_MESSAGE,
    PmSamplingCollector,
    chosen_metrics,
    is_gpu_metric,
    read_kernels,
    samples_to_counters,
)
from dlprof.collectors.registry import collector_class
from dlprof.config import ProfileConfig
from dlprof.keys import StoreTable
from dlprof.schedule import Action
from dlprof.store.sample_attribution import attribute_samples
from dlprof.store.sink import Sink
from dlprof.store.slice_buffer import SliceBuffer
from dlprof.store.writer import RankWriter
from tests.conftest import HAS_CUPTI, needs_cupti


def test_gpu_metric_names_are_told_from_cpu_counters() -> None:
    assert all(is_gpu_metric(m) for m in DEFAULT_METRICS)
    assert is_gpu_metric("dram__bytes_read.sum.per_second")
    assert not any(is_gpu_metric(n) for n in ("task-clock", "PAPI_TOT_INS", "inst_executed", "x__"))
    assert chosen_metrics(["task-clock"]) == DEFAULT_METRICS
    assert chosen_metrics(["task-clock", "dram__bytes_read.sum", "dram__bytes_read.sum"]) == (
        "dram__bytes_read.sum",)


def test_samples_become_one_counter_row_per_sample_and_metric() -> None:
    end = np.array([200, 300])
    values = np.array([[1.0, 10.0], [2.0, 20.0]])
    table = samples_to_counters(end - 100, end, values, ["a__x.sum", "b__y.sum"], 1, 1_000, 42)
    rows = [(r["track"], r["ts_ns"], r["value"], r["device"]) for r in table.to_pylist()]
    assert sorted(rows) == [("cupti.a__x.sum", 1200, 1.0, "cuda:1"), ("cupti.a__x.sum", 1300, 2.0, "cuda:1"),
                            ("cupti.b__y.sum", 1200, 10.0, "cuda:1"), ("cupti.b__y.sum", 1300, 20.0, "cuda:1")]


def test_permission_message_says_how_an_administrator_enables_counters() -> None:
    for words in ("NVreg_RestrictProfilingToAdminUsers=0", "administrator", "root", "CAP_SYS_ADMIN",
                  "https://developer.nvidia.com/ERR_NVGPUCTRPERM"):
        assert words in PERMISSION_MESSAGE


def test_available_gives_the_real_reason() -> None:
    assert collector_class("cupti_metrics") is PmSamplingCollector
    ok, reason = PmSamplingCollector.available()
    if not HAS_CUPTI:
        assert not ok and "cupti-python is not installed" in reason
    elif driver_missing():
        assert (ok, reason) == (False, NO_DRIVER)
    else:
        assert ok, reason


@needs_cupti
def test_profiler_host_needs_the_driver_here() -> None:
    """What stops the host-side metric queries on a machine without the NVIDIA driver."""
    if not driver_missing():
        pytest.skip("a CUDA driver is present: test_metrics_are_checked_against_a_real_chip runs")
    from cupti import profiler_host

    with pytest.raises(Exception, match=r"libcuda\.so\.1"):
        profiler_host.get_supported_chips()


@pytest.mark.gpu
def test_metrics_are_checked_against_a_real_chip() -> None:
    if not HAS_CUPTI or driver_missing():
        pytest.skip(f"CUPTI's profiler host cannot load: {NO_DRIVER if HAS_CUPTI else 'no cupti-python'}")
    from cupti import profiler_host

    from dlprof.collectors.cupti_metrics import check_metrics

    for chip in ("GA100", "GH100"):
        assert chip in profiler_host.get_supported_chips()
        valid, invalid = check_metrics(chip, [*DEFAULT_METRICS, "bogus__metric.sum"])
        assert [m.name for m in valid] == list(DEFAULT_METRICS)
        assert list(invalid) == ["bogus__metric.sum"]


def _context(tmp_path: Path, counters: tuple[str, ...] = ()) -> CollectorContext:
    config = ProfileConfig(out=tmp_path / "run", collectors=("cupti_metrics",), counters=counters)
    return CollectorContext(config=config, sink=Sink(RankWriter(tmp_path / "run", 0)),
                            slices=SliceBuffer(0, 1, 0), run_dir=tmp_path / "run", step=lambda: None,
                            action=Action.NONE)


KERNELS = [  # (name, start, end) on CUPTI's clock, device 0; one on device 1 to be ignored
    ("gemm", 1_000, 1_400), ("tiny", 1_420, 1_430), ("tiny", 1_440, 1_460), ("gemm", 1_500, 1_800)]


def _write_kernels(context: CollectorContext, offset: int) -> None:
    records = [Record(10, name, start, end, 0, 7, i) for i, (name, start, end) in enumerate(KERNELS)]
    records.append(Record(10, "elsewhere", 1_000, 1_900, 1, 7, 99))
    records.append(Record(5, "cudaLaunchKernel", 900, 950, 0, 3, 0))
    context.sink.append_slices(records_to_slices(records, 1 << 39, offset, 1), "cupti")


class _StandIns:
    """cupti.cupti, cupti.profiler_host, cupti.pm_sampling and the CUDA driver as the collector calls
    them: one device, chip GH100, samples of 100 ns from 1000 to 1900 on CUPTI's clock."""

    def __init__(self, enable_error: Exception | None = None) -> None:
        from cupti.pm_sampling import Sample

        self.enable_error = enable_error
        self.samples = [Sample(t, t + 100, [float(t), 1.0]) for t in range(1_000, 1_900, 100)]
        self.started = 0
        self.configured: dict[str, Any] = {}
        stand_ins = self

        class Host:
            def __init__(self, chip: str, kind: int) -> None:
                assert chip == "GH100"

            def initialize(self) -> None: ...

            def deinitialize(self) -> None: ...

            def get_metric_properties(self, name: str) -> Any:
                if name.startswith("bogus"):
                    raise ValueError(f"Metric {name!r} is invalid or not supported on GH100")
                return SimpleNamespace(description=f"{name} described", hw_unit="count")

        class Sampler:
            def __init__(self, device_index: int) -> None: ...

            def enable(self) -> None:
                if stand_ins.enable_error is not None:
                    raise stand_ins.enable_error

            def configure(self, **options: Any) -> None:
                stand_ins.configured = options

            def start(self) -> None:
                stand_ins.started += 1

            def stop(self) -> None: ...

            def decode(self, max_samples: int) -> list[Any]:
                taken, stand_ins.samples = stand_ins.samples, []
                return taken

            def disable(self) -> None: ...

        self.modules = {
            "cupti.cupti": SimpleNamespace(
                get_timestamp=lambda: 0, DeviceGetChipNameParams=lambda: SimpleNamespace(
                    ptr=0, p_chip_name="GH100"), DEVICE_GET_CHIP_NAME_PARAMS_STRUCT_SIZE=0,
                device_get_chip_name=lambda ptr: None),
            "cupti.profiler_host": SimpleNamespace(ProfilerHost=Host, ProfilerType=SimpleNamespace(PM_SAMPLING=1)),
            "cupti.pm_sampling": SimpleNamespace(Collector=Sampler, TriggerMode=SimpleNamespace(GPU_TIME_INTERVAL=0)),
            "cuda.bindings.driver": SimpleNamespace(cuInit=lambda flags: 0, cuDeviceGetCount=lambda: (0, 1)),
        }


@needs_cupti
def test_start_sample_stop_against_stand_ins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The collector's wiring (not CUPTI's behaviour): metric check, schedule, drain, both tables."""
    stand_ins = _StandIns()
    real_import = importlib.import_module
    monkeypatch.setattr(importlib, "import_module", lambda name: stand_ins.modules.get(name) or real_import(name))
    context = _context(tmp_path, ("task-clock", "smsp__inst_executed.sum", "bogus__metric.sum",
                                  "sm__cycles_active.sum"))
    collector = PmSamplingCollector()
    collector.start(context)
    assert stand_ins.configured["metrics"] == ["smsp__inst_executed.sum", "sm__cycles_active.sum"]
    assert any("bogus__metric.sum left out" in note for note in collector.notes)
    assert stand_ins.started == 0  # the schedule does not record yet
    collector.on_step(1, Action.NONE, Action.RECORD)
    assert stand_ins.started == 1
    offset = context.clocks[0].offset_ns
    _write_kernels(context, offset)
    collector.stop()

    import pyarrow.dataset as ds

    def table(name: StoreTable) -> Any:
        return ds.dataset(tmp_path / "run" / str(name), format="parquet").to_table().to_pandas()

    counters = table(StoreTable.COUNTERS)
    inst = counters[counters["track"] == "cupti.smsp__inst_executed.sum"].sort_values("ts_ns")
    assert inst["value"].tolist() == [float(t) for t in range(1_000, 1_900, 100)]
    assert (inst["ts_ns"] - offset).tolist() == list(range(1_100, 2_000, 100))
    assert set(counters["device"]) == {"cuda:0"}

    metrics = table(StoreTable.METRICS)
    slices = table(StoreTable.SLICES).set_index("id")
    assert set(metrics["method"]) == {"sampled"} and set(metrics["scope"]) == {"kernel"}
    assert set(slices.loc[metrics["slice_id"], "name"]) == {"gemm", "tiny"}  # not device 1's
    got = metrics[metrics["metric"] == "cupti:smsp__inst_executed.sum"]
    starts = np.arange(1_000, 1_900, 100)
    expected = attribute_samples(starts, starts + 100, starts.astype(float),
                                 [k[1] for k in KERNELS], [k[2] for k in KERNELS], [k[0] for k in KERNELS])
    ids = [(1 << 39) + i for i in range(len(KERNELS))]
    assert got.set_index("slice_id").loc[ids, "value"].tolist() == pytest.approx(expected.kernel_values[:, 0].tolist())
    assert any("pooled" in note for note in collector.notes)


@needs_cupti
def test_insufficient_privileges_leaves_the_device_out_with_the_fix(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    stand_ins = _StandIns(PermissionError("Insufficient privileges for PM sampling"))
    real_import = importlib.import_module
    monkeypatch.setattr(importlib, "import_module", lambda name: stand_ins.modules.get(name) or real_import(name))
    collector = PmSamplingCollector()
    collector.start(_context(tmp_path))
    assert PERMISSION_MESSAGE in collector.notes and not collector.active
    collector.stop()


def test_kernels_are_read_back_from_the_rank_chunks(tmp_path: Path) -> None:
    context = _context(tmp_path)
    _write_kernels(context, 5)
    _write_kernels(context, 5)  # a second chunk with its own dictionaries
    kernels = read_kernels(tmp_path / "run", 0, 0)
    assert kernels.num_rows == 2 * len(KERNELS)
    assert kernels["start_ns"].to_pylist() == sorted(kernels["start_ns"].to_pylist())
    assert read_kernels(tmp_path / "run", 0, 3).num_rows == 0
    assert read_kernels(tmp_path / "nothing", 0, 0).num_rows == 0


def test_a_session_without_a_driver_records_the_reason(tmp_path: Path) -> None:
    ok, reason = PmSamplingCollector.available()
    if ok:
        pytest.skip("a CUDA driver is present")
    from dlprof.recording.session import Session

    with Session(ProfileConfig(out=tmp_path / "run", collectors=("cupti_metrics",))):
        pass
    info = next(c for c in dlprof.load(tmp_path / "run").manifest.collectors if c.name == "cupti_metrics")
    assert not info.active and info.notes == [reason]
