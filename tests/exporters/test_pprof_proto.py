"""The pprof exporter: the profile parsed back with protobuf, and read by ``go tool pprof``.

The profile is decoded with protobuf's own parser, from a descriptor of pprof's
``profile.proto`` built here field by field (github.com/google/pprof, proto/profile.proto), so
the hand-written encoder is checked against an independent reader. Its figures are then
compared with ``dlprof top``'s. ``go tool pprof`` (Debian's ``golang-go``) reads the file in the
last tests, which skip with the reason when ``go`` is not on PATH.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

import dlprof
from dlprof.analysis.aggregate import UNATTRIBUTED, launches, top
from dlprof.cli.main import main
from dlprof.exporters.pprof_proto import PprofProtoExporter, launching_ops
from dlprof.exporters.protobuf_wire import Message, varint
from dlprof.exporters.registry import exporter_for_path
from dlprof.keys import StoreTable
from dlprof.store.reader import Run
from tests.references import stack_self_ns

_F = descriptor_pb2.FieldDescriptorProto
# profile.proto: (message, [(field, number, type, repeated, message type)]).
_PROFILE_PROTO: list[tuple[str, list[tuple[str, int, int, bool, str]]]] = [
    ("Profile", [
        ("sample_type", 1, _F.TYPE_MESSAGE, True, "ValueType"),
        ("sample", 2, _F.TYPE_MESSAGE, True, "Sample"),
        ("mapping", 3, _F.TYPE_MESSAGE, True, "Mapping"),
        ("location", 4, _F.TYPE_MESSAGE, True, "Location"),
        ("function", 5, _F.TYPE_MESSAGE, True, "Function"),
        ("string_table", 6, _F.TYPE_STRING, True, ""),
        ("drop_frames", 7, _F.TYPE_INT64, False, ""),
        ("keep_frames", 8, _F.TYPE_INT64, False, ""),
        ("time_nanos", 9, _F.TYPE_INT64, False, ""),
        ("duration_nanos", 10, _F.TYPE_INT64, False, ""),
        ("period_type", 11, _F.TYPE_MESSAGE, False, "ValueType"),
        ("period", 12, _F.TYPE_INT64, False, ""),
        ("comment", 13, _F.TYPE_INT64, True, ""),
        ("default_sample_type", 14, _F.TYPE_INT64, False, ""),
    ]),
    ("ValueType", [("type", 1, _F.TYPE_INT64, False, ""), ("unit", 2, _F.TYPE_INT64, False, "")]),
    ("Sample", [
        ("location_id", 1, _F.TYPE_UINT64, True, ""),
        ("value", 2, _F.TYPE_INT64, True, ""),
        ("label", 3, _F.TYPE_MESSAGE, True, "Label"),
    ]),
    ("Label", [
        ("key", 1, _F.TYPE_INT64, False, ""), ("str", 2, _F.TYPE_INT64, False, ""),
        ("num", 3, _F.TYPE_INT64, False, ""), ("num_unit", 4, _F.TYPE_INT64, False, ""),
    ]),
    ("Mapping", [
        ("id", 1, _F.TYPE_UINT64, False, ""), ("memory_start", 2, _F.TYPE_UINT64, False, ""),
        ("memory_limit", 3, _F.TYPE_UINT64, False, ""), ("file_offset", 4, _F.TYPE_UINT64, False, ""),
        ("filename", 5, _F.TYPE_INT64, False, ""), ("build_id", 6, _F.TYPE_INT64, False, ""),
        ("has_functions", 7, _F.TYPE_BOOL, False, ""), ("has_filenames", 8, _F.TYPE_BOOL, False, ""),
        ("has_line_numbers", 9, _F.TYPE_BOOL, False, ""),
        ("has_inline_frames", 10, _F.TYPE_BOOL, False, ""),
    ]),
    ("Location", [
        ("id", 1, _F.TYPE_UINT64, False, ""), ("mapping_id", 2, _F.TYPE_UINT64, False, ""),
        ("address", 3, _F.TYPE_UINT64, False, ""), ("line", 4, _F.TYPE_MESSAGE, True, "Line"),
        ("is_folded", 5, _F.TYPE_BOOL, False, ""),
    ]),
    ("Line", [("function_id", 1, _F.TYPE_UINT64, False, ""), ("line", 2, _F.TYPE_INT64, False, "")]),
    ("Function", [
        ("id", 1, _F.TYPE_UINT64, False, ""), ("name", 2, _F.TYPE_INT64, False, ""),
        ("system_name", 3, _F.TYPE_INT64, False, ""), ("filename", 4, _F.TYPE_INT64, False, ""),
        ("start_line", 5, _F.TYPE_INT64, False, ""),
    ]),
]


def _message_classes() -> dict[str, Any]:
    file = descriptor_pb2.FileDescriptorProto(name="test_profile.proto", package="perftools.profiles",
                                              syntax="proto3")
    for name, fields in _PROFILE_PROTO:
        message = file.message_type.add(name=name)
        for field_name, number, kind, repeated, type_name in fields:
            message.field.add(name=field_name, number=number, type=kind,
                              label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL,
                              type_name=f".perftools.profiles.{type_name}" if type_name else None)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"perftools.profiles.{name}"))
            for name, _ in _PROFILE_PROTO}


PROTO = _message_classes()


@dataclass
class Sample:
    stack: list[str]  # function names, leaf first
    values: dict[str, int]  # by sample type
    labels: dict[str, str]


@dataclass
class Parsed:
    message: Any
    types: list[tuple[str, str]]
    samples: list[Sample]
    files: dict[str, str]  # function name -> its "file" (the slice kind)

    def strings(self, indices: Any) -> list[str]:
        return [self.message.string_table[i] for i in indices]


def read_back(path: Path) -> Parsed:
    """Decode a profile, checking what pprof requires of its ids and tables on the way."""
    profile = PROTO["Profile"].FromString(gzip.decompress(path.read_bytes()))
    strings = list(profile.string_table)
    assert strings[0] == "" and len(set(strings)) == len(strings)
    functions = {f.id: f for f in profile.function}
    locations = {loc.id: loc for loc in profile.location}
    assert len(functions) == len(profile.function) and 0 not in functions
    assert len(locations) == len(profile.location) and 0 not in locations
    mappings = {m.id for m in profile.mapping}
    assert all(loc.mapping_id in mappings and len(loc.line) == 1 for loc in profile.location)
    assert all(line.function_id in functions for loc in profile.location for line in loc.line)
    types = [(strings[t.type], strings[t.unit]) for t in profile.sample_type]
    names = {loc.id: strings[functions[loc.line[0].function_id].name] for loc in profile.location}
    samples = []
    for sample in profile.sample:
        assert len(sample.value) == len(types) and sample.location_id
        labels = {strings[label.key]: strings[label.str] for label in sample.label}
        samples.append(Sample([names[i] for i in sample.location_id],
                              dict(zip((t for t, _ in types), sample.value, strict=True)), labels))
    files = {strings[f.name]: strings[f.filename] for f in profile.function}
    return Parsed(profile, types, samples, files)


def export(run_dir: Path, tmp_path: Path, name: str = "p.pb.gz") -> tuple[Run, Parsed]:
    run = dlprof.load(run_dir)
    [path] = PprofProtoExporter().export(run, tmp_path / name)
    return run, read_back(path)


def flat(parsed: Parsed, sample_type: str) -> Counter[str]:
    """pprof's flat value per function: what the samples with it as their leaf add up to."""
    totals: Counter[str] = Counter()
    for sample in parsed.samples:
        totals[sample.stack[0]] += sample.values[sample_type]
    return totals


