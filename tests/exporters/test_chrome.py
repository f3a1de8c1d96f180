"""The Chrome exporter: Kineto's layout, read back as JSON and through dlprof's Kineto importer."""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

import dlprof
from dlprof.exporters.chrome import ChromeExporter
from dlprof.importers.kineto import KinetoOptions, convert_trace, read_trace
from dlprof.keys import RunStatus, StoreTable
from dlprof.store.manifest import Manifest
from dlprof.store.reader import Run
from dlprof.store.safe_files import SymlinkTargetError
from dlprof.store.writer import RankWriter
from tests.builders import counted_run
from tests.references import EXPECTED_CATEGORY, expected_rates


def export(run_dir: Path, out: Path) -> tuple[Run, dict[str, Any]]:
    run = dlprof.load(run_dir)
    [path] = ChromeExporter().export(run, out / "trace.json")
    return run, json.loads(path.read_bytes())


def slice_events(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def ns(trace: dict[str, Any], us: float) -> int:
    return int(trace["baseTimeNanoseconds"]) + round(us * 1000)


def keyed(trace: dict[str, Any], event: dict[str, Any]) -> tuple[str, int, int]:
    return event["name"], ns(trace, event["ts"]), round(event["dur"] * 1000)


def store_key(row: Any) -> tuple[str, int, int]:
    return row.name, int(row.start_ns), int(row.dur_ns)


def test_header_keys_come_in_kineto_order(gpu_run: Path, tmp_path: Path) -> None:
    run, trace = export(gpu_run, tmp_path)
    assert list(trace)[:6] == ["schemaVersion", "deviceProperties", "distributedInfo",
                               "displayTimeUnit", "baseTimeNanoseconds", "traceEvents"]
    assert trace["schemaVersion"] == 1 and trace["displayTimeUnit"] == "ms"
    assert trace["distributedInfo"] == {"rank": 0, "world_size": 1}
    assert trace["deviceProperties"] == run.manifest.devices
    assert trace["deviceProperties"][0]["name"].startswith("NVIDIA A100")


def test_base_time_is_the_earliest_timestamp_floored_to_a_second(cnn_run: Path, tmp_path: Path) -> None:
    run, trace = export(cnn_run, tmp_path)
    base = trace["baseTimeNanoseconds"]
    earliest = min(int(run.slices.start_ns.min()), int(run.memory.ts_ns.min()),
                   int(run.counters.ts_ns.min()))
    assert base % 1_000_000_000 == 0
    assert 0 <= earliest - base < 1_000_000_000
    assert min(ns(trace, e["ts"]) for e in slice_events(trace)) == int(run.slices.start_ns.min())
    # Three decimals at most: every timestamp is a whole number of nanoseconds.
    assert all(abs(e["ts"] * 1000 - round(e["ts"] * 1000)) < 1e-3 for e in slice_events(trace))


@pytest.mark.parametrize("run_name", ["cnn_run", "gpu_run"])
def test_every_slice_is_written_once_with_its_times(run_name: str, tmp_path: Path,
                                                    request: pytest.FixtureRequest) -> None:
    run, trace = export(request.getfixturevalue(run_name), tmp_path)
    written = Counter(keyed(trace, e) for e in slice_events(trace))
    assert written == Counter(store_key(row) for row in run.slices.itertuples())


@pytest.mark.parametrize("run_name", ["cnn_run", "gpu_run"])
def test_each_kind_has_its_kineto_category(run_name: str, tmp_path: Path,
                                           request: pytest.FixtureRequest) -> None:
    run, trace = export(request.getfixturevalue(run_name), tmp_path)
    category = {keyed(trace, e): e["cat"] for e in slice_events(trace)}
    kinds = set(run.slices.kind)
    assert kinds <= set(EXPECTED_CATEGORY), kinds - set(EXPECTED_CATEGORY)
    for row in run.slices.itertuples():
        assert category[store_key(row)] == EXPECTED_CATEGORY[row.kind], (row.kind, row.name)


def test_steps_are_profiler_steps(cnn_run: Path, tmp_path: Path) -> None:
    _, trace = export(cnn_run, tmp_path)
    steps = [e for e in slice_events(trace) if e["name"].startswith("ProfilerStep#")]
    assert len(steps) >= 6 and {e["cat"] for e in steps} == {"user_annotation"}


def test_slices_nest_per_thread_as_in_the_store(cnn_run: Path, tmp_path: Path) -> None:
    run, trace = export(cnn_run, tmp_path)
    depth_in_store = {store_key(row): int(row.depth) for row in run.slices.itertuples()}
    by_thread: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for event in slice_events(trace):
        by_thread[(event["pid"], event["tid"])].append(event)
    for events in by_thread.values():
        events.sort(key=lambda e: (ns(trace, e["ts"]), -e["dur"], depth_in_store[keyed(trace, e)]))
        open_ends: list[int] = []
        for event in events:
            start = ns(trace, event["ts"])
            end = start + round(event["dur"] * 1000)
            while open_ends and start >= open_ends[-1]:
                open_ends.pop()
            # Contained in the slice it starts inside: Chrome viewers nest by containment.
            assert not open_ends or end <= open_ends[-1], event["name"]
            assert len(open_ends) == depth_in_store[keyed(trace, event)], event["name"]
            open_ends.append(end)


def test_op_arguments_use_kineto_names(cnn_run: Path, tmp_path: Path) -> None:
    run, trace = export(cnn_run, tmp_path)
    by_key = {keyed(trace, e): e for e in slice_events(trace)}
    ops = run.slices[run.slices.kind == "op"]
    assert ops.input_shapes.notna().any() and ops.flops.notna().any()
    for row in ops.itertuples():
        args = by_key[store_key(row)].get("args", {})
        assert args.get("External id") == (None if pd.isna(row.external_id) else row.external_id)
        assert args.get("Sequence number") == (None if pd.isna(row.sequence_nr) else row.sequence_nr)
        assert args.get("flops") == (None if pd.isna(row.flops) else row.flops)
        if not pd.isna(row.input_shapes):
            assert args["Input Dims"] == json.loads(row.input_shapes)
            assert args["Input type"] == json.loads(row.input_dtypes)
        assert "stream" not in args and "device" not in args  # Kineto's mark of device work


def test_device_work_in_kineto_layout(gpu_run: Path, tmp_path: Path) -> None:
    run, trace = export(gpu_run, tmp_path)
    by_key = {keyed(trace, e): e for e in slice_events(trace)}
    kernels = run.slices[run.slices.kind == "kernel"]
    assert len(kernels) > 10
    for row in kernels.itertuples():
        event = by_key[store_key(row)]
        args = event["args"]
        assert event["pid"] == 0 and event["tid"] == row.stream  # device index, stream
        assert args["device"] == 0 and args["stream"] == row.stream
        assert args["correlation"] == row.correlation_id
        assert args["grid"] == json.loads(row.grid) and args["block"] == json.loads(row.block)
        assert args["registers per thread"] == row.registers
        assert args["est. achieved occupancy %"] == pytest.approx(row.occupancy)
    memcpy = next(run.slices[run.slices.kind == "memcpy"].itertuples())
    assert by_key[store_key(memcpy)]["args"]["bytes"] == memcpy.bytes


def test_process_and_thread_metadata(gpu_run: Path, tmp_path: Path) -> None:
    _, trace = export(gpu_run, tmp_path)
    meta = {(e["name"], e["pid"], e["tid"]): e["args"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert meta[("process_labels", 0, 0)] == {"labels": "GPU 0"}
    assert meta[("process_sort_index", 0, 0)] == {"sort_index": 0x1000000}
    assert meta[("process_labels", 493459, 0)] == {"labels": "CPU"}
    assert meta[("process_name", 493459, 0)] == {"name": "python3.10"}
    assert meta[("thread_name", 0, 7)] == {"name": "stream 7"}
    assert meta[("thread_name", 0, 20)] == {"name": "stream 20"}
    assert meta[("thread_name", 493459, 493459)] == {"name": "thread 493459 (python3.10)"}
    described = {(pid, tid) for (name, pid, tid) in meta if name == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in slice_events(trace)} <= described


def test_launch_flows_pair_runtime_calls_with_their_device_work(gpu_run: Path, tmp_path: Path) -> None:
    run, trace = export(gpu_run, tmp_path)
    slices = run.slices[run.slices.correlation_id.notna()]
    on_cpu = set(slices[slices.device == "cpu"].correlation_id)
    on_device = set(slices[slices.device != "cpu"].correlation_id)
    starts = {e["id"]: e for e in trace["traceEvents"] if e["ph"] == "s"}
    ends = {e["id"]: e for e in trace["traceEvents"] if e["ph"] == "f"}
    assert len(starts) == sum(e["ph"] == "s" for e in trace["traceEvents"])  # ids unique
    assert set(starts) == set(ends) == on_cpu & on_device and len(starts) > 50
    begins = {(e["pid"], e["tid"], e["ts"], e["args"].get("correlation")): e
              for e in slice_events(trace) if "args" in e}
    for flow_id, start in starts.items():
        end = ends[flow_id]
        assert start["cat"] == end["cat"] == "ac2g" and end["bp"] == "e"
        assert begins[(start["pid"], start["tid"], start["ts"], flow_id)]["cat"] == "cuda_runtime"
        target = begins[(end["pid"], end["tid"], end["ts"], flow_id)]
        assert target["cat"] in ("kernel", "gpu_memcpy", "gpu_memset", "cuda_sync")


def test_counters_and_memory_instants(cnn_run: Path, tmp_path: Path) -> None:
    run, trace = export(cnn_run, tmp_path)
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    written = Counter((f"{e['name']}.{series}", ns(trace, e["ts"]), value)
                      for e in counters for series, value in e["args"].items())
    assert written == Counter(zip(run.counters.track, run.counters.ts_ns, run.counters.value, strict=True))
    memory = [e for e in trace["traceEvents"] if e["ph"] == "i" and e["name"] == "[memory]"]
    assert len(memory) == len(run.memory) > 0
    tid_of = dict(zip(run.slices.id, run.slices.tid, strict=True))
    for event, row in zip(sorted(memory, key=lambda e: e["ts"]), run.memory.sort_values("ts_ns").itertuples(), strict=True):
        args = event["args"]
        assert ns(trace, event["ts"]) == row.ts_ns and args["Bytes"] == row.bytes
        assert args["Total Allocated"] == row.total_allocated and args["Addr"] == row.addr
        assert (args["Device Type"], args["Device Id"]) == (0, -1)
        assert event["tid"] == (tid_of[row.slice_id] if not pd.isna(row.slice_id) else row.pid)


ROUND_TRIP_COLUMNS = [
    "pid", "tid", "device", "name", "start_ns", "dur_ns", "correlation_id", "external_id",
    "sequence_nr", "input_shapes", "input_dtypes", "grid", "block", "registers",
    "shared_memory", "blocks_per_sm", "warps_per_sm", "occupancy", "stream", "flops", "bytes",
]
# The importer's kinds for what it reads back: python_function events (dlprof's modules) come
# back as python.
KIND_READ_BACK = {"module": "python"}


def comparable(frame: pd.DataFrame) -> list[tuple[Any, ...]]:
    rows = frame[ROUND_TRIP_COLUMNS].astype(object).where(frame[ROUND_TRIP_COLUMNS].notna(), None)
    return sorted(map(tuple, rows.itertuples(index=False)), key=repr)


@pytest.mark.parametrize("run_name", ["cnn_run", "gpu_run"])
def test_round_trip_through_the_kineto_importer(run_name: str, tmp_path: Path,
                                                request: pytest.FixtureRequest) -> None:
    run, _ = export(request.getfixturevalue(run_name), tmp_path)
    regions = frozenset(run.slices[run.slices.kind == "region"].name)
    back = convert_trace(read_trace(tmp_path / "trace.json"),
                         KinetoOptions(id_base=0, region_names=regions))
    back_slices = back.slices.to_pandas()
    assert comparable(back_slices) == comparable(run.slices)
    expected_kinds = Counter(KIND_READ_BACK.get(k, k) for k in run.slices.kind)
    assert Counter(back_slices.kind) == expected_kinds
    memory_columns = ["device", "ts_ns", "bytes", "total_allocated", "total_reserved", "addr"]
    back_memory = back.memory.to_pandas()[memory_columns].sort_values("ts_ns", kind="stable")
    assert back_memory.values.tolist() == run.memory[memory_columns].sort_values("ts_ns", kind="stable").values.tolist()
    back_counters = back.counters.to_pandas()
    assert sorted(zip(back_counters.track, back_counters.ts_ns, back_counters.value, strict=True)) == sorted(
        zip(run.counters.track, run.counters.ts_ns, run.counters.value, strict=True))


def test_one_file_per_rank_on_one_time_base(two_rank_run: Path, tmp_path: Path) -> None:
    run = dlprof.load(two_rank_run)
    paths = ChromeExporter().export(run, tmp_path / "job.json")
    assert paths == [tmp_path / "job.rank0.json", tmp_path / "job.rank1.json"]
    assert not (tmp_path / "job.json").exists()
    traces = [json.loads(p.read_bytes()) for p in paths]
    for rank, (path, trace) in enumerate(zip(paths, traces, strict=True)):
        assert trace["distributedInfo"] == {"rank": rank, "world_size": 2}
        # Holistic Trace Analysis's own pattern, on the first line that matches it.
        with path.open() as lines:
            found = next(m for line in lines if (m := re.search(r'"rank":\s+(\d+)', line)))
        assert int(found.group(1)) == rank
        assert len(slice_events(trace)) == int((run.slices["rank"] == rank).sum())
    assert traces[0]["baseTimeNanoseconds"] == traces[1]["baseTimeNanoseconds"]


def test_a_rank_refused_leaves_no_other_ranks_file(two_rank_run: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (tmp_path / "job.rank1.json").symlink_to(victim)
    with pytest.raises(SymlinkTargetError):
        ChromeExporter().export(dlprof.load(two_rank_run), tmp_path / "job.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.rank1.json", "victim.txt"], \
        "rank 0's file is not written when rank 1's is refused, and no temporary is left"
    assert victim.read_text() == "keep me"


def test_a_foreign_traces_extra_arguments_are_kept(tmp_path: Path) -> None:
    """Arguments only in ``args`` JSON come along; where a typed column says otherwise, it wins."""
    run_dir = tmp_path / "foreign"
    slices = pa.table({
        "id": [1, 2], "pid": [10, 10], "tid": [11, 11], "device": [None, "cpu"],
        "kind": ["runtime", "python_function"], "category": ["cuda_driver", "blink"],
        "name": ["cuLaunchKernel", "f"], "start_ns": [5_000_000_000, 5_000_001_000],
        "dur_ns": [500, 200], "external_id": [7, None],
        "args": ['{"cbid": 307, "External id": 99}', '{"nested": {"a": [1, 2]}}'],
    })
    RankWriter(run_dir, 0).write_chunk(StoreTable.SLICES, slices, "test")
    RankWriter(run_dir, 0).compact()
    Manifest(name="foreign", command=["chrome"], status=RunStatus.COMPLETE).write(run_dir)
    _, trace = export(run_dir, tmp_path)
    events = {e["name"]: e for e in slice_events(trace)}
    assert events["cuLaunchKernel"]["args"] == {"External id": 7, "cbid": 307}
    assert events["cuLaunchKernel"]["cat"] == "cuda_driver" and events["cuLaunchKernel"]["pid"] == 10
    assert events["f"]["args"] == {"nested": {"a": [1, 2]}} and events["f"]["cat"] == "blink"
    assert trace["baseTimeNanoseconds"] == 5_000_000_000 and events["cuLaunchKernel"]["ts"] == 0.0


def test_cpu_counters_per_step_and_region_are_rate_tracks(tmp_path: Path) -> None:
    run, trace = export(counted_run(tmp_path / "run"), tmp_path)
    pid = int(run.slices["pid"].iloc[0])
    for kind, suffix in (("step", ""), ("region", " (regions)")):
        expected = expected_rates(run, kind)
        assert set(expected) == {"perf:task-clock", "perf:page-faults"}
        for metric, samples in expected.items():
            events = [e for e in trace["traceEvents"] if e["ph"] == "C" and e["name"] == metric + suffix]
            assert {e["pid"] for e in events} == {pid}
            starts = {ns(trace, e["ts"]): e["args"]["value"] for e in events}
            for start, rate in samples:
                assert starts[start] == pytest.approx(rate)
            assert events[-1]["args"]["value"] == 0  # nothing is counted after the last one
    task_clock = [rate for _, rate in expected_rates(run, "step")["perf:task-clock"]]
    assert all(rate > 0 for rate in task_clock)
