"""``dlprof import`` of small valid traces mutated by hypothesis: never a traceback, never garbage.

Each example imports in-process through ``dlprof.cli.main.main`` and must either succeed, with
whatever was dropped counted and every stored time sound, or fail with exit 2 and one line on
stderr, leaving no run behind. The examples are derandomised, so a run of the suite is repeatable.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlprof
from dlprof.cli.main import main
from dlprof.importers.kineto_events import MAX_TIME_NS
from dlprof.importers.trace_file import dropped_text
from dlprof.keys import RunStatus

BASE_NS = 1_700_000_000_000_000_000
FUZZ = settings(derandomize=True, deadline=None, max_examples=30,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def valid_trace() -> dict[str, Any]:
    """A small trace of every phase the import reads, in Kineto's shape."""
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA A100", "totalGlobalMem": 1 << 30}],
        "distributedInfo": {"rank": 0, "world_size": 1},
        "baseTimeNanoseconds": BASE_NS,
        "traceEvents": [
            {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "ts": 0, "args": {"name": "python"}},
            {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 50,
             "args": {"Input Dims": [[2, 3], [3, 4]], "Input type": ["float", "float"], "External id": 4}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 20, "dur": 5,
             "args": {"correlation": 9}},
            {"ph": "X", "cat": "kernel", "name": "sgemm", "pid": 0, "tid": 7, "ts": 30, "dur": 8,
             "args": {"device": 0, "stream": 7, "correlation": 9, "grid": [1, 1, 1], "block": [128, 1, 1]}},
            {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 15, "s": "t",
             "args": {"Bytes": 64, "Total Allocated": 64, "Total Reserved": 0, "Addr": 1, "Device Id": -1,
                      "Device Type": 0}},
            {"ph": "C", "name": "gpu", "pid": 1, "ts": 40, "args": {"util": 50}},
            {"ph": "s", "cat": "ac2g", "name": "launch", "id": 9, "pid": 1, "tid": 1, "ts": 20},
            {"ph": "f", "cat": "ac2g", "name": "launch", "id": 9, "pid": 0, "tid": 7, "ts": 30, "bp": "e"},
        ],
    }


# Values of every JSON type, and numbers at and past every limit the import has.
hostile_values = st.one_of(
    st.none(), st.booleans(), st.text(max_size=4),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 2**53, 2**62, 2**63, 2**64, MAX_TIME_NS // 1000, MAX_TIME_NS // 1000 + 1]),
    st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([1e300, -1e300, 0.5, -0.0]),
    st.lists(st.integers(min_value=-3, max_value=3), max_size=2),
    st.dictionaries(st.sampled_from(["a", "rank", "stream"]), st.integers(min_value=-3, max_value=3), max_size=2),
)
EVENT_FIELDS = ["ph", "cat", "name", "ts", "dur", "pid", "tid", "args", "id", "s"]
ARG_FIELDS = ["Input Dims", "Input type", "External id", "correlation", "device", "stream", "grid", "Bytes",
              "Device Type", "Device Id", "flops", "util", "name"]
HEADER_FIELDS = ["deviceProperties", "distributedInfo", "baseTimeNanoseconds", "schemaVersion", "traceEvents"]


@st.composite
def mutated_traces(draw: st.DrawFn) -> dict[str, Any]:
    """A valid trace with one to four things broken: fields set or removed, events replaced."""
    trace = valid_trace()
    events: list[Any] = trace["traceEvents"]
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        where = draw(st.sampled_from(["event", "argument", "remove", "replace", "header", "rank"]))
        index = draw(st.integers(min_value=0, max_value=len(events) - 1))
        event = events[index]
        if where == "event" and isinstance(event, dict):
            event[draw(st.sampled_from(EVENT_FIELDS))] = draw(hostile_values)
        elif where == "argument" and isinstance(event, dict) and isinstance(event.get("args"), dict):
            event["args"][draw(st.sampled_from(ARG_FIELDS))] = draw(hostile_values)
        elif where == "remove" and isinstance(event, dict):
            event.pop(draw(st.sampled_from(EVENT_FIELDS)), None)
        elif where == "replace":
            events[index] = draw(hostile_values)
        elif where == "header":
            field = draw(st.sampled_from(HEADER_FIELDS[:-1]))
            trace[field] = draw(hostile_values)
        elif where == "rank" and isinstance(trace.get("distributedInfo"), dict):
            trace["distributedInfo"][draw(st.sampled_from(["rank", "world_size"]))] = draw(hostile_values)
    return trace


def write_trace(trace: dict[str, Any], path: Path, layout: str) -> None:
    """The trace as one of the layouts the import cuts (Kineto's, an event a line, one line)."""
    if layout == "blocks":
        text = json.dumps(trace, indent=2)
    elif layout == "lines":
        header = {key: value for key, value in trace.items() if key != "traceEvents"}
        lines = ",\n".join(json.dumps(event) for event in trace["traceEvents"])
        text = json.dumps(header)[:-1] + (", " if header else "") + '"traceEvents": [\n' + lines + "\n]}"
    else:
        text = json.dumps(trace)
    data = text.encode()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)


