"""``dlprof import`` of real recorded traces: every figure checked against the raw JSON."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest

import dlprof
from dlprof.importers.chunked_json import ChunkedTrace, TraceFormatError
from dlprof.importers.kineto import KinetoOptions, convert_trace, read_trace
from dlprof.importers.trace_file import TraceImportError, import_traces
from dlprof.importers.trace_stream import ChromeTraceRows, open_trace
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


def test_normalising_is_counted_in_the_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (path,) = (KINETO_TRACES / "critical_path" / "simple_add").glob("*.json.gz")
    manifest = import_traces([path], tmp_path / "run")
    run = dlprof.load(tmp_path / "run")
    assert manifest.normalised.get("overlapping_on_device", 0) > 0
    assert run.manifest.normalised == manifest.normalised
    # dlprof info says, in words, what each count did to the recorded times.
    from dlprof.cli.main import main
    from dlprof.store.manifest import NESTING_CHANGES

    assert main(["info", str(tmp_path / "run")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for key, count in manifest.normalised.items():
        assert f"{count:,} {NESTING_CHANGES[key]}" in out


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


@pytest.mark.parametrize("chunk", [200_000, 1 << 22])
@pytest.mark.parametrize("path", CHROME_TRACES, ids=lambda p: p.parent.name)
def test_streamed_pieces_translate_as_the_whole_trace(path: Path, chunk: int) -> None:
    """Cut into pieces of any size, read through DuckDB's JSON reader, the rows are exactly those
    of the trace parsed whole with orjson (the ids numbered on from piece to piece)."""
    trace = read_trace(path)
    trace.pop("baseTimeNanoseconds", None)  # the import adds the base when it writes a piece
    whole = convert_trace(trace, KinetoOptions(id_base=7))
    with open_trace(path) as (stream, _):
        pieces = [tables for tables, _ in ChromeTraceRows(stream, 7, chunk_bytes=chunk)]
    for table in ("slices", "memory", "counters", "metrics"):
        streamed = pa.concat_tables([getattr(p, table) for p in pieces]).unify_dictionaries()
        expected = getattr(whole, table)
        assert streamed.to_pylist() == expected.to_pylist(), table


def _write_whitespace_bomb(path: Path, megabytes: int) -> None:
    """A small valid trace with ``megabytes`` of whitespace in every place JSON allows it between
    tokens: before the object, before the events, between events, inside one, after the array."""
    def blank(out: Any, size: int, unit: bytes) -> None:
        block = unit * ((1 << 20) // len(unit))
        for _ in range(size):
            out.write(block)

    quarter = megabytes // 4
    op = b'  {\n    "ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,\n'
    with gzip.open(path, "wb", compresslevel=9) as out:
        blank(out, quarter, b" ")
        out.write(b'{\n  "schemaVersion": 1,\n  "traceEvents": [\n')
        out.write(op + b'    "ts": 1.0, "dur": 2.0\n  },\n')
        blank(out, quarter, b"\n      ")
        out.write(op)
        blank(out, quarter, b"\n  \t  ")  # inside the event, between two of its lines
        out.write(b'\n    "ts": 4.0, "dur": 1.0\n  }\n  ]')
        blank(out, quarter, b"\n")
        out.write(b',\n  "traceName": "bomb"\n}\n')


@pytest.mark.slow
def test_a_whitespace_gzip_bomb_imports_in_bounded_memory(tmp_path: Path) -> None:
    """400 MB of whitespace in a file of a few hundred KB: imported with memory far below it."""
    bomb = tmp_path / "bomb.json.gz"
    _write_whitespace_bomb(bomb, 400)
    assert bomb.stat().st_size < 2 << 20
    # A child of its own, so that its peak resident set is the import's alone.
    script = (
        "import sys; from pathlib import Path\n"
        "from dlprof.importers.trace_file import import_traces\n"
        "import dlprof.importers.kineto_events\n"
        "def rss(key):\n"
        "    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith(key))\n"
        "before = rss('VmRSS:')\n"
        "manifest = import_traces([Path(sys.argv[1])], Path(sys.argv[2]))\n"
        "print(manifest.counts['slices'], (rss('VmHWM:') - before) >> 10)\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(bomb), str(tmp_path / "run")],
                          capture_output=True, text=True, check=False, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    slices, growth_mib = map(int, done.stdout.split())
    assert slices == 2
    assert growth_mib < 200, f"{growth_mib} MiB for 400 MB of whitespace"
