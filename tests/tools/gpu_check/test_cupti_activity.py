"""The cupti check's comparisons, both sides built from one real recorded A100 trace.

The trace's kernels, copies, memsets and CUDA API calls become cupti-python's own record objects
(``ActivityKernel9``, ``ActivityMemcpy5``, ``ActivityMemset4``, ``ActivityAPI``). dlprof's side goes
through the cupti collector's translation into a run; the reference side through the bare
tracer's :func:`describe`, as on a GPU. They agree; a record lost, a copy labelled wrongly by
dlprof's tables, or a launch CUPTI links elsewhere each fail the part that should catch it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import dlprof
from dlprof.store.manifest import ClockDomain, CollectorInfo, Manifest
from dlprof.store.reader import Run
from tests.conftest import needs_cupti
from tests.tools.gpu_check.recorded import ALEXNET, ns, raw_events
from tools.gpu_check.compare import Work
from tools.gpu_check.report import Status

pytestmark = needs_cupti

# A real mangled symbol, given to the trace's first kernel: both sides must read it demangled.
MANGLED = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEEviT0_T1_"
_COPY = re.compile(r"Memcpy (\S+) \((.+) -> (.+)\)")
_SET = re.compile(r"Memset \((.+)\)")


def _enum(enum: Any, label: str) -> int:
    return int(enum[label.strip().upper().replace(" ", "_")])


def _record(cls: Any, **fields: Any) -> Any:
    record = cls()
    for name, value in fields.items():
        setattr(record, name, value)
    return record


def activities(events: list[dict[str, Any]]) -> tuple[list[Any], dict[tuple[str, int], str]]:
    """The trace as cupti-python activity records, and the API calls' names by (kind, cbid)."""
    import cupti.cupti as c

    records, names = [], {}
    renamed = False
    for event in events:
        args, category = event.get("args", {}), event.get("cat")
        start = ns(event["ts"])
        common = dict(start=start, end=start + ns(event["dur"]), correlation_id=int(args.get("correlation", 0)))
        if category == "kernel":
            name = event["name"] if renamed else MANGLED
            renamed = True
            grid, block = args.get("grid", [1, 1, 1]), args.get("block", [1, 1, 1])
            records.append(_record(c.ActivityKernel9, kind=int(c.ActivityKind.CONCURRENT_KERNEL), name=name,
                                   device_id=int(args["device"]), stream_id=int(args["stream"]),
                                   grid_x=grid[0], grid_y=grid[1], grid_z=grid[2], block_x=block[0],
                                   block_y=block[1], block_z=block[2], **common))
        elif category == "gpu_memcpy":
            copy, src, dst = _COPY.fullmatch(event["name"]).groups()  # type: ignore[union-attr]
            records.append(_record(c.ActivityMemcpy5, kind=int(c.ActivityKind.MEMCPY), bytes=int(args["bytes"]),
                                   copy_kind=_enum(c.ActivityMemcpyKind, copy),
                                   src_kind=_enum(c.ActivityMemoryKind, src), dst_kind=_enum(c.ActivityMemoryKind, dst),
                                   device_id=int(args["device"]), stream_id=int(args["stream"]), **common))
        elif category == "gpu_memset":
            memory = _SET.fullmatch(event["name"]).group(1)  # type: ignore[union-attr]
            records.append(_record(c.ActivityMemset4, kind=int(c.ActivityKind.MEMSET), bytes=int(args["bytes"]),
                                   memory_kind=_enum(c.ActivityMemoryKind, memory), device_id=int(args["device"]),
                                   stream_id=int(args["stream"]), **common))
        elif category in ("cuda_runtime", "cuda_driver"):
            kind = "RUNTIME" if category == "cuda_runtime" else "DRIVER"
            names[(kind, int(args["cbid"]))] = event["name"]
            records.append(_record(c.ActivityAPI, kind=int(c.ActivityKind[kind]), cbid=int(args["cbid"]),
                                   thread_id=int(event["tid"]), process_id=int(event["pid"]), **common))
    return records, names


def dlprof_run(records: list[Any], names: dict[tuple[str, int], str], run_dir: Path) -> Run:
    """The records through the cupti collector's translation into a complete run."""
    import pyarrow as pa

    from dlprof.collectors.cupti import (
        ACTIVITY_DRIVER,
        ACTIVITY_RUNTIME,
        record_from_activity,
        records_to_slices,
    )
    from dlprof.keys import RunStatus, StoreTable
    from dlprof.store.ids import SLOT_CUPTI, id_base
    from dlprof.store.writer import RankWriter

    by_kind = {"RUNTIME": ACTIVITY_RUNTIME, "DRIVER": ACTIVITY_DRIVER}
    api_names = {(by_kind[kind], cbid): name for (kind, cbid), name in names.items()}
    kept = [r for r in (record_from_activity(a, api_names) for a in records) if r is not None]
    offset = 1_700_000_000_000_000_000
    table: pa.Table = records_to_slices(kept, id_base(0, SLOT_CUPTI), offset, pid=1)
    writer = RankWriter(run_dir, 0)
    writer.write_chunk(StoreTable.SLICES, table, "cupti")
    counts, _ = writer.compact()
    start = min(r.start for r in kept) + offset
    Manifest(name="cupti", command=["python", "cupy_work.py"], status=RunStatus.COMPLETE, start_ns=start - 10**6,
             end_ns=max(r.end for r in kept) + offset + 10**6, counts=counts,
             collectors=[CollectorInfo("cupti")],
             clocks=[ClockDomain("cupti", "sampled at start", offset, (offset - 50, offset + 50))]).write(run_dir)
    return dlprof.load(run_dir)