def cumulative(parsed: Parsed, sample_type: str) -> tuple[Counter[str], set[str]]:
    """pprof's cum value per function, and the functions that occur twice in one stack."""
    totals: Counter[str] = Counter()
    recursive: set[str] = set()
    for sample in parsed.samples:
        names = set(sample.stack)
        recursive |= {n for n in names if sample.stack.count(n) > 1}
        for name in names:
            totals[name] += sample.values[sample_type]
    return totals, recursive


def on_cpu(run: Run) -> pd.DataFrame:
    return run.slices[run.slices["device"] == "cpu"]


@pytest.mark.parametrize("run_name", ["cnn_run", "gpu_run", "two_rank_run"])
def test_the_profile_is_well_formed(run_name: str, tmp_path: Path,
                                    request: pytest.FixtureRequest) -> None:
    run, parsed = export(request.getfixturevalue(run_name), tmp_path)
    profile = parsed.message
    types = ["calls", "wall", "gpu"] if (run.slices["device"] != "cpu").any() else ["calls", "wall"]
    assert parsed.types == [(t, "count" if t == "calls" else "nanoseconds") for t in types]
    assert parsed.strings([profile.default_sample_type]) == ["wall"]
    assert parsed.strings([profile.period_type.type, profile.period_type.unit]) == ["wall", "nanoseconds"]
    start = int(run.slices["start_ns"].min())
    assert profile.time_nanos == start
    assert profile.duration_nanos == int((run.slices["start_ns"] + run.slices["dur_ns"]).max()) - start
    assert parsed.strings(profile.comment)[0] == f"dlprof run {run.manifest.name}"
    # Samples are merged per (stack, labels): no two alike.
    keys = [(tuple(s.stack), tuple(sorted(s.labels.items()))) for s in parsed.samples]
    assert len(keys) == len(set(keys))


