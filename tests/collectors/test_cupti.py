"""The CUPTI Activity collector: translation, availability, arbitration with Kineto, and (gpu) a real run.

The translation tests build their records with cupti-python's own record classes
(``cupti.cupti.ActivityKernel9`` and kin construct and take field values without a GPU or a
driver), so the attribute names read by the collector are the installed package's. What CUPTI
itself puts in those fields on a real GPU is not checked here: no GPU on the development machine.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import dlprof
from dlprof.collectors import cupti as cupti_collector
from dlprof.collectors.base import CollectorContext
from dlprof.collectors.cupti import (
    ACTIVITY_CONCURRENT_KERNEL,
    ACTIVITY_DRIVER,
    ACTIVITY_MEMCPY,
    ACTIVITY_MEMSET,
    ACTIVITY_RUNTIME,
    ARBITRATION_NOTE,
    COPY_KINDS,
    MEMORY_KINDS,
    NO_DRIVER,
    CuptiCollector,
    Record,
    record_from_activity,
    records_to_slices,
)
from dlprof.collectors.registry import collector_class, cupti_owner
from dlprof.config import ProfileConfig
from dlprof.schedule import Action
from dlprof.store.sink import Sink
from dlprof.store.slice_buffer import SliceBuffer
from dlprof.store.writer import RankWriter
from tests.conftest import HAS_CUPTI, needs_cupti

LAUNCH_CBID = 211  # any number: the test names it through the api_name map


def _cupti_records() -> list[Any]:
    """A launch (runtime), its kernel, a HtoD copy and a memset, as cupti-python objects."""
    import cupti.cupti as c

    kernel = c.ActivityKernel9()
    for field, value in dict(
        kind=int(c.ActivityKind.CONCURRENT_KERNEL), name="_Z6saxpyifPfS_", start=5_000, end=7_500,
        device_id=1, stream_id=13, correlation_id=42, grid_x=256, grid_y=2, grid_z=1, block_x=128,
        block_y=1, block_z=1, registers_per_thread=24, static_shared_memory=1024,
        dynamic_shared_memory=3072,
    ).items():
        setattr(kernel, field, value)
    launch = c.ActivityAPI()
    for field, value in dict(kind=int(c.ActivityKind.RUNTIME), cbid=LAUNCH_CBID, start=4_000,
                             end=4_800, thread_id=777, process_id=99, correlation_id=42).items():
        setattr(launch, field, value)
    copy = c.ActivityMemcpy5()
    for field, value in dict(kind=int(c.ActivityKind.MEMCPY), start=1_000, end=2_000, device_id=1,
                             stream_id=7, correlation_id=40, bytes=4096,
                             copy_kind=int(c.ActivityMemcpyKind.HTOD),
                             src_kind=int(c.ActivityMemoryKind.PAGEABLE),
                             dst_kind=int(c.ActivityMemoryKind.DEVICE)).items():
        setattr(copy, field, value)
    memset = c.ActivityMemset4()
    for field, value in dict(kind=int(c.ActivityKind.MEMSET), start=2_500, end=2_600, device_id=1,
                             stream_id=7, correlation_id=41, bytes=512,
                             memory_kind=int(c.ActivityMemoryKind.DEVICE)).items():
        setattr(memset, field, value)
    return [launch, kernel, copy, memset]


@needs_cupti
def test_cupti_records_become_slices_joined_by_correlation() -> None:
    names = {(ACTIVITY_RUNTIME, LAUNCH_CBID): "cudaLaunchKernel_v7000"}
    records = [record_from_activity(a, names) for a in _cupti_records()]
    assert all(r is not None for r in records)
    table = records_to_slices([r for r in records if r is not None], id_base=1 << 39,
                              clock_offset_ns=1_700_000_000_000_000_000, pid=99)
    rows = {r["kind"]: r for r in table.to_pylist()}
    assert [r["id"] for r in table.to_pylist()] == [(1 << 39) + i for i in range(4)]

    launch, kernel, copy, memset = rows["runtime"], rows["kernel"], rows["memcpy"], rows["memset"]
    assert (launch["name"], launch["category"], launch["device"]) == ("cudaLaunchKernel_v7000", "cuda_runtime", "cpu")
    assert launch["tid"] == 777 and launch["stream"] is None
    # Demangled as Kineto shows kernels (binutils' c++filt reads the symbol the same way).
    assert (kernel["name"], kernel["category"], kernel["device"]) == ("saxpyi(float, float*, float*)", "kernel", "cuda:1")
    assert kernel["tid"] == kernel["stream"] == 13
    assert launch["correlation_id"] == kernel["correlation_id"] == 42  # the launch -> kernel join
    # CUPTI's clock plus the sampled offset; durations untouched.
    assert kernel["start_ns"] == 1_700_000_000_000_005_000 and kernel["dur_ns"] == 2_500
    assert launch["start_ns"] == 1_700_000_000_000_004_000 and launch["dur_ns"] == 800
    assert (kernel["grid"], kernel["block"]) == ("[256,2,1]", "[128,1,1]")
    assert kernel["registers"] == 24 and kernel["shared_memory"] == 1024 + 3072
    assert kernel["bytes"] is None

    assert (copy["category"], copy["name"]) == ("Memcpy HtoD", "Memcpy HtoD (Pageable -> Device)")
    assert (copy["device"], copy["tid"], copy["bytes"], copy["correlation_id"]) == ("cuda:1", 7, 4096, 40)
    assert copy["grid"] is None and copy["shared_memory"] is None
    assert (memset["name"], memset["category"], memset["bytes"]) == ("Memset (Device)", "gpu_memset", 512)
    assert pa_schema_fits(table)


def pa_schema_fits(table: Any) -> bool:
    """Every column is one of the store's, with a type the writer can conform."""
    from dlprof.store.schema import SLICES, conform

    conform(table, SLICES)
    return set(table.column_names) <= set(SLICES.names)


