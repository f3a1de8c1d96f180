"""``dlprof import`` of real recorded traces: every figure checked against the raw JSON."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import orjson
import pytest

import dlprof
from dlprof.importers.chunked_json import ChunkedTrace, TraceFormatError
from dlprof.importers.trace_file import TraceImportError, import_traces
from tests.conftest import KINETO_TRACES

CHROME_TRACES = sorted(KINETO_TRACES.rglob("*.json.gz"))


def raw_events(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    data = json.loads(gzip.decompress(path.read_bytes()))
    return data, data["traceEvents"]


@pytest.mark.parametrize("path", CHROME_TRACES, ids=lambda p: p.parent.name)
def test_every_recorded_trace_imports_with_its_figures(path: Path, tmp_path: Path) -> None:
    header, events = raw_events(path)
    manifest = import_traces([path], tmp_path / "run")
    run = dlprof.load(tmp_path / "run")
    slices = run.slices
    complete = [e for e in events if e.get("ph") == "X" and e.get("cat") != "Trace"]
    assert len(slices) == len(complete)
    kernels = [e for e in complete if e["cat"] == "kernel"]
    assert (slices["kind"] == "kernel").sum() == len(kernels)
    gpu_ns = sum(round(e["dur"] * 1000) for e in kernels)
    assert int(slices.loc[slices["kind"] == "kernel", "dur_ns"].sum()) == pytest.approx(gpu_ns, abs=len(kernels))
    steps = {e["name"] for e in complete if e["cat"] == "user_annotation" and e["name"].startswith("ProfilerStep#")}
    assert set(slices.loc[slices["kind"] == "step", "name"]) == steps
    launched = {e["args"]["correlation"] for e in complete if e["cat"] in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    linked = {e["args"]["correlation"] for e in kernels if "correlation" in e.get("args", {})} & launched
    kernel_rows = slices[slices["kind"] == "kernel"]
    runtime_ids = set(slices.loc[slices["kind"] == "runtime", "correlation_id"].dropna())
    assert len(set(kernel_rows["correlation_id"].dropna()) & runtime_ids) == len(linked)
    categories = {e["cat"] for e in complete}
    assert categories <= set(slices["category"]), "no category is dropped"
    assert manifest.devices == [d for d in header.get("deviceProperties", [])]
    assert run.manifest.status.value == "complete" and manifest.counts["slices"] == len(complete)


def test_normalising_is_counted_in_the_manifest(tmp_path: Path) -> None:
    (path,) = (KINETO_TRACES / "critical_path" / "simple_add").glob("*.json.gz")
    manifest = import_traces([path], tmp_path / "run")
    run = dlprof.load(tmp_path / "run")
    assert manifest.normalised.get("overlapping_on_device", 0) > 0
    assert run.manifest.normalised == manifest.normalised


def test_files_become_ranks(tmp_path: Path) -> None:
    rank0 = KINETO_TRACES / "timeline_analysis" / "sampled_rank-0.json.gz"
    rank1 = KINETO_TRACES / "trace_filter" / "sampled_rank-1.json.gz"
    import_traces([rank1, rank0], tmp_path / "run")
    run = dlprof.load(tmp_path / "run")
    per_rank = run.slices.groupby("rank").size().to_dict()
    for rank, path in enumerate([rank0, rank1]):
        _, events = raw_events(path)
        assert per_rank[rank] == sum(1 for e in events if e.get("ph") == "X" and e.get("cat") != "Trace")
    assert run.slices["id"].is_unique
    assert sorted((tmp_path / "run" / "slices").iterdir())[1].name == "rank=1"


def test_memory_timeline_imports_into_the_memory_table(tmp_path: Path) -> None:
    path = KINETO_TRACES / "memory_analysis" / "memory_timeline.raw.gz"
    rows = json.loads(gzip.decompress(path.read_bytes()))
    import_traces([path], tmp_path / "run")
    memory = dlprof.load(tmp_path / "run").memory
    assert len(memory) == len(rows)
    assert int(memory["bytes"].sum()) == sum(r[2] for r in rows)
    assert int(memory["total_allocated"].iloc[-1]) == sum(r[2] for r in rows)
    assert {"parameter", "activation", "gradient"} <= set(memory["category"])


@pytest.mark.parametrize("chunk", [500, 4096, 1 << 20])
def test_chunked_parse_equals_whole_parse(chunk: int) -> None:
    (path,) = (KINETO_TRACES / "critical_path" / "alexnet").glob("*.json.gz")
    raw = gzip.decompress(path.read_bytes())
    trace = ChunkedTrace(raw, chunk_bytes=chunk)
    events = [e for piece in trace.chunks() for e in piece]
    whole = orjson.loads(raw)
    assert events == whole.pop("traceEvents")
    assert trace.header == whole


def test_one_line_and_bare_array_traces_parse() -> None:
    events = [{"ph": "X", "name": "a", "ts": 1, "dur": 2, "pid": 1, "tid": 1, "args": {"x": [[1, 2], []]}}] * 3
    one_line = json.dumps({"traceEvents": events, "baseTimeNanoseconds": 5}).encode()
    trace = ChunkedTrace(one_line, chunk_bytes=10)
    assert [e for c in trace.chunks() for e in c] == events and trace.header == {"baseTimeNanoseconds": 5}
    bare = ChunkedTrace(json.dumps(events, indent=2).encode(), chunk_bytes=10)
    assert [e for c in bare.chunks() for e in c] == events


@pytest.mark.parametrize("content, words", [
    (b'{"traceEvents": [{"ph": "X", "name": "a"', "truncated"),
    (b'{"hello": 1}', "no traceEvents"),
    (b"not json at all", "not JSON"),
    (b'{"traceEvents": []}', "empty trace"),
])
def test_bad_files_raise_one_line(tmp_path: Path, content: bytes, words: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(TraceImportError, match=words) as raised:
        import_traces([path], tmp_path / "run")
    assert "\n" not in str(raised.value) and str(path) in str(raised.value)


def test_truncated_gzip_is_reported(tmp_path: Path) -> None:
    (path,) = (KINETO_TRACES / "critical_path" / "alexnet").glob("*.json.gz")
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(path.read_bytes()[:5000])
    with pytest.raises(TraceImportError, match="damaged or truncated gzip"):
        import_traces([cut], tmp_path / "run")


def test_format_error_is_a_value_error() -> None:
    assert issubclass(TraceFormatError, ValueError)


def test_one_field_per_line_traces_cut_between_events() -> None:
    # torch 2.x writes each field of an event on its own line, the event closed by "  },".
    events = [{"ph": "X", "name": f"op{i}", "ts": i, "dur": 1, "pid": 1, "tid": 1,
               "args": {"Input Dims": [[2, 3], []], "nested": {"a": [1]}}} for i in range(200)]
    text = json.dumps({"schemaVersion": 1, "traceEvents": events, "traceName": "x"}, indent=2).encode()
    trace = ChunkedTrace(text, chunk_bytes=300)
    pieces = list(trace.chunks())
    assert [e for piece in pieces for e in piece] == events
    assert len(pieces) > 20 and trace.header == {"schemaVersion": 1, "traceName": "x"}