def test_calls_and_wall_time_equal_dlprof_top(cnn_run: Path, tmp_path: Path) -> None:
    run, parsed = export(cnn_run, tmp_path)
    cpu = on_cpu(run)
    assert sum(s.values["calls"] for s in parsed.samples) == len(run.slices)
    assert sum(s.values["wall"] for s in parsed.samples) == cpu["self_ns"].sum() \
        == cpu.loc[cpu["depth"] == 0, "dur_ns"].sum()
    calls, wall = flat(parsed, "calls"), flat(parsed, "wall")
    cum, recursive = cumulative(parsed, "wall")
    checked = 0
    for kind in ("step", "region", "user_annotation", "module", "op"):
        table = top(run, kind=kind, limit=None)
        assert not table.empty, kind
        for row in table.itertuples():
            assert parsed.files[row.name] == kind
            assert (calls[row.name], wall[row.name]) == (row.calls, stack_self_ns(run, kind, row)), row.name
            if row.name not in recursive:
                assert cum[row.name] == row.total_ns, row.name
            checked += 1
    assert checked == run.slices["name"].nunique()


def test_stacks_follow_the_nesting_of_regions_modules_and_ops(cnn_run: Path, tmp_path: Path) -> None:
    run, parsed = export(cnn_run, tmp_path)
    slices = run.slices.set_index("id")
    expected: Counter[tuple[str, ...]] = Counter()
    for _, row in slices.iterrows():
        stack, parent = [row["name"]], row["parent_id"]
        while not pd.isna(parent):
            stack.append(slices.at[parent, "name"])
            parent = slices.at[parent, "parent_id"]
        expected[tuple(stack)] += 1
    got = Counter({tuple(s.stack): s.values["calls"] for s in parsed.samples})
    assert got == expected
    # Leaf first: op, layer, model, region, region, step.
    conv = next(s.stack for s in parsed.samples if s.stack[0] == "aten::mkldnn_convolution"
                and "0 (Conv2d) forward" in s.stack)
    assert [n for n in conv if not n.startswith("aten::")] == [
        "0 (Conv2d) forward", "Sequential (Sequential) forward", "forward", "train_step", conv[-1]]
    assert conv[-1].startswith("ProfilerStep#")


def test_gpu_time_is_its_own_sample_type_under_the_launching_op(gpu_run: Path, tmp_path: Path) -> None:
    run, parsed = export(gpu_run, tmp_path)
    slices = run.slices
    device = slices[slices["device"] != "cpu"]
    # Device time is not wall time: wall holds exactly the CPU threads' self time.
    assert sum(s.values["wall"] for s in parsed.samples) == on_cpu(run)["self_ns"].sum()
    assert sum(s.values["gpu"] for s in parsed.samples) == device["self_ns"].sum() > 0
    assert all(s.values["wall"] == 0 for s in parsed.samples if s.values["gpu"])
    calls, gpu = flat(parsed, "calls"), flat(parsed, "gpu")
    for kind in ("kernel", "memcpy", "memset"):
        for row in top(run, kind=kind, limit=None).itertuples():
            assert (calls[row.name], gpu[row.name]) == (row.calls, row.self_ns), row.name
    # Each kernel, memcpy and memset stands on the call path of the op that launched it.
    names = slices.set_index("id")["name"]
    linked = launches(run).dropna(subset=["launcher_id"])
    assert len(linked) == len(slices[slices["kind"].isin(["kernel", "memcpy", "memset"])])
    expected: Counter[tuple[str, str]] = Counter()
    for row in linked.itertuples():
        expected[(names[row.id], names[int(row.launcher_id)])] += int(slices.loc[slices["id"] == row.id, "self_ns"].iloc[0])
    got: Counter[tuple[str, str]] = Counter()
    for sample in parsed.samples:
        if sample.values["gpu"] and parsed.files[sample.stack[0]] in ("kernel", "memcpy", "memset"):
            got[(sample.stack[0], sample.stack[1])] += sample.values["gpu"]
    assert got == expected
    # Above the launching op, its own call path on the CPU thread that ran it.
    cpu_stacks = {tuple(s.stack) for s in parsed.samples if s.labels["device"] == "cpu"}
    launched = [s for s in parsed.samples if s.labels["device"] != "cpu" and parsed.files[s.stack[1]] == "op"]
    assert launched and all(tuple(s.stack[1:]) in cpu_stacks for s in launched)
    assert all(s.stack[1:] == [UNATTRIBUTED] or parsed.files[s.stack[1]] != "runtime"
               for s in parsed.samples if s.labels["device"] != "cpu")