@needs_cupti
def test_every_kernel_record_version_reads_the_same() -> None:
    """CUPTI delivers the newest ActivityKernelN its version has; all of them carry these fields."""
    import cupti.cupti as c

    versions = [name for name in dir(c) if name.startswith("ActivityKernel") and name[14:].isdigit()]
    assert versions
    for name in versions:
        kernel = getattr(c, name)()
        kernel.kind = int(c.ActivityKind.CONCURRENT_KERNEL)
        kernel.static_shared_memory, kernel.dynamic_shared_memory = 16, 32
        record = record_from_activity(kernel)
        assert record is not None and record.static_shared + record.dynamic_shared == 48, name


@needs_cupti
def test_enum_values_match_cupti_python() -> None:
    import cupti.cupti as c

    assert int(c.ActivityKind.CONCURRENT_KERNEL) == ACTIVITY_CONCURRENT_KERNEL
    assert int(c.ActivityKind.MEMCPY) == ACTIVITY_MEMCPY
    assert int(c.ActivityKind.MEMSET) == ACTIVITY_MEMSET
    assert int(c.ActivityKind.RUNTIME) == ACTIVITY_RUNTIME
    assert int(c.ActivityKind.DRIVER) == ACTIVITY_DRIVER
    for value, label in enumerate(COPY_KINDS):
        assert c.ActivityMemcpyKind(value).name.replace("TO", "to").lower() == label.lower()
    for value, label in enumerate(MEMORY_KINDS):
        assert c.ActivityMemoryKind(value).name.replace("_", " ").lower() == label.lower()


def test_translation_without_cupti_installed() -> None:
    """The pure function needs no cupti: driver calls, unknown kinds, an unnamed API call."""
    records = [
        Record(ACTIVITY_DRIVER, "cuLaunchKernel", 10, 20, 0, 5, 9),
        Record(ACTIVITY_CONCURRENT_KERNEL, "k", 30, 40, 0, 1, 9, (1, 1, 1), (32, 1, 1), 8, 0, 0),
        Record(999, "something else", 0, 1, 0, 0, 0),
    ]
    table = records_to_slices(records, id_base=100, clock_offset_ns=-5, pid=3)
    rows = table.to_pylist()
    assert [r["kind"] for r in rows] == ["runtime", "kernel"]
    assert [r["id"] for r in rows] == [100, 101]
    assert rows[0]["category"] == "cuda_driver" and rows[0]["start_ns"] == 5
    assert rows[1]["device"] == "cuda:0" and rows[1]["shared_memory"] == 0
    empty = records_to_slices([], id_base=0, clock_offset_ns=0, pid=1)
    assert empty.num_rows == 0 and "correlation_id" in empty.column_names