def both_sides(run_dir: Path, events: list[dict[str, Any]]) -> tuple[list[Work], list[str], list[Work], list[str]]:
    import cupti.cupti as c

    from tools.gpu_check.checks.cupti_activity import reference_work, stored_key
    from tools.gpu_check.checks.stored import Link, api_calls, device_work
    from tools.gpu_check.programs.cupti_reference import describe

    records, names = activities(events)
    reference_names = dict(names)  # describe() fills it as the live tracer does; here it is known
    described = [d for d in (describe(a, c, reference_names) for a in records) if d is not None]
    theirs, their_calls = reference_work(described)
    run = dlprof_run(records, names, run_dir)
    return device_work(run, Link.API_CALL, stored_key), api_calls(run), theirs, their_calls


@pytest.fixture(scope="module")
def events() -> list[dict[str, Any]]:
    return raw_events(ALEXNET)


def test_the_collectors_records_match_cuptis_own(tmp_path: Path, events: list[dict[str, Any]]) -> None:
    from tools.gpu_check.checks.cupti_activity import compare_activity

    ours, our_calls, theirs, their_calls = both_sides(tmp_path / "run", events)
    assert len(ours) == 98 and len(our_calls) == 361
    assert {w.name for w in theirs if w.kind == "memcpy"} == {"HTOD PAGEABLE -> DEVICE"}
    assert "void at::native::vectorized_elementwise_kernel<4" in next(w.name for w in ours if w.kind == "kernel")
    parts = compare_activity(ours, our_calls, theirs, their_calls)
    assert [p.status for p in parts] == [Status.PASSED] * len(parts), [p.detail for p in parts]
    assert {w.launcher for w in ours} == {"cudaLaunchKernel", "cudaMemcpyAsync", "cudaMemsetAsync"}


def test_a_lost_launch_record_fails_the_calls_and_the_links(tmp_path: Path, events: list[dict[str, Any]]) -> None:
    from tools.gpu_check.checks.cupti_activity import compare_activity

    kernel = next(e for e in events if e.get("cat") == "kernel")
    launch = next(e for e in events if e.get("cat") == "cuda_runtime"
                  and e["args"].get("correlation") == kernel["args"]["correlation"])
    ours, our_calls, _, _ = both_sides(tmp_path / "ours", events)
    _, _, theirs, their_calls = both_sides(tmp_path / "theirs", [e for e in events if e is not launch])
    failed = {p.what for p in compare_activity(ours, our_calls, theirs, their_calls) if p.status is Status.FAILED}
    assert failed == {"CUDA runtime and driver calls per name equal CUPTI's",
                      "each kernel, copy and memset has the launching op the reference gives it"}


def test_a_wrong_memory_kind_label_in_dlprof_fails_the_copy_count(
        tmp_path: Path, events: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    from dlprof.collectors import cupti as collector
    from tools.gpu_check.checks.cupti_activity import compare_activity

    swapped = list(collector.MEMORY_KINDS)
    swapped[1], swapped[2] = swapped[2], swapped[1]  # Pageable <-> Pinned: a bug in dlprof's table
    monkeypatch.setattr(collector, "MEMORY_KINDS", tuple(swapped))
    ours, our_calls, theirs, their_calls = both_sides(tmp_path / "run", events)
    parts = {p.what: p for p in compare_activity(ours, our_calls, theirs, their_calls)}
    copies = parts["memcpy calls per name equal the reference's"]
    assert copies.status is Status.FAILED
    assert {d["name"] for d in copies.figures["differing"]} == {"HTOD PINNED -> DEVICE", "HTOD PAGEABLE -> DEVICE"}
    assert parts["kernel calls per name equal the reference's"].status is Status.PASSED


def test_stored_names_read_back_as_cuptis_enums() -> None:
    from tools.gpu_check.checks.cupti_activity import stored_key

    assert stored_key("memcpy", "Memcpy DtoH (Device -> Pageable)") == "DTOH DEVICE -> PAGEABLE"
    assert stored_key("memcpy", "Memcpy PtoP (Device Static -> Device)") == "PTOP DEVICE_STATIC -> DEVICE"
    assert stored_key("memset", "Memset (Managed)") == "MANAGED"
    assert stored_key("kernel", "Memset (Device)") == "Memset (Device)"  # only copies and memsets are read


def test_describe_names_fields_by_cuptis_enums_and_skips_other_kinds() -> None:
    import cupti.cupti as c

    from tools.gpu_check.programs.cupti_reference import describe

    copy = _record(c.ActivityMemcpy5, kind=int(c.ActivityKind.MEMCPY), start=10, end=30, correlation_id=4,
                   copy_kind=int(c.ActivityMemcpyKind.DTOH), src_kind=int(c.ActivityMemoryKind.DEVICE),
                   dst_kind=int(c.ActivityMemoryKind.PINNED), bytes=64)
    assert describe(copy, c, {}) == {"kind": "MEMCPY", "dur_ns": 20, "correlation_id": 4, "copy": "DTOH",
                                     "src": "DEVICE", "dst": "PINNED", "bytes": 64}
    call = _record(c.ActivityAPI, kind=int(c.ActivityKind.DRIVER), cbid=307, start=0, end=5, correlation_id=4)
    assert describe(call, c, {("DRIVER", 307): "cuLaunchKernel"})["api"] == "cuLaunchKernel"
    marker = _record(c.ActivityAPI, kind=int(c.ActivityKind.OVERHEAD), start=0, end=1, correlation_id=0)
    assert describe(marker, c, {}) is None