def test_launching_ops_cover_every_device_slice_with_a_runtime_call(gpu_run: Path) -> None:
    run = dlprof.load(gpu_run)
    found = launching_ops(run.arrow(StoreTable.SLICES))
    dlprof_rule = launches(run).dropna(subset=["launcher_id"])
    assert {row.id: int(row.launcher_id) for row in dlprof_rule.itertuples()}.items() <= found.items()
    # The same rule for all work on a stream: Stream Sync under cudaStreamSynchronize's op too.
    slices = run.slices
    calls = slices[(slices["kind"] == "runtime")].dropna(subset=["correlation_id", "parent_id"])
    calls = calls.drop_duplicates(["rank", "correlation_id"])[["rank", "correlation_id", "parent_id"]]
    work = slices[slices["device"] != "cpu"].merge(calls, on=["rank", "correlation_id"], suffixes=("", "_op"))
    assert found == dict(zip(work["id"].tolist(), work["parent_id_op"].astype("int64").tolist(), strict=True))
    assert set(work["kind"]) == {"kernel", "memcpy", "memset", "cuda_sync"}


def test_ranks_threads_and_streams_are_labels(two_rank_run: Path, tmp_path: Path) -> None:
    run, parsed = export(two_rank_run, tmp_path)
    by_rank: defaultdict[str, Counter[str]] = defaultdict(Counter)
    for sample in parsed.samples:
        assert sample.labels.keys() == {"rank", "pid", "device",
                                        "thread" if sample.labels["device"] == "cpu" else "stream"}
        for sample_type, value in sample.values.items():
            by_rank[sample.labels["rank"]][sample_type] += value
    assert by_rank.keys() == {"0", "1"} and by_rank["0"] == by_rank["1"]
    rank0 = run.slices[run.slices["rank"] == 0]
    assert by_rank["0"]["wall"] == rank0.loc[rank0["device"] == "cpu", "self_ns"].sum()
    threads = {(s.labels["rank"], s.labels["pid"], s.labels.get("thread", s.labels.get("stream")))
               for s in parsed.samples}
    assert threads == {(str(r), str(p), str(t)) for r, p, t in
                       run.slices[["rank", "pid", "tid"]].drop_duplicates().itertuples(index=False)}


def test_each_metric_is_a_sample_type(cupti_run: Path, tmp_path: Path) -> None:
    run, parsed = export(cupti_run, tmp_path)
    metrics = run.metrics
    assert not metrics.empty
    names = sorted(metrics["metric"].unique())
    assert parsed.types[3:] == [(name, "count") for name in names]
    slice_names = run.slices.set_index("id")["name"]
    expected = metrics.assign(name=metrics["slice_id"].map(slice_names)).groupby(["metric", "name"])["value"].sum()
    for name in names:
        got = flat(parsed, name)
        assert {k: v for k, v in got.items() if v} == {
            n: round(v) for (m, n), v in expected.items() if m == name and round(v)}


