"""The cupti_metrics collector (CUPTI PM sampling): metric choice, tables, wiring, attribution end to
end, and (gpu) the chip.

No GPU or NVIDIA driver on the development machine: cupti-python refuses to load CUPTI without
``libcuda.so.1``, so the profiler-host checks against a real chip run only under ``gpu``. The
samples are cupti-python's own :class:`cupti.pm_sampling.Sample` records, handed to the collector
by stand-ins of the CUPTI calls it makes; the stand-in chip answers as GH100 did on an H200
(``tests/data/h200/gpu-check-report.md``). The kernels they are attributed to are real recorded
ones, written through the collectors' own paths: the H200's torch.profiler trace as the torch
collector's cycle (converted by the finisher), and its kernels as CUPTI records through the
cupti collector's translation.
"""

from __future__ import annotations

import importlib
import importlib.util
import shutil
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow.dataset as ds
import pytest

import dlprof
from dlprof.analysis.derived import BUILTINS, derived_metrics
from dlprof.collectors.base import CollectorContext
from dlprof.collectors.cupti import NO_DRIVER, Record, driver_missing, records_to_slices
from dlprof.collectors.cupti_metrics import (
    PERMISSION_MESSAGE,
    PmSamplingCollector,
    choose_metrics,
    chosen_metrics,
    is_gpu_metric,
    samples_to_counters,
)
from dlprof.collectors.registry import collector_class
from dlprof.config import ProfileConfig
from dlprof.hardware.pm_metrics import DEFAULT_METRICS, equivalents
from dlprof.keys import RunStatus
from dlprof.recording.saves import Saver
from dlprof.schedule import Action
from dlprof.store.manifest import CollectorInfo, Manifest
from dlprof.store.pm_samples import DURATION_TRACK, read_summary
from dlprof.store.reader import Run
from dlprof.store.sample_attribution import attribute_samples
from dlprof.store.save_jobs import Cycle, CycleJob
from dlprof.store.sink import Sink
from dlprof.store.slice_buffer import SliceBuffer
from dlprof.store.writer import RankWriter
from tests.conftest import HAS_CUPTI, needs_cupti

H200 = Path(__file__).resolve().parents[1] / "data" / "h200"
GLOBAL_LOADS = "smsp__inst_executed_op_global_ld.sum"
# What CUPTI 13.5's profiler host said of it on the H200 (gpu-check-report.md).
GH100_REFUSAL = f"Metric '{GLOBAL_LOADS}' is invalid or not supported on GH100"
SASS_LOADS = "smsp__sass_inst_executed_op_global_ld.sum"


def test_gpu_metric_names_are_told_from_cpu_counters() -> None:
    assert all(is_gpu_metric(m) for m in DEFAULT_METRICS)
    assert is_gpu_metric("dram__bytes_read.sum.per_second")
    assert not any(is_gpu_metric(n) for n in ("task-clock", "PAPI_TOT_INS", "inst_executed", "x__"))
    assert chosen_metrics(["task-clock"]) == DEFAULT_METRICS
    assert chosen_metrics(["task-clock", "dram__bytes_read.sum", "dram__bytes_read.sum"]) == (
        "dram__bytes_read.sum",)


def test_samples_become_a_counter_row_per_metric_and_one_for_their_length() -> None:
    end = np.array([200, 300])
    values = np.array([[1.0, 10.0], [2.0, 20.0]])
    table = samples_to_counters(end - 100, end - 5, values, ["a__x.sum", "b__y.sum"], 1, 1_000, 42)
    rows = [(r["track"], r["ts_ns"], r["value"], r["unit"], r["device"]) for r in table.to_pylist()]
    assert sorted(rows) == [
        ("cupti.a__x.sum", 1195, 1.0, "count", "cuda:1"), ("cupti.a__x.sum", 1295, 2.0, "count", "cuda:1"),
        ("cupti.b__y.sum", 1195, 10.0, "count", "cuda:1"), ("cupti.b__y.sum", 1295, 20.0, "count", "cuda:1"),
        (DURATION_TRACK, 1195, 95.0, "ns", "cuda:1"), (DURATION_TRACK, 1295, 95.0, "ns", "cuda:1")]