def test_available_gives_the_real_reason() -> None:
    assert collector_class("cupti") is CuptiCollector
    ok, reason = CuptiCollector.available()
    if not HAS_CUPTI:
        assert not ok and "cupti-python is not installed" in reason
    elif cupti_collector.driver_missing():
        assert (ok, reason) == (False, NO_DRIVER)  # this machine: no NVIDIA driver
    else:
        assert ok and reason == ""


def _context(tmp_path: Path, collectors: tuple[str, ...], action: Action = Action.RECORD,
             cupti_owner: str | None = "cupti") -> CollectorContext:
    config = ProfileConfig(out=tmp_path / "run", collectors=collectors)
    return CollectorContext(config=config, sink=Sink(RankWriter(tmp_path / "run", 0)),
                            slices=SliceBuffer(0, 1, 0), run_dir=tmp_path / "run", step=lambda: None,
                            action=action, cupti_owner=cupti_owner)


def test_torch_collector_wins_cupti(tmp_path: Path) -> None:
    """With torch selected, Kineto is CUPTI's subscriber: this collector says so and stays off."""
    assert cupti_owner(("cupti", "host")) != "torch"
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed: Kineto cannot own CUPTI")
    owner = cupti_owner(("cupti", "torch"))
    assert owner == "torch"  # whatever the order they are named in
    collector = CuptiCollector()
    context = _context(tmp_path, ("torch", "cupti"), cupti_owner=owner)
    collector.start(context)  # must not import or touch cupti
    collector.on_step(1, Action.RECORD, Action.RECORD)
    collector.save()
    collector.stop()
    assert collector.notes == [ARBITRATION_NOTE] and not collector.active
    assert context.clocks == []


class _FakeCupti:
    """cupti.cupti's activity calls as the collector uses them, delivering the given records."""

    CallbackDomain = SimpleNamespace(RUNTIME_API=1, DRIVER_API=2)

    def __init__(self, records: list[Any]) -> None:
        self.pending = records
        self.enabled: set[int] = set()
        self.now = 1_000
        self.dropped = 17

    def get_timestamp(self) -> int:
        self.now += 1
        return self.now

    def activity_register_callbacks(self, requested: Any, completed: Any) -> None:
        self.requested, self.completed = requested, completed

    def activity_enable(self, kind: int) -> None:
        self.enabled.add(kind)

    def activity_disable(self, kind: int) -> None:
        self.enabled.discard(kind)

    def activity_flush_all(self, flag: int) -> None:
        size, _ = self.requested()
        assert size > 0
        records, self.pending = self.pending, []
        self.completed(records)

    def activity_get_num_dropped_records(self, context: int, stream_id: int, dropped: int) -> None:
        ctypes.c_size_t.from_address(dropped).value = self.dropped  # as CUPTI writes its size_t
        self.dropped = 0

    def get_callback_name(self, domain: int, cbid: int) -> str:
        return "cudaLaunchKernel" if (domain, cbid) == (1, LAUNCH_CBID) else "?"