def test_the_cli_writes_it_by_name_and_by_extension(cnn_run: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cnn.pb.gz"
    assert main(["export", str(cnn_run), "--format", "pprof-proto", "-o", str(out)]) == 0
    assert capsys.readouterr().out == f"{out}\n"
    assert exporter_for_path(Path("x.pb.gz")) is PprofProtoExporter
    assert sum(s.values["calls"] for s in read_back(out).samples) == len(dlprof.load(cnn_run).slices)


# The hand-written encoder against protobuf's own.

def test_varints_as_protobuf_writes_them() -> None:
    assert varint(0) == b"\x00" and varint(1) == b"\x01" and varint(300) == b"\xac\x02"
    assert varint(-1) == b"\xff" * 9 + b"\x01"  # an int64 of -1: ten bytes
    assert varint((1 << 64) - 1) == b"\xff" * 9 + b"\x01"
    for bad in (1 << 64, -(1 << 63) - 1):
        with pytest.raises(ValueError, match="64 bits"):
            varint(bad)


def test_messages_encode_as_protobuf_encodes_them() -> None:
    values = [0, 1, 127, 128, 1 << 40, -5, (1 << 63) - 1, -(1 << 63)]
    ours = (Message().message(1, Message().uint(1, 3).uint(2, 4))
            .message(2, Message().packed(1, [7, 1 << 33]).packed(2, values)
                     .message(3, Message().uint(1, 5).uint(2, 6)))
            .string(6, "").string(6, "aten::conv2d · ü").uint(9, 1_700_000_000_000_000_000)
            .packed(13, [1, 2]).to_bytes())
    theirs = PROTO["Profile"](
        sample_type=[PROTO["ValueType"](type=3, unit=4)],
        sample=[PROTO["Sample"](location_id=[7, 1 << 33], value=values, label=[PROTO["Label"](key=5, str=6)])],
        string_table=["", "aten::conv2d · ü"], time_nanos=1_700_000_000_000_000_000, comment=[1, 2],
    )
    assert ours == theirs.SerializeToString()
    assert Message().uint(3, 0).packed(4, []).to_bytes() == b""  # defaults are left out


# go tool pprof reading the file.

GO = shutil.which("go")
needs_go = pytest.mark.skipif(GO is None, reason="needs `go` on PATH for `go tool pprof` "
                                                 "(Debian: apt-get install golang-go)")
_ROW = re.compile(r"^\s*(\S+)\s+\S+%\s+\S+%\s+(\S+)\s+\S+%\s+(.+)$")


def go_pprof_top(path: Path, sample_type: str, home: Path, unit: str | None = "ns") -> dict[str, tuple[int, int]]:
    """``go tool pprof -top`` of every function: {name: (flat, cum)}, in the unit asked for."""
    home.mkdir(exist_ok=True)
    env = {**os.environ, "HOME": str(home), "GOPATH": str(home / "go"), "GOCACHE": str(home / "cache"),
           "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local", "GOPROXY": "off", "PPROF_TMPDIR": str(home)}
    command = [str(GO), "tool", "pprof", "-top", f"-sample_index={sample_type}", "-nodecount=1000000",
               "-nodefraction=0", "-edgefraction=0", *([f"-unit={unit}"] if unit else []), str(path)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split() == ["flat", "flat%", "sum%", "cum", "cum%"])
    rows = {}
    for line in lines[header + 1:]:
        match = _ROW.match(line)
        assert match, line
        flat_text, cum_text, name = match.groups()
        rows[name] = (_number(flat_text, unit), _number(cum_text, unit))
    assert f"Type: {sample_type}" in done.stdout
    return rows


def _number(text: str, unit: str | None) -> int:
    return int(text.removesuffix(unit) if unit and text != "0" else text)


@needs_go
def test_go_tool_pprof_totals_equal_dlprofs(cnn_run: Path, tmp_path: Path) -> None:
    run, parsed = export(cnn_run, tmp_path)
    path = tmp_path / "p.pb.gz"
    wall = go_pprof_top(path, "wall", tmp_path / "home")
    cpu = on_cpu(run)
    assert {name: row[0] for name, row in wall.items() if row[0]} == \
        {k: v for k, v in cpu.groupby("name")["self_ns"].sum().items() if v}
    ops = top(run, kind="op", limit=None)
    for row in ops.itertuples():
        assert wall[row.name] == (row.self_ns, cumulative(parsed, "wall")[0][row.name])
    modules = top(run, kind="module", limit=None)
    assert all(wall[row.name][1] == row.total_ns for row in modules.itertuples())
    calls = go_pprof_top(path, "calls", tmp_path / "home", unit=None)
    assert {name: row[0] for name, row in calls.items() if row[0]} == cpu.groupby("name").size().to_dict()


@needs_go
def test_go_tool_pprof_reads_gpu_time_and_names_as_they_are(gpu_run: Path, tmp_path: Path) -> None:
    run, _ = export(gpu_run, tmp_path)
    gpu = go_pprof_top(tmp_path / "p.pb.gz", "gpu", tmp_path / "home")
    device = run.slices[run.slices["device"] != "cpu"]
    # Names pass unshortened: pprof would cut "(Pageable -> Device)" from a name it took for C++.
    assert {name: row[0] for name, row in gpu.items() if row[0]} == \
        {k: v for k, v in device.groupby("name")["self_ns"].sum().items() if v}
    assert "Memcpy HtoD (Pageable -> Device)" in gpu
    for row in top(run, kind="kernel", limit=None).itertuples():
        assert gpu[row.name][0] == row.self_ns