def test_on_gh100_the_sass_global_load_count_replaces_the_refused_one() -> None:
    """The H200's answer: three defaults taken, the global-load count refused."""
    candidates = [other for name in DEFAULT_METRICS for other in equivalents(name)]
    valid = [name for name in candidates if name != GLOBAL_LOADS]
    choice = choose_metrics("GH100", DEFAULT_METRICS, valid, {GLOBAL_LOADS: GH100_REFUSAL})
    assert choice.names == [*DEFAULT_METRICS[:3], SASS_LOADS]
    assert choice.notes == [f"{SASS_LOADS} sampled in place of {GLOBAL_LOADS} ({GH100_REFUSAL})"]
    # Named with --counters, an equivalent is also taken for a name the chip refuses.
    assert choose_metrics("GH100", [GLOBAL_LOADS], [SASS_LOADS], {}).names == [SASS_LOADS]


def test_a_metric_with_no_equivalent_on_the_chip_is_left_out_naming_related_counters() -> None:
    offered = ["smsp__inst_executed", "lts__t_sectors_srcunit_tex_op_read_lookup_hit", "sm__ctas_launched",
               "smsp__inst_executed_op_global_ld_realtime"]
    choice = choose_metrics("GB100", [GLOBAL_LOADS, "smsp__inst_executed.sum", "bogus__x.sum"],
                            ["smsp__inst_executed.sum"], {GLOBAL_LOADS: "refused", "bogus__x.sum": "unknown"},
                            offered)
    assert choice.names == ["smsp__inst_executed.sum"]
    left, bogus = choice.notes
    assert left.startswith(f"{GLOBAL_LOADS} left out: refused; nor is {SASS_LOADS}")
    assert left.endswith("related counters GB100 offers: smsp__inst_executed_op_global_ld_realtime")
    assert bogus == "bogus__x.sum left out: unknown"


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
        candidates = [other for name in DEFAULT_METRICS for other in equivalents(name)]
        valid, invalid = check_metrics(chip, [*candidates, "bogus__metric.sum"])
        choice = choose_metrics(chip, DEFAULT_METRICS, [m.name for m in valid], invalid)
        assert len(choice.names) == len(DEFAULT_METRICS), choice.notes
        assert "bogus__metric.sum" in invalid


def _context(run_dir: Path, sink: Sink, counters: tuple[str, ...] = ()) -> CollectorContext:
    config = ProfileConfig(out=run_dir, collectors=("cupti_metrics",), counters=counters)
    return CollectorContext(config=config, sink=sink, slices=SliceBuffer(0, 1, 0), run_dir=run_dir,
                            step=lambda: None, action=Action.NONE)