@needs_cupti
def test_start_save_stop_against_a_stand_in_cupti(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The collector's wiring (not CUPTI's behaviour): clock domain, schedule, flush, names, ids."""
    fake = _FakeCupti(_cupti_records())
    real_import = importlib.import_module
    monkeypatch.setattr(importlib, "import_module",
                        lambda name: fake if name == "cupti.cupti" else real_import(name))
    context = _context(tmp_path, ("cupti",), Action.NONE)
    collector = CuptiCollector()
    collector.start(context)
    assert [c.name for c in context.clocks] == ["cupti"] and not fake.enabled
    collector.on_step(1, Action.NONE, Action.RECORD)
    assert fake.enabled == set(cupti_collector.ENABLED_KINDS)
    collector.stop()
    assert not fake.enabled
    assert collector.notes == ["CUPTI dropped 17 activity records (its buffers were full)"]
    clock = context.clocks[0]
    assert clock.bounds_ns is not None and clock.bounds_ns[0] <= clock.offset_ns <= clock.bounds_ns[1]
    import pyarrow.dataset as ds

    slices = ds.dataset(tmp_path / "run" / "slices", format="parquet").to_table().to_pylist()
    assert sorted(r["kind"] for r in slices) == ["kernel", "memcpy", "memset", "runtime"]
    launch = next(r for r in slices if r["kind"] == "runtime")
    assert launch["name"] == "cudaLaunchKernel"
    assert all(r["id"] >> 39 == 3 for r in slices)  # SLOT_CUPTI, rank 0
    kernel = next(r for r in slices if r["kind"] == "kernel")
    assert kernel["start_ns"] == 5_000 + clock.offset_ns


def test_a_session_without_a_driver_records_the_reason(tmp_path: Path) -> None:
    ok, reason = CuptiCollector.available()
    if ok:
        pytest.skip("a CUDA driver is present: covered by the gpu test")
    from dlprof.recording.session import Session

    with Session(ProfileConfig(out=tmp_path / "run", collectors=("cupti",))):
        pass
    info = next(c for c in dlprof.load(tmp_path / "run").manifest.collectors if c.name == "cupti")
    assert not info.active and info.notes == [reason]


@pytest.mark.gpu
def test_a_real_cuda_program_is_traced(tmp_path: Path) -> None:
    """cudaMalloc, cudaMemset and a HtoD/DtoH round trip through cuda-bindings, traced by CUPTI."""
    ok, reason = CuptiCollector.available()
    if not ok:
        pytest.skip(f"CUPTI unavailable: {reason}")
    from cuda.bindings import runtime as rt

    from dlprof.recording.session import Session

    size = 1 << 20
    host = bytearray(size)
    with Session(ProfileConfig(out=tmp_path / "run", collectors=("cupti",))):
        err, ptr = rt.cudaMalloc(size)
        assert err == rt.cudaError_t.cudaSuccess
        rt.cudaMemset(ptr, 1, size)
        rt.cudaMemcpy(ptr, host, size, rt.cudaMemcpyKind.cudaMemcpyHostToDevice)
        rt.cudaMemcpy(host, ptr, size, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost)
        rt.cudaDeviceSynchronize()
        rt.cudaFree(ptr)
    slices = dlprof.load(tmp_path / "run").slices
    copies = slices[slices["kind"] == "memcpy"]
    assert set(copies["category"].astype(str)) >= {"Memcpy HtoD", "Memcpy DtoH"}
    assert (copies["bytes"] == size).all()
    assert (slices["kind"] == "memset").any()
    runtime = slices[slices["kind"] == "runtime"]
    assert set(copies["correlation_id"]) <= set(runtime["correlation_id"])


def test_kernel_names_are_demangled_as_cxxfilt_does() -> None:
    from dlprof.support.demangle import demangle

    symbols = ["_Z6saxpyifPfS_",
               "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEEviT0_T1_"]
    if shutil.which("c++filt") is None:
        pytest.skip("binutils' c++filt is not installed: no independent demangler to compare with")
    expected = subprocess.run(["c++filt", *symbols], capture_output=True, text=True, check=True).stdout.split("\n")
    assert [demangle(s) for s in symbols] == expected[:2]
    assert demangle("volta_sgemm_128x64_nn") == "volta_sgemm_128x64_nn"  # a C kernel: unchanged
    assert demangle("_Znot_a_symbol") == "_Znot_a_symbol"


@needs_cupti
def test_peer_to_peer_copies_keep_their_devices() -> None:
    import cupti.cupti as c
    import orjson

    assert int(c.ActivityKind.MEMCPY2) == cupti_collector.ACTIVITY_MEMCPY2
    copy = c.ActivityMemcpyPtoP4()
    for field, value in dict(kind=int(c.ActivityKind.MEMCPY2), start=10, end=30, device_id=0,
                             src_device_id=0, dst_device_id=3, stream_id=7, correlation_id=5,
                             bytes=1 << 20, copy_kind=int(c.ActivityMemcpyKind.PTOP),
                             src_kind=int(c.ActivityMemoryKind.DEVICE),
                             dst_kind=int(c.ActivityMemoryKind.DEVICE)).items():
        setattr(copy, field, value)
    record = record_from_activity(copy)
    assert record is not None
    row = records_to_slices([record], id_base=0, clock_offset_ns=0, pid=1).to_pylist()[0]
    assert (row["kind"], row["category"], row["name"]) == ("memcpy", "Memcpy PtoP", "Memcpy PtoP (Device -> Device)")
    assert (row["device"], row["bytes"], row["dur_ns"]) == ("cuda:0", 1 << 20, 20)
    assert orjson.loads(row["args"]) == {"fromDevice": 0, "inDevice": 0, "toDevice": 3}
    assert pa_schema_fits(records_to_slices([record], 0, 0, 1))
