"""The Perfetto exporter: the protobuf parsed back, slices rebuilt from begin/end order.

TraceProcessor needs a binary it downloads, so the trace is checked the way a reader would
consume it: packets in file order, interned names resolved per sequence, slices rebuilt from
their begin and end events with a stack per track.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from tests.exporters.perfetto_trace import Parsed, export
from tests.references import EXPECTED_CATEGORY


def thread_of(parsed: Parsed, track: int) -> int:
    return int(parsed.tracks[track].thread.tid)


def test_one_sequence_with_its_state_cleared_first(cnn_run: Path, tmp_path: Path) -> None:
    _, parsed = export(cnn_run, tmp_path)
    first = parsed.packets[0]
    assert first.first_packet_on_sequence
    assert first.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
    assert {p.trusted_packet_sequence_id for p in parsed.packets} == {1}
    described = max(i for i, p in enumerate(parsed.packets) if p.HasField("track_descriptor"))
    first_event = min(i for i, p in enumerate(parsed.packets) if p.HasField("track_event"))
    assert described < first_event


def test_the_trace_clock_is_declared_wall_clock_time(cnn_run: Path, tmp_path: Path) -> None:
    run, parsed = export(cnn_run, tmp_path)
    [snapshot] = [p.clock_snapshot for p in parsed.packets if p.HasField("clock_snapshot")]
    clocks = {c.clock_id: c.timestamp for c in snapshot.clocks}
    start = int(run.slices.start_ns.min())
    assert clocks == {pb.BUILTIN_CLOCK_BOOTTIME: start, pb.BUILTIN_CLOCK_REALTIME: start}
    assert not any(p.HasField("timestamp_clock_id") for p in parsed.packets)


@pytest.mark.parametrize("run_name", ["cnn_run", "gpu_run"])
def test_slices_depths_and_durations_match_the_store(run_name: str, tmp_path: Path,
                                                      request: pytest.FixtureRequest) -> None:
    run, parsed = export(request.getfixturevalue(run_name), tmp_path)
    written = Counter((s.name, s.start, s.end - s.start, s.depth) for s in parsed.slices)
    stored = Counter(zip(run.slices.name, run.slices.start_ns, run.slices.dur_ns, run.slices.depth, strict=True))
    assert len(parsed.slices) == len(run.slices)
    assert written == stored


@pytest.mark.parametrize("run_name", ["cnn_run", "gpu_run"])
def test_each_kind_has_its_kineto_category(run_name: str, tmp_path: Path,
                                           request: pytest.FixtureRequest) -> None:
    run, parsed = export(request.getfixturevalue(run_name), tmp_path)
    category = {(s.name, s.start, s.end - s.start): s.category for s in parsed.slices}
    for name, start, dur, kind in zip(run.slices.name, run.slices.start_ns, run.slices.dur_ns,
                                      run.slices.kind, strict=True):
        assert category[(name, start, dur)] == EXPECTED_CATEGORY[kind], (kind, name)


def test_processes_and_threads(cnn_run: Path, tmp_path: Path) -> None:
    run, parsed = export(cnn_run, tmp_path)
    processes = {u: t for u, t in parsed.tracks.items() if t.HasField("process")}
    threads = {u: t for u, t in parsed.tracks.items() if t.HasField("thread")}
    assert {t.process.pid for t in processes.values()} == set(run.slices.pid)
    assert {t.thread.tid for t in threads.values()} == set(run.slices.tid)
    for thread in threads.values():
        assert thread.parent_uuid in processes
        assert thread.thread.pid == processes[thread.parent_uuid].process.pid
    assert Counter(thread_of(parsed, s.track) for s in parsed.slices) == Counter(run.slices.tid)


def test_op_arguments(cnn_run: Path, tmp_path: Path) -> None:
    run, parsed = export(cnn_run, tmp_path)
    by_key = {(s.name, s.start): s for s in parsed.slices}
    ops = run.slices[(run.slices.kind == "op") & run.slices.input_shapes.notna()]
    assert len(ops) > 100
    for row in ops.itertuples():
        args = by_key[(row.name, row.start_ns)].args
        assert args["Input Dims"] == json.loads(row.input_shapes)
        assert args["External id"] == row.external_id


def test_counters_and_memory_become_counter_tracks(cnn_run: Path, tmp_path: Path) -> None:
    run, parsed = export(cnn_run, tmp_path)
    by_name = {t.name: (u, t) for u, t in parsed.tracks.items() if t.HasField("counter")}
    for track, rows in run.counters.groupby("track"):
        uuid, descriptor = by_name[str(track)]
        assert parsed.counters[uuid] == list(zip(rows.ts_ns, rows.value, strict=True))
        assert parsed.tracks[descriptor.parent_uuid].HasField("process")
    assert by_name["host.rss"][1].counter.unit == pb.CounterDescriptor.UNIT_SIZE_BYTES
    assert by_name["host.cpu_percent"][1].counter.unit_name == "%"
    memory = run.memory.sort_values("ts_ns", kind="stable")
    uuid, _ = by_name["memory.allocated (cpu)"]
    assert parsed.counters[uuid] == list(zip(memory.ts_ns, memory.total_allocated.astype(float), strict=True))


def test_gpu_streams_under_their_device(gpu_run: Path, tmp_path: Path) -> None:
    run, parsed = export(gpu_run, tmp_path)
    device_work = run.slices[run.slices.device != "cpu"]
    def stream_of(name: str) -> str:  # overlapping work is drawn on lanes beside its stream
        return name.split(" (overlap")[0]

    streams = {u: t for u, t in parsed.tracks.items() if t.name.startswith("stream ")}
    assert sorted({stream_of(t.name) for t in streams.values()}) == sorted(f"stream {s}" for s in set(device_work.tid))
    assert {parsed.tracks[t.parent_uuid].name for t in streams.values()} == {"cuda:0"}
    on_streams = Counter(stream_of(parsed.tracks[s.track].name) for s in parsed.slices if s.track in streams)
    assert on_streams == Counter(f"stream {tid}" for tid in device_work.tid)
    lanes = [t for t in streams.values() if "(overlap" in t.name]
    ordered = device_work.sort_values(["tid", "start_ns"])
    ends = (ordered.start_ns + ordered.dur_ns).groupby(ordered.tid).cummax().groupby(ordered.tid).shift()
    overlapping = int((ordered.start_ns < ends).sum())
    assert bool(lanes) == (overlapping > 0)


def test_flows_lead_from_runtime_calls_to_device_work(gpu_run: Path, tmp_path: Path) -> None:
    run, parsed = export(gpu_run, tmp_path)
    correlated = run.slices[run.slices.correlation_id.notna()]
    pairs = set(correlated[correlated.device == "cpu"].correlation_id) & set(
        correlated[correlated.device != "cpu"].correlation_id)
    sources = {f: s for s in parsed.slices for f in s.flows_out}
    targets = {f: s for s in parsed.slices for f in s.flows_in}
    assert sum(len(s.flows_out) for s in parsed.slices) == len(sources)  # each id starts once
    assert set(sources) == set(targets) and len(sources) == len(pairs) > 50
    assert 0 not in sources
    for flow, source in sources.items():
        target = targets[flow]
        assert source.category == "cuda_runtime"
        assert target.category in ("kernel", "gpu_memcpy", "gpu_memset", "cuda_sync")
        assert source.args["correlation"] == target.args["correlation"]
        assert "stream" in target.args and "stream" not in source.args


def test_ranks_get_their_own_processes_and_flows(two_rank_run: Path, gpu_run: Path,
                                                  tmp_path: Path) -> None:
    run, parsed = export(two_rank_run, tmp_path)
    processes = [t for t in parsed.tracks.values() if t.HasField("process")]
    assert sorted(t.process.process_name for t in processes) == [
        "python3.10 (rank 0)", "python3.10 (rank 1)"]
    # Both ranks recorded the same pid and tid; Perfetto needs them distinct across the trace.
    assert len({t.process.pid for t in processes}) == 2
    threads = [t for t in parsed.tracks.values() if t.HasField("thread")]
    assert len({t.thread.tid for t in threads}) == len(threads) == 2
    assert sorted(t.name for t in parsed.tracks.values() if t.name.startswith("cuda")) == [
        "cuda:0 (rank 0)", "cuda:0 (rank 1)"]
    assert len(parsed.slices) == len(run.slices)
    # The ranks share correlation ids; their flows must not join across ranks.
    _, one_rank = export(gpu_run, tmp_path / "one")
    flows = [f for s in parsed.slices for f in s.flows_out]
    assert len(flows) == len(set(flows)) == 2 * sum(len(s.flows_out) for s in one_rank.slices)
    targets = {f: s for s in parsed.slices for f in s.flows_in}

    def rank_label(track: int) -> str:  # "(rank N)", from the process or device track above
        parent = parsed.tracks[parsed.tracks[track].parent_uuid]
        name = str(parent.process.process_name if parent.HasField("process") else parent.name)
        return name[name.index("(rank"):]

    for source in (s for s in parsed.slices if s.flows_out):
        assert rank_label(source.track) == rank_label(targets[source.flows_out[0]].track)


def test_cpu_counters_per_step_and_region_are_rate_tracks(tmp_path: Path) -> None:
    from tests.builders import counted_run
    from tests.references import expected_rates

    run, parsed = export(counted_run(tmp_path / "run"), tmp_path)
    by_name = {t.name: (u, t) for u, t in parsed.tracks.items() if t.HasField("counter")}
    for kind, suffix in (("step", ""), ("region", " (regions)")):
        for metric, samples in expected_rates(run, kind).items():
            uuid, descriptor = by_name[metric + suffix]
            assert descriptor.counter.unit_name == "/s"
            assert parsed.tracks[descriptor.parent_uuid].HasField("process")
            written = dict(parsed.counters[uuid])
            for start, rate in samples:
                assert written[start] == pytest.approx(rate)
            assert parsed.counters[uuid][-1][1] == 0