class _StandIns:
    """cupti.cupti, cupti.profiler_host, cupti.pm_sampling and the CUDA driver as the collector calls
    them: one device whose chip answers as GH100 did on the H200; the sampler hands over
    ``samples`` (cupti-python's own records) at its next decode."""

    def __init__(self, enable_error: Exception | None = None) -> None:
        self.enable_error = enable_error
        self.samples: list[Any] = []
        self.started = 0
        self.configured: dict[str, Any] = {}
        stand_ins = self

        class Host:
            def __init__(self, chip: str, kind: int) -> None:
                assert chip == "GH100"

            def initialize(self) -> None: ...

            def deinitialize(self) -> None: ...

            def get_metric_properties(self, name: str) -> Any:
                if name == GLOBAL_LOADS:
                    raise ValueError(GH100_REFUSAL)
                if name.startswith("bogus"):
                    raise ValueError(f"Metric {name!r} is invalid or not supported on GH100")
                return SimpleNamespace(description=f"{name} described", hw_unit="count")

            def get_base_metrics(self, kind: int) -> list[str]:
                return ["smsp__inst_executed", "sm__cycles_active"]

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
                device_get_chip_name=lambda ptr: None, MetricType=SimpleNamespace(COUNTER=0)),
            "cupti.profiler_host": SimpleNamespace(ProfilerHost=Host, ProfilerType=SimpleNamespace(PM_SAMPLING=1)),
            "cupti.pm_sampling": SimpleNamespace(Collector=Sampler, TriggerMode=SimpleNamespace(GPU_TIME_INTERVAL=0)),
            "cuda.bindings.driver": SimpleNamespace(cuInit=lambda flags: 0, cuDeviceGetCount=lambda: (0, 1)),
        }

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        real_import = importlib.import_module
        monkeypatch.setattr(importlib, "import_module", lambda name: self.modules.get(name) or real_import(name))

    def sample(self, first_ns: int, last_ns: int, metrics: int, interval_ns: int = 100_000,
               seed: int = 0) -> None:
        """Consecutive samples of ``interval_ns`` covering [first, last] on CUPTI's clock."""
        from cupti.pm_sampling import Sample

        rng = np.random.default_rng(seed)
        starts = range(first_ns, last_ns + interval_ns, interval_ns)
        self.samples += [Sample(t, t + interval_ns, [float(v) for v in rng.uniform(1e3, 1e6, metrics)])
                         for t in starts]