def run_import(trace: dict[str, Any], layout: str, folder: Path,
               name: str = "trace.json") -> tuple[int, str, str, Path]:
    """Import the trace in-process; any exception escapes to fail the test with its traceback."""
    path, out = folder / name, folder / "run"
    write_trace(trace, path, layout)
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = main(["import", "-o", str(out), str(path)])
    return status, stdout.getvalue(), stderr.getvalue(), out


def assert_sound_outcome(status: int, out: str, err: str, run_dir: Path) -> None:
    """Refused with one line and nothing left, or a complete run with sound times and counts."""
    if status == 2:
        assert out == "" and err.startswith("dlprof: error: ") and err.count("\n") == 1, err
        assert not run_dir.exists()
        return
    assert status == 0 and err == "", err
    run = dlprof.load(run_dir)
    assert run.status is RunStatus.COMPLETE
    assert all(path.name == f"rank={rank}" for path, rank in
               zip(sorted((run_dir / "slices").iterdir()), run.manifest.ranks, strict=True))
    dropped = run.manifest.dropped
    assert (f"dropped as damaged: {dropped_text(dropped)}\n" in out) == bool(dropped)
    first, last, shortest = run.query("SELECT min(start_ns), max(start_ns + dur_ns), min(dur_ns) FROM slices").rows[0]
    if first is not None:  # a run of counters or memory only has no slices
        assert -MAX_TIME_NS <= first and last <= 3 * MAX_TIME_NS and shortest >= 0


@pytest.mark.slow
@FUZZ
@given(trace=mutated_traces(), layout=st.sampled_from(["blocks", "lines", "inline"]))
def test_mutated_traces_import_or_fail_in_one_line(trace: dict[str, Any], layout: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        assert_sound_outcome(*run_import(trace, layout, Path(folder)))


@FUZZ
@given(trace=mutated_traces())
def test_mutated_gzip_traces_import_or_fail_in_one_line(trace: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        assert_sound_outcome(*run_import(trace, "blocks", Path(folder), "trace.json.gz"))


def expected_damage(field: str, value: Any) -> str | None:
    """What the import must make of one field of a complete event set to ``value`` (None: kept).

    Written from the rules in the README, independently of the SQL that applies them.
    """
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    limit = MAX_TIME_NS // 1000
    if field == "name":
        return None if isinstance(value, str) else "name_missing_or_not_a_string"
    if field == "args":
        return None if value is None or isinstance(value, dict) else "args_not_an_object"
    if field == "ts":
        if not number:
            return "ts_missing_or_not_a_number"
        return None if abs(value) <= limit else "ts_out_of_range"
    if not number:
        return "dur_missing_or_not_a_number"
    return "dur_negative" if value < 0 else None if value <= limit else "dur_out_of_range"


def microseconds_to_ns(value: float) -> int:
    whole = math.floor(value)
    return int(whole) * 1000 + round((value - whole) * 1000)


@settings(derandomize=True, deadline=None, max_examples=40)
@given(field=st.sampled_from(["name", "args", "ts", "dur"]), value=hostile_values,
       layout=st.sampled_from(["blocks", "lines", "inline"]))
def test_one_damaged_field_drops_its_event_and_nothing_else(field: str, value: Any, layout: str) -> None:
    trace = valid_trace()
    lone = {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 99, "ts": 70, "dur": 3}
    lone[field] = value
    trace["traceEvents"].append(lone)
    with tempfile.TemporaryDirectory() as folder:
        status, _, err, run_dir = run_import(trace, layout, Path(folder))
        assert status == 0, err
        run = dlprof.load(run_dir)
        damage = expected_damage(field, value)
        assert run.manifest.dropped == ({damage: 1} if damage else {})
        slices = run.slices
    complete = sum(1 for event in trace["traceEvents"] if event["ph"] == "X")
    assert len(slices) == complete - (damage is not None), "only the damaged event is dropped"
    if damage is None:
        kept = slices.loc[slices["id"].idxmax()]  # ids follow file order: the event added last
        assert kept.start_ns == BASE_NS + microseconds_to_ns(lone["ts"])
        assert kept.dur_ns == microseconds_to_ns(lone["dur"])


def xspace_bytes(times: dict[str, int], stats: dict[str, int | float | str]) -> bytes:
    """A small XSpace as TensorFlow's profiler lays one out: an op and an allocation on a host
    thread, a kernel on a GPU stream, with the given times and stat values."""
    from dlprof.importers.xplane import XPlaneError, xplane_module

    try:
        space = xplane_module().XSpace()
    except XPlaneError as error:
        pytest.skip(str(error))
    task = space.planes.add(name="Task Environment")
    task.stat_metadata[1].id, task.stat_metadata[1].name = 1, "profile_start_time"
    task.stats.add(metadata_id=1, uint64_value=times["profile_start_time"])
    host = space.planes.add(name="/host:CPU")
    for metadata_id, name in ((1, "dense/MatMul:MatMul"), (2, "MemoryAllocation")):
        host.event_metadata[metadata_id].id, host.event_metadata[metadata_id].name = metadata_id, name
    for stat_id, name in enumerate(stats, 1):
        host.stat_metadata[stat_id].id, host.stat_metadata[stat_id].name = stat_id, name
    line = host.lines.add(id=5, name="tf_Compute", timestamp_ns=times["timestamp_ns"])
    line.events.add(metadata_id=times["metadata_id"], offset_ps=times["offset_ps"], duration_ps=times["duration_ps"])
    allocation = line.events.add(metadata_id=2, offset_ps=1000, duration_ps=0)
    for stat_id, value in enumerate(stats.values(), 1):
        if isinstance(value, str):
            allocation.stats.add(metadata_id=stat_id, str_value=value)
        elif isinstance(value, float):
            allocation.stats.add(metadata_id=stat_id, double_value=value)
        elif value >= 2**63:
            allocation.stats.add(metadata_id=stat_id, uint64_value=value)
        else:
            allocation.stats.add(metadata_id=stat_id, int64_value=value)
    gpu = space.planes.add(name="/device:GPU:0")
    gpu.event_metadata[1].id, gpu.event_metadata[1].name = 1, "volta_sgemm_128x64_nn"
    gpu.stat_metadata[1].id, gpu.stat_metadata[1].name = 1, "correlation_id"
    kernel = gpu.lines.add(id=7, name="Stream #7(Compute)", timestamp_ns=times["timestamp_ns"]).events.add(
        metadata_id=1, offset_ps=times["offset_ps"], duration_ps=times["duration_ps"])
    correlation = stats.get("correlation_id", 42)
    kernel.stats.add(metadata_id=1, uint64_value=correlation % 2**64 if isinstance(correlation, int) else 42)
    return bytes(space.SerializeToString())


@pytest.mark.tf
@pytest.mark.parametrize(("times", "reason"), [
    ({"duration_ps": -5000}, "dur_negative"),
    ({"timestamp_ns": 2**62}, "ts_out_of_range"),  # past the year 2065 from the profile's start
])
def test_an_xplane_event_out_of_range_is_dropped_and_counted(times: dict[str, int], reason: str, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    good = {"profile_start_time": BASE_NS, "timestamp_ns": 1000, "offset_ps": 2000, "duration_ps": 5000,
            "metadata_id": 1}
    path, run_dir = tmp_path / "host.xplane.pb", tmp_path / "run"
    path.write_bytes(xspace_bytes({**good, **times}, {}))
    assert main(["import", "-o", str(run_dir), str(path)]) == 0
    run = dlprof.load(run_dir)
    assert run.manifest.dropped == {reason: 2}, "the host op and the kernel"
    assert f"dropped as damaged: {reason.replace('_', ' ')}: 2" in capsys.readouterr().out
    assert len(run.slices) == 0


int64s = st.one_of(st.integers(min_value=-(2**63), max_value=2**63 - 1),
                   st.sampled_from([0, -1, 1000, 2**62, 2**63 - 1, -(2**63)]))
stat_values = st.one_of(int64s, st.integers(min_value=2**63, max_value=2**64 - 1),
                        st.floats(allow_nan=False), st.text(max_size=4))


@pytest.mark.tf
@settings(derandomize=True, deadline=None, max_examples=30)
@given(times=st.fixed_dictionaries({
           "profile_start_time": st.one_of(st.just(BASE_NS), st.integers(min_value=0, max_value=2**64 - 1)),
           "timestamp_ns": st.one_of(st.just(1000), int64s), "offset_ps": st.one_of(st.just(2000), int64s),
           "duration_ps": st.one_of(st.just(5000), int64s), "metadata_id": st.one_of(st.just(1), int64s)}),
       stats=st.dictionaries(st.sampled_from(["allocation_bytes", "bytes_allocated", "addr", "allocator_name",
                                              "correlation_id"]), stat_values, max_size=3))
def test_mutated_xplane_profiles_import_or_fail_in_one_line(times: dict[str, int],
                                                            stats: dict[str, int | float | str]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path, run_dir = Path(folder) / "host.xplane.pb", Path(folder) / "run"
        path.write_bytes(xspace_bytes(times, stats))
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            status = main(["import", "-o", str(run_dir), str(path)])
        if status == 2:
            assert stderr.getvalue().startswith("dlprof: error: ") and stderr.getvalue().count("\n") == 1
            assert not run_dir.exists()
        else:
            assert status == 0, stderr.getvalue()
            assert dlprof.load(run_dir).status is RunStatus.COMPLETE