@needs_cupti
def test_start_sample_save_stop_against_stand_ins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The collector's wiring (not CUPTI's behaviour): metric choice, schedule, drain, counters."""
    stand_ins = _StandIns()
    stand_ins.install(monkeypatch)
    run_dir = tmp_path / "run"
    context = _context(run_dir, Sink(RankWriter(run_dir, 0)),
                       ("task-clock", "smsp__inst_executed.sum", "bogus__metric.sum", GLOBAL_LOADS))
    collector = PmSamplingCollector()
    collector.start(context)
    assert stand_ins.configured["metrics"] == ["smsp__inst_executed.sum", SASS_LOADS]
    assert f"cuda:0 (GH100): {SASS_LOADS} sampled in place of {GLOBAL_LOADS} ({GH100_REFUSAL})" in collector.notes
    assert any(note.startswith("cuda:0 (GH100): bogus__metric.sum left out") for note in collector.notes)
    assert stand_ins.started == 0  # the schedule does not record yet
    collector.on_step(1, Action.NONE, Action.RECORD)
    assert stand_ins.started == 1
    stand_ins.sample(1_000_000, 1_400_000, 2)
    collector.save()  # a save in the middle of the run writes what was decoded so far
    stand_ins.sample(1_500_000, 1_900_000, 2)
    collector.stop()
    counters = ds.dataset(run_dir / "counters", format="parquet").to_table().to_pandas()
    offset = context.clocks[0].offset_ns
    inst = counters[counters["track"] == "cupti.smsp__inst_executed.sum"].sort_values("ts_ns")
    assert (inst["ts_ns"] - offset).tolist() == [*range(1_100_000, 1_600_000, 100_000),
                                                 *range(1_600_000, 2_100_000, 100_000)]
    assert set(counters["track"]) == {"cupti.smsp__inst_executed.sum", f"cupti.{SASS_LOADS}", DURATION_TRACK}
    assert set(counters.loc[counters["track"] == DURATION_TRACK, "value"]) == {100_000.0}
    assert len(list((run_dir / "counters" / "rank=0").glob("chunk-*"))) == 2  # the save, then the stop


@needs_cupti
def test_insufficient_privileges_leaves_the_device_out_with_the_fix(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    stand_ins = _StandIns(PermissionError("Insufficient privileges for PM sampling"))
    stand_ins.install(monkeypatch)
    collector = PmSamplingCollector()
    collector.start(_context(tmp_path / "run", Sink(RankWriter(tmp_path / "run", 0))))
    assert PERMISSION_MESSAGE in collector.notes and not collector.active
    collector.stop()


# --- attribution end to end: recorded kernels, samples through the collector, saves, compaction ----


def _h200_kernels(count: int) -> list[tuple[str, int, int]]:
    """The first ``count`` kernels of the H200 run (name, start, end; epoch ns), in time order."""
    table = ds.dataset(H200 / "gpt2-dlprof-run" / "slices", format="parquet", partitioning="hive").to_table(
        columns=["kind", "name", "start_ns", "dur_ns"]).to_pandas()
    kernels = table[table["kind"] == "kernel"].sort_values("start_ns").head(count)
    return [(str(n), int(s), int(s + d)) for n, s, d in zip(kernels["name"], kernels["start_ns"],
                                                             kernels["dur_ns"], strict=True)]


def _recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernels_first: bool,
              span_ns: tuple[int, int], write_kernels: Callable[[Saver, Sink, int], None]) -> Run:
    """A run made as a session makes one: the cupti_metrics collector sampling over ``span_ns``
    (epoch), the kernels written by ``write_kernels(saver, sink, clock offset)`` in the save before
    or after the one that holds the samples, every save made final, then the rank compacted."""
    stand_ins = _StandIns()
    stand_ins.install(monkeypatch)
    run_dir = tmp_path / "run"
    writer = RankWriter(run_dir, 0)
    sink = Sink(writer)
    saver = Saver(writer, sink, on_cycle=lambda name, result: None)
    context = _context(run_dir, sink)
    collector = PmSamplingCollector()
    collector.start(context)
    collector.on_step(1, Action.NONE, Action.RECORD)
    offset = context.clocks[0].offset_ns
    interval = 100_000
    first = (span_ns[0] - offset) // interval * interval - interval
    stand_ins.sample(first, span_ns[1] - offset + interval, len(DEFAULT_METRICS))

    def save() -> None:
        saver.save(SliceBuffer(0, 1, 0).drain(), [])

    if kernels_first:  # the kernels' collector saved first; sampling stopped last, as in a session
        write_kernels(saver, sink, offset)
        save()
        collector.stop()
        save()
    else:  # the samples saved in the middle of the run, the kernels only at its end
        collector.save()
        save()
        collector.stop()
        write_kernels(saver, sink, offset)
        save()
    counts, _ = saver.close()
    collector.after_conversions()
    Manifest(name=run_dir.name, command=["python", "gpt_train.py"], status=RunStatus.COMPLETE,
             start_ns=span_ns[0] - 10**9, end_ns=span_ns[1] + 10**9, counts=counts,
             collectors=[CollectorInfo("cupti_metrics", notes=collector.notes)]).write(run_dir)
    return dlprof.load(run_dir)


def _check_attribution(run: Run) -> None:
    """Every kernel carries each sampled metric, equal to the method applied to the stored kernels
    and samples directly; nothing is created or lost."""
    slices, counters, metrics = run.slices, run.counters, run.metrics
    kernels = slices[slices["kind"] == "kernel"].sort_values("start_ns")
    assert len(kernels) and set(metrics["method"]) == {"sampled"}
    stored = sorted(set(metrics["metric"].astype(str)))
    assert stored == sorted(f"cupti:{m}" for m in [*DEFAULT_METRICS[:3], SASS_LOADS])  # the name used
    ends = counters[counters["track"] == DURATION_TRACK].sort_values("ts_ns")
    sample_end = ends["ts_ns"].to_numpy()
    sample_start = sample_end - ends["value"].to_numpy().astype(np.int64)
    for metric in stored:
        track = counters[counters["track"] == f"cupti.{metric.removeprefix('cupti:')}"].sort_values("ts_ns")
        assert track["ts_ns"].tolist() == sample_end.tolist()
        expected = attribute_samples(sample_start, sample_end, track["value"].to_numpy(),
                                     kernels["start_ns"], kernels["start_ns"] + kernels["dur_ns"],
                                     kernels["name"].astype(str).tolist())
        got = metrics[metrics["metric"] == metric].set_index("slice_id")["value"]
        assert got.reindex(kernels["id"]).tolist() == pytest.approx(expected.kernel_values[:, 0].tolist())
        assert got.sum() + expected.unattributed[0] == pytest.approx(track["value"].sum())
    table = derived_metrics(run, BUILTINS)
    assert {"ipc", "warps_per_inst", "gld_per_inst"} <= {m.name for m in table.metrics}, table.unavailable


@needs_cupti
@pytest.mark.parametrize("kernels_first", [True, False], ids=["kernels-saved-first", "samples-saved-first"])
def test_samples_go_to_the_cupti_collectors_kernels_in_either_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernels_first: bool) -> None:
    """The H200's kernels as CUPTI activity records through the cupti collector's translation. On
    the H200 the collector looked for them in chunks that earlier saves had already made final,
    and found none."""
    recorded = _h200_kernels(400)

    def write_kernels(saver: Saver, sink: Sink, offset: int) -> None:
        records = [Record(10, name, start - offset, end - offset, 0, 7, i)
                   for i, (name, start, end) in enumerate(recorded)]
        records.append(Record(5, "cudaLaunchKernel", recorded[0][1] - offset - 5_000,
                              recorded[0][1] - offset - 1_000, 0, 3, 0))
        sink.append_slices(records_to_slices(records, 1 << 39, offset, 1), "cupti")

    run = _recorded(tmp_path, monkeypatch, kernels_first, (recorded[0][1], recorded[-1][2]), write_kernels)
    _check_attribution(run)
    summary = read_summary(run.path, 0)
    assert summary is not None and summary.devices["cuda:0"].attributed == len(recorded) and not summary.problem
    notes = run.manifest.collectors[0].notes
    samples = summary.devices["cuda:0"].samples
    assert any(note.startswith(f"cuda:0: {samples:,} samples shared among 400 of its 400 kernels") for note in notes)


@needs_cupti
@pytest.mark.slow
@pytest.mark.parametrize("kernels_first", [True, False], ids=["kernels-saved-first", "samples-saved-first"])
def test_samples_go_to_the_torch_collectors_kernels_in_either_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernels_first: bool) -> None:
    """The H200's own torch.profiler trace handed to the finisher as the torch collector hands a
    cycle: its 5,080 kernels carry the metrics."""
    trace = tmp_path / "run" / "kineto" / "rank=0" / "cycle-0.json.gz"  # where the torch collector saves

    def write_kernels(saver: Saver, sink: Sink, offset: int) -> None:
        trace.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(H200 / "gpt2-torch-profiler.json.gz", trace)  # the finisher removes a converted cycle
        saver.convert(Cycle("torch", CycleJob(trace=trace, rank=0, cycle=0, pid=1, marker_window_ns=None)))

    span = (1_795_761_271_949_822_249, 1_795_761_272_813_886_302 + 5_000_000)  # its kernels' time
    run = _recorded(tmp_path, monkeypatch, kernels_first, span, write_kernels)
    assert (run.slices["kind"] == "kernel").sum() == 5080
    _check_attribution(run)


def test_a_session_without_a_driver_records_the_reason(tmp_path: Path) -> None:
    ok, reason = PmSamplingCollector.available()
    if ok:
        pytest.skip("a CUDA driver is present")
    from dlprof.recording.session import Session

    with Session(ProfileConfig(out=tmp_path / "run", collectors=("cupti_metrics",))):
        pass
    info = next(c for c in dlprof.load(tmp_path / "run").manifest.collectors if c.name == "cupti_metrics")
    assert not info.active and info.notes == [reason]
