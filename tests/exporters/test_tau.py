"""The TAU exporter: profile directories read back strictly by TAU's rules, checked against the store.

TAU's ``pprof`` and ParaProf cannot be installed here (no Debian package), so :func:`read_profile`
reads a file as they do and fails where either would misread it: pprof (``utils/pprof.cpp``)
reads each line into a 64 KiB buffer, takes a name up to the next ``"``, scans numbers with
``%lG``, and walks ``profile.<node>.0.<thread>`` from thread 0 until a file is missing; ParaProf
(``TauDataSource.java``) splits a line on ``"`` (two quotes around the name, two around the
group), parses the ``<metadata>`` block with a SAX parser, reads ``profile.*`` files, else the
``MULTI_*`` directories, and takes a name holding ``=>`` for a callpath. The values are then
compared with ``dlprof pprof``'s tables and with callpaths rebuilt from the store here.
"""

from __future__ import annotations

import math
import re
import shutil
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree

import numpy as np
import pyarrow as pa
import pytest

import dlprof
from dlprof.analysis.pprof import pprof_tables
from dlprof.cli.main import main
from dlprof.exporters.base import ExportError
from dlprof.exporters.registry import exporter_for_format, exporter_for_path
from dlprof.exporters.tau import TauExporter, TauExportWarning
from dlprof.exporters.tau_format import MAX_NAME_CHARS, clean_name
from dlprof.exporters.tau_tree import APPLICATION
from dlprof.keys import StoreTable
from dlprof.store.manifest import Manifest
from dlprof.store.reader import Run
from dlprof.store.writer import RankWriter
from tests.builders import MS, Span, write_imported_run, write_span_run
from tests.conftest import KINETO_TRACES

PPROF_BUFFER = 64 * 1024  # pprof's SIZE_OF_LINE: fgets keeps the line end and a NUL in it
PROFILE = re.compile(r"profile\.(\d+)\.(\d+)\.(\d+)")
NUMBER = r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"  # what %lG and Double.parseDouble both take
FUNCTION_LINE = re.compile(rf'"([^"]+)" (\d+) (\d+) ({NUMBER}) ({NUMBER}) 0 GROUP="([^"]+)"')
EVENT_LINE = re.compile(rf'"([^"]+)" (\d+) ({NUMBER}) ({NUMBER}) ({NUMBER}) ({NUMBER})')
HEADER = "# Name Calls Subrs Excl Incl ProfileCalls # "
TAU_DIRECTORY_UNSAFE = re.compile(r'[/\\?%*:|"<> ]')  # what TAU's writer replaces in MULTI__ names


@dataclass(frozen=True)
class Function:
    calls: int
    subrs: int
    exclusive: float
    inclusive: float
    group: str


@dataclass(frozen=True)
class Event:
    count: int
    maximum: float
    minimum: float
    mean: float
    sum_squares: float


@dataclass
class TauFile:
    metric: str  # line 1, after templated_functions_MULTI_
    metadata: dict[str, str]
    functions: dict[str, Function]  # in file order
    events: dict[str, Event]

    def flat(self) -> dict[str, Function]:
        """The timers of names, without TAU's top-level timer and the callpaths."""
        return {n: f for n, f in self.functions.items() if "=>" not in n and n != APPLICATION}

    def callpaths(self) -> dict[str, Function]:
        return {n: f for n, f in self.functions.items() if "=>" in n}


def read_profile(path: Path) -> TauFile:
    """One ``profile.N.C.T`` file, read as pprof and ParaProf read it; any deviation fails."""
    raw = path.read_bytes()
    assert raw.endswith(b"\n")
    lines = raw.decode("utf-8").split("\n")[:-1]
    for line in lines:
        assert len(line.encode()) + 2 <= PPROF_BUFFER, f"{path}: a line pprof would split"
        assert not re.search(r"[\x00-\x1f\x7f]", line), f"{path}: a control character in {line[:80]!r}"
    rows = iter(lines)
    first = re.fullmatch(r"(\d+) templated_functions_MULTI_(\S+)", next(rows))
    assert first, f"{path}: line 1"
    assert len(first[0].split(" ")[1]) < 64  # pprof scans the word into a char[64]
    header = next(rows)
    assert header.startswith(HEADER) and header.endswith("</metadata>")
    assert "SumExclSqr" not in header  # ParaProf would expect one more column on every line
    root = ElementTree.fromstring(header[len(HEADER):])  # a SAX parser needs well-formed XML
    assert root.tag == "metadata"
    metadata: dict[str, str] = {}
    for attribute in root:
        assert attribute.tag == "attribute" and [c.tag for c in attribute] == ["name", "value"]
        name = attribute.findtext("name") or ""
        assert name and name not in metadata
        metadata[name] = attribute.findtext("value") or ""
    for stamp in ("Starting Timestamp", "Ending Timestamp"):  # ParaProf: Long.parseLong
        assert re.fullmatch(r"\d+", metadata.get(stamp, "0"))
    functions: dict[str, Function] = {}
    for _ in range(int(first[1])):
        line = next(rows)
        assert line.count('"') == 4, line[:200]  # ParaProf: a name and a group, nothing else quoted
        match = FUNCTION_LINE.fullmatch(line)
        assert match, line[:200]
        name = match[1]
        assert name not in functions and name == name.strip() and "  " not in name  # pprof folds runs
        assert int(match[2]) > 0  # readers skip a timer that was never called
        exclusive, inclusive = float(match[4]), float(match[5])
        assert math.isfinite(exclusive) and math.isfinite(inclusive)
        functions[name] = Function(int(match[2]), int(match[3]), exclusive, inclusive, match[6])
    assert next(rows) == "0 aggregates"
    rest = list(rows)
    events: dict[str, Event] = {}
    if rest:  # TAU writes the section only when there are events
        count = re.fullmatch(r"(\d+) userevents", rest[0])
        assert count and int(count[1]) == len(rest) - 2 > 0
        assert rest[1] == "# eventname numevents max min mean sumsqr"
        for line in rest[2:]:
            assert line.count('"') == 2, line[:200]
            match = EVENT_LINE.fullmatch(line)
            assert match and match[1] not in events and int(match[2]) > 0, line[:200]
            events[match[1]] = Event(int(match[2]), *(float(match[i]) for i in range(3, 7)))
    return TauFile(first[2], metadata, functions, events)


def read_directory(path: Path) -> dict[str, dict[tuple[int, int], TauFile]]:
    """A profile directory as ParaProf finds it: files, else one ``MULTI_`` directory per metric.

    Returns:
        Per metric directory ("" for files in ``path`` itself), the files by (node, thread).
    """
    entries = list(path.iterdir())
    files = [p for p in entries if PROFILE.fullmatch(p.name)]
    multi = [p for p in entries if p.name.startswith("MULTI_") and p.is_dir()]
    assert sorted(files + multi) == sorted(entries), "something else in the directory"
    assert not (files and multi), "ParaProf would ignore the MULTI_ directories"
    directories = {"": path} if files else {p.name: p for p in multi}
    result: dict[str, dict[tuple[int, int], TauFile]] = {}
    for name, directory in directories.items():
        profiles: dict[tuple[int, int], TauFile] = {}
        for file in directory.iterdir():
            match = PROFILE.fullmatch(file.name)
            assert match and match[2] == "0", file
            profiles[(int(match[1]), int(match[3]))] = read_profile(file)
        # pprof walks nodes and threads from 0 and stops at the first missing file.
        nodes = sorted({node for node, _ in profiles})
        assert nodes == list(range(len(nodes)))
        for node in nodes:
            threads = sorted(t for n, t in profiles if n == node)
            assert threads == list(range(len(threads)))
        result[name] = profiles
    return result


def export(run_dir: Path, out: Path) -> dict[str, dict[tuple[int, int], TauFile]]:
    written = TauExporter().export(dlprof.load(run_dir), out)
    assert sorted(written) == sorted(p for p in out.rglob("*") if p.is_file())
    return read_directory(out)


TrackKey = tuple[int, int, int, str]  # rank, pid, tid, device


def track_of(profile: TauFile) -> TrackKey:
    meta = profile.metadata
    return int(meta["dlprof Rank"]), int(meta["Process ID"]), int(meta["Thread ID"]), meta["Device"]


def callpath_name(name: str, kind: str) -> str:
    """A slice's component of a callpath: a step without its number, as ``ProfilerStep``."""
    return re.sub(r"\s*#\s*\d+\s*$", "", name) if kind == "step" else name


def store_callpaths(run: Run) -> dict[TrackKey, dict[str, tuple[int, int, int, int]]]:
    """Every nested slice's callpath, rebuilt from parent ids: calls, child calls, self, duration."""
    s = run.slices
    ranks = s["rank"].astype("int64").tolist()
    row_of = {(r, i): n for n, (r, i) in enumerate(zip(ranks, s["id"].astype("int64"), strict=True))}
    parent_ids = s["parent_id"].astype("Int64").fillna(-1).astype("int64").tolist()
    parents = [row_of.get((r, p), -1) for r, p in zip(ranks, parent_ids, strict=True)]
    names = [callpath_name(clean_name(n), k) for n, k in zip(s["name"].fillna(""), s["kind"].astype(str), strict=True)]
    keys = list(zip(ranks, s["pid"].astype("int64").tolist(), s["tid"].astype("int64").tolist(),
                    s["device"].fillna("cpu").astype(str).tolist(), strict=True))
    self_ns, dur_ns = s["self_ns"].astype("int64").tolist(), s["dur_ns"].astype("int64").tolist()
    children = Counter(p for p in parents if p >= 0)
    paths = [""] * len(s)
    result: dict[TrackKey, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0, 0, 0]))
    for row in np.argsort(s["depth"].to_numpy(), kind="stable").tolist():  # parents first
        above = parents[row]
        # Every callpath starts at TAU's top-level timer, which holds the thread's outermost slices.
        paths[row] = f"{APPLICATION} => {names[row]}" if above < 0 else f"{paths[above]} => {names[row]}"
        entry = result[keys[row]][paths[row]]
        entry[0] += 1
        entry[1] += children[row]
        entry[2] += self_ns[row]
        entry[3] += dur_ns[row]
    return {k: {p: (a, b, c, d) for p, (a, b, c, d) in v.items()} for k, v in result.items()}


def check_against_store(run: Run, profiles: dict[tuple[int, int], TauFile]) -> None:
    """Flat timers as ``dlprof pprof`` counts them; callpaths as the store nests the slices."""
    by_track = {track_of(p): (node, thread, p) for (node, thread), p in profiles.items()}
    tables = pprof_tables(run)
    assert len(tables) == len(by_track)
    callpaths = store_callpaths(run)
    ranks = sorted({t.rank for t in tables})
    slices = run.slices
    for table in tables:
        node, thread, profile = by_track[(table.rank, table.pid, table.tid, table.device or "cpu")]
        # Nodes count the ranks from 0; threads are numbered as dlprof pprof numbers them.
        assert (node, thread) == (ranks.index(table.rank), table.thread)
        assert profile.metadata["dlprof Node Ranks"] == " ".join(f"{n}:{r}" for n, r in enumerate(ranks))
        # TAU's top-level timer holds the thread's whole time: readers' percentages are of it.
        application = profile.functions[APPLICATION]
        roots = slices[(slices["rank"] == table.rank) & (slices["pid"] == table.pid) & (slices["tid"] == table.tid)
                       & (slices["device"].fillna("cpu") == (table.device or "cpu")) & slices["parent_id"].isna()]
        assert application.inclusive == table.wall_ns / 1000
        assert application.exclusive == pytest.approx((table.wall_ns - roots["dur_ns"].sum()) / 1000)
        assert (application.calls, application.subrs, application.group) == (1, len(roots), "TAU_DEFAULT")
        assert max(f.inclusive for f in profile.functions.values()) == application.inclusive
        flat = profile.flat()
        expected = {clean_name(r.name): r for r in table.functions.itertuples()}
        assert set(flat) == set(expected)
        for name, row in expected.items():
            got = flat[name]
            assert (got.calls, got.subrs) == (row.calls, row.subrs), name
            assert got.exclusive == row.exclusive_ns / 1000 and got.inclusive == row.inclusive_ns / 1000
        rebuilt = callpaths.get((table.rank, table.pid, table.tid, table.device or "cpu"), {})
        paths = profile.callpaths()
        assert set(paths) == set(rebuilt)
        for text, (calls, subrs, self_ns, dur_ns) in rebuilt.items():
            got = paths[text]
            assert (got.calls, got.subrs) == (calls, subrs), text
            assert got.exclusive == self_ns / 1000 and got.inclusive == dur_ns / 1000
            leaf = text.rsplit(" => ", 1)[1]
            # A step's callpath leaf names all steps: its group is one of theirs.
            groups = {flat[leaf].group} if leaf in flat else {f.group for n, f in flat.items()
                                                               if callpath_name(n, "step") == leaf}
            assert got.group.removeprefix("TAU_CALLPATH|") in groups, text


def test_cnn_run_profile_counts_as_pprof_and_the_store(cnn_run: Path, tmp_path: Path) -> None:
    run = dlprof.load(cnn_run)
    directories = export(cnn_run, tmp_path / "cnn.tau")
    assert list(directories) == [""]  # TIME alone: no MULTI__ directories
    profiles = directories[""]
    check_against_store(run, profiles)
    main_thread = profiles[(0, 0)]
    assert main_thread.metric == "TIME"
    meta = main_thread.metadata
    manifest = run.manifest
    assert meta["Metric Name"] == "TIME"
    assert meta["Starting Timestamp"] == str(manifest.start_ns // 1000)
    assert meta["Ending Timestamp"] == str(manifest.end_ns // 1000)
    assert meta["Hostname"] == manifest.host.hostname
    assert meta["Executable"] == manifest.command[0]
    groups = {f.group for f in main_thread.flat().values()}
    assert {"STEP", "TAU_USER", "MODULE", "OP"} <= groups


def test_memory_and_counters_are_user_events(cnn_run: Path, tmp_path: Path) -> None:
    run = dlprof.load(cnn_run)
    events = export(cnn_run, tmp_path / "cnn.tau")[""][(0, 0)].events
    memory = run.memory
    allocated = memory[memory["bytes"] > 0]["bytes"].astype(float)
    event = events["Allocation size (bytes) [cpu]"]
    assert event.count == len(allocated)
    assert (event.maximum, event.minimum) == (allocated.max(), allocated.min())
    assert event.mean == pytest.approx(allocated.mean())
    assert event.sum_squares == pytest.approx((allocated**2).sum())
    # The context variants split the same samples by the callpath of the op that allocated.
    in_context = [e for n, e in events.items() if n.startswith("Allocation size (bytes) [cpu] : ")]
    owned = memory[(memory["bytes"] > 0) & memory["slice_id"].notna()]
    assert sum(e.count for e in in_context) == len(owned) > 0
    freed = events["Free size (bytes) [cpu]"]
    assert freed.count == int((memory["bytes"] < 0).sum()) and freed.minimum > 0
    counters = run.counters
    assert len(counters) > 0
    for (track, unit), values in counters.groupby(["track", "unit"])["value"]:
        sample = events[f"{track} ({unit})"]  # sampled gauges: on thread 0, with no context
        assert (sample.count, sample.maximum, sample.minimum) == (len(values), values.max(), values.min())
        assert sample.mean == pytest.approx(values.mean())


TRACES = sorted(p for p in KINETO_TRACES.rglob("*.json.gz"))


@pytest.mark.parametrize("trace", TRACES, ids=[p.parent.name for p in TRACES])
def test_every_recorded_trace_reads_back(trace: Path, tmp_path: Path) -> None:
    run_dir = write_imported_run(tmp_path / "run", trace, (0,))
    [profiles] = export(run_dir, tmp_path / "trace.tau").values()
    check_against_store(dlprof.load(run_dir), profiles)
    on_gpu = [profiles[(0, t)].metadata["Device"] != "cpu" for t in range(len(profiles))]
    assert on_gpu == sorted(on_gpu), "a GPU stream numbered before a CPU thread"
    for profile in profiles.values():
        meta = profile.metadata
        if meta["Device"] == "cpu":
            continue
        # A virtual thread, named as TAU names a CUDA stream.
        kind, _, index = meta["Device"].partition(":")
        prefix = "CUDA" if kind == "cuda" else "GPU"
        assert meta[f"{prefix} Device"] == index and meta[f"{prefix} Stream"] == meta["Thread ID"]
        assert meta[f"{prefix} Context"] == meta["Process ID"]


def test_gpu_work_lands_in_tau_gpu_groups(gpu_run: Path, tmp_path: Path) -> None:
    run = dlprof.load(gpu_run)
    profiles = export(gpu_run, tmp_path / "gpu.tau")[""]
    slices = run.slices
    for kind, group in (("kernel", "TAU_GPU_KERNEL"), ("memcpy", "TAU_GPU_MEMORY_COPY"),
                        ("memset", "TAU_GPU_MEMORY_SET"), ("runtime", "TAU_GPU_API")):
        names = {clean_name(n) for n in slices[slices["kind"] == kind]["name"]}
        assert names
        seen = {n: f.group for p in profiles.values() for n, f in p.flat().items() if n in names}
        assert set(seen) == names and set(seen.values()) == {group}


def test_two_ranks_are_two_nodes(two_rank_run: Path, tmp_path: Path) -> None:
    profiles = export(two_rank_run, tmp_path / "ranks.tau")[""]
    assert {node for node, _ in profiles} == {0, 1}
    for thread in range(len([k for k in profiles if k[0] == 0])):
        assert profiles[(0, thread)].functions == profiles[(1, thread)].functions


def test_metrics_are_multi_directories(cupti_run: Path, tmp_path: Path) -> None:
    run = dlprof.load(cupti_run)
    directories = export(cupti_run, tmp_path / "cupti.tau")
    metrics = sorted(run.metrics["metric"].unique())
    assert len(metrics) == 9
    expected = {"MULTI__TIME": "TIME"} | {"MULTI__" + TAU_DIRECTORY_UNSAFE.sub("_", m): m for m in metrics}
    assert set(directories) == set(expected)
    reference = directories["MULTI__TIME"]
    check_against_store(run, reference)
    slices = run.slices.set_index("id")
    for directory, metric in expected.items():
        profiles = directories[directory]
        assert set(profiles) == set(reference)  # the same threads under every metric
        for key, profile in profiles.items():
            assert profile.metadata["Metric Name"] == metric
            # Line 1 names it as far as pprof's buffer lets it; ParaProf reads "Metric Name".
            assert TAU_DIRECTORY_UNSAFE.sub("_", metric).startswith(profile.metric[:28])
            same = reference[key]
            assert [(n, f.calls, f.subrs, f.group) for n, f in profile.functions.items()] == [
                (n, f.calls, f.subrs, f.group) for n, f in same.functions.items()]
            assert profile.events == same.events  # ParaProf reads events from one metric only
        if metric == "TIME":
            continue
        values = run.metrics[run.metrics["metric"] == metric]
        per_name = values.assign(name=slices.loc[values["slice_id"], "name"].to_numpy()).groupby("name")["value"]
        gpu = next(p for p in profiles.values() if p.metadata["Device"] != "cpu")
        for name, total in per_name.sum().items():
            timer = gpu.flat()[clean_name(name)]
            # Kernel ranges do not nest: each one's value is both its inclusive and exclusive value.
            assert timer.inclusive == pytest.approx(total) and timer.exclusive == pytest.approx(total)
        event = gpu.events[metric]
        assert event.count == len(values)
        assert event.mean * event.count == pytest.approx(values["value"].sum())
        for profile in profiles.values():
            if profile.metadata["Device"] == "cpu":
                assert all(f.inclusive == f.exclusive == 0 for f in profile.functions.values())


def add_metrics(run_dir: Path, rows: dict[str, list[object]]) -> None:
    writer = RankWriter(run_dir, 0)
    writer.write_chunk(StoreTable.METRICS, pa.table(rows), "test")
    writer.compact()


def test_metric_exclusive_is_value_less_children(cnn_run: Path, tmp_path: Path) -> None:
    """A counter that counts nanoseconds, as perf's task-clock does, must read back as TIME does."""
    run_dir = Path(shutil.copytree(cnn_run, tmp_path / "run"))
    slices = dlprof.load(run_dir).slices
    ids = slices["id"].astype("int64").tolist()
    add_metrics(run_dir, {
        "slice_id": pa.array([*ids, ids[0], ids[1], ids[2], ids[3]], pa.int64()),
        "metric": [*["perf:task-clock"] * len(ids), "perf:task-clock", "bad", "bad", "bad"],
        "value": pa.array([*slices["dur_ns"].astype(float).tolist(), math.nan, math.inf, -math.inf, -1.0]),
    })
    with pytest.warns(TauExportWarning, match="3 NaN or infinite metric values, 1 negative metric values"):
        directories = export(run_dir, tmp_path / "clock.tau")
    assert set(directories) == {"MULTI__TIME", "MULTI__perf_task-clock"}  # nothing usable in "bad"
    for key, profile in directories["MULTI__perf_task-clock"].items():
        time = directories["MULTI__TIME"][key].functions
        # The top-level timer counts what the slices measured; its time is the thread's too.
        application = profile.functions.pop(APPLICATION)
        outermost = sum(f.inclusive for n, f in time.items() if n.count(" => ") == 1)
        assert application.inclusive == pytest.approx(outermost * 1000) and application.exclusive == 0
        for name, timer in profile.functions.items():
            assert timer.inclusive == pytest.approx(time[name].inclusive * 1000)
            assert timer.exclusive == pytest.approx(time[name].exclusive * 1000, abs=1e-6)


def test_ops_share_the_value_of_the_layer_measured_around_them(tmp_path: Path) -> None:
    """Counters measured per layer and step, not per op: an op gets its share of what its layer
    measured, by time, and the layer's exclusive value is its own share, as its time is."""
    run_dir = write_span_run(tmp_path / "layers", [
        Span("step", 0, 200, kind="step"),
        Span("conv", 0, 100, kind="module"),
        Span("aten::conv2d", 10, 20),
        Span("aten::relu", 50, 40),
        Span("fc", 120, 60, kind="module"),  # measured, nested in the step like conv
        Span("aten::linear", 130, 30),
    ])
    ids = dlprof.load(run_dir).slices.set_index("name")["id"].astype("int64")
    add_metrics(run_dir, {"slice_id": pa.array([ids["step"], ids["conv"], ids["fc"]], pa.int64()),
                          "metric": ["perf:instructions"] * 3, "value": [5000.0, 1000.0, 1200.0]})
    profile = export(run_dir, tmp_path / "layers.tau")["MULTI__perf_instructions"][(0, 0)]
    flat = profile.flat()
    # conv: 1000 over 100 ms, its ops 20 and 40 ms of it; fc: 1200 over 60 ms, its op 30 ms.
    assert flat["aten::conv2d"].inclusive == pytest.approx(200.0)
    assert flat["aten::relu"].inclusive == pytest.approx(400.0)
    assert flat["conv"].exclusive == pytest.approx(400.0)  # 40 of its 100 ms are its own
    assert flat["aten::linear"].inclusive == pytest.approx(600.0)
    assert flat["fc"].exclusive == pytest.approx(600.0)
    # The step's own: what conv and fc leave (2800) over the 40 ms outside them.
    assert flat["step"].exclusive == pytest.approx(5000.0 - 1000.0 - 1200.0)
    for name, timer in flat.items():
        children = sum(f.inclusive for path, f in profile.callpaths().items()
                       if path.rsplit(" => ", 2)[-2:-1] == [name])
        assert timer.exclusive == pytest.approx(timer.inclusive - children), name


def test_ranks_are_numbered_nodes_from_zero(tmp_path: Path) -> None:
    # The traces of ranks 2 and 3 imported into one run: TAU's pprof reads node 0 first.
    run_dir = write_span_run(tmp_path / "ranks", [Span("a", 0, 10, rank=3), Span("b", 0, 20, rank=2),
                                             Span("c", 5, 5, rank=2, tid=2)])
    profiles = export(run_dir, tmp_path / "ranks.tau")[""]
    assert sorted(profiles) == [(0, 0), (0, 1), (1, 0)]
    assert {key: p.metadata["dlprof Rank"] for key, p in profiles.items()} == {(0, 0): "2", (0, 1): "2", (1, 0): "3"}
    assert {p.metadata["dlprof Node Ranks"] for p in profiles.values()} == {"0:2 1:3"}
    check_against_store(dlprof.load(run_dir), profiles)


def test_steps_add_up_in_callpaths(cnn_run: Path, tmp_path: Path) -> None:
    run = dlprof.load(cnn_run)
    profiles = export(cnn_run, tmp_path / "cnn.tau")[""]
    main_thread = profiles[(0, 0)]
    steps = run.slices[run.slices["kind"] == "step"]
    assert len(steps) > 1
    # Each step keeps its flat timer; callpaths name them all ProfilerStep, one node of the graph.
    assert {clean_name(n) for n in steps["name"]} <= set(main_thread.flat())
    paths = main_thread.callpaths()
    assert not [p for p in paths if "ProfilerStep#" in p]
    all_steps = paths[f"{APPLICATION} => ProfilerStep"]
    assert all_steps.calls == len(steps) and all_steps.inclusive == steps["dur_ns"].sum() / 1000


def test_names_no_reader_can_break(tmp_path: Path) -> None:
    long_a, long_b = "k" * 5000 + "a", "k" * 5000 + "b"
    run_dir = write_span_run(tmp_path / "run", [
        Span('say "hi"', 0, 100),
        Span("tab\there", 10, 50),
        Span("new\nline\rand\x07bell", 20, 10),
        Span("a => b", 60, 10),
        Span("", 61, 5),
        Span(long_a, 80, 5),
        Span(long_b, 90, 5),
        Span("ünïcödé ✓", 110, 5),
    ])
    manifest = Manifest.read(run_dir)
    manifest.command = ["python", 'x<y> & "z"\n\x01', "--tab\t", "SumExclSqr"]
    manifest.write(run_dir)
    [profiles] = export(run_dir, tmp_path / "names.tau").values()
    profile = profiles[(0, 0)]
    flat = profile.flat()
    assert {"say 'hi'", "tab here", "new line and bell", "a = > b", "(unnamed)", "ünïcödé ✓"} <= set(flat)
    truncated = [n for n in flat if "...[truncated " in n]
    assert len(truncated) == 2 and all(len(n) == MAX_NAME_CHARS for n in truncated)
    assert f"{APPLICATION} => say 'hi' => tab here => new line and bell" in profile.callpaths()
    assert profile.metadata["Command Line"].startswith("python 'x<y> & \"z\"")
    assert f"{APPLICATION} => say 'hi' => a = > b => (unnamed)" in profile.callpaths()
    # TAU's top-level timer, every name, and every slice's callpath from it.
    assert len(profile.functions) == 1 + 8 + 8


def test_overlong_callpaths_keep_their_innermost_names(tmp_path: Path) -> None:
    spans = [Span(f"{depth:02d}" + "n" * 1990, depth, 100 - 2 * depth) for depth in range(40)]
    run_dir = write_span_run(tmp_path / "deep", spans)
    [profiles] = export(run_dir, tmp_path / "deep.tau").values()  # the reader checks line lengths
    deepest = max(profiles[(0, 0)].callpaths(), key=lambda p: p.rsplit(" => ", 1)[1])
    assert deepest.endswith(spans[-1].name) and not deepest.startswith(spans[0].name)


def test_recursion_counts_the_outermost_activation(tmp_path: Path) -> None:
    run_dir = write_span_run(tmp_path / "recursive", [Span("f", 0, 100), Span("f", 10, 50), Span("f", 20, 10)])
    [profiles] = export(run_dir, tmp_path / "f.tau").values()
    us = MS / 1000
    app = APPLICATION
    assert profiles[(0, 0)].functions == {  # the inner activations lie within the outermost
        app: Function(1, 1, 0.0, 100 * us, "TAU_DEFAULT"),
        "f": Function(3, 2, 100 * us, 100 * us, "OP"),
        f"{app} => f": Function(1, 1, 50 * us, 100 * us, "TAU_CALLPATH|OP"),
        f"{app} => f => f": Function(1, 1, 40 * us, 50 * us, "TAU_CALLPATH|OP"),
        f"{app} => f => f => f": Function(1, 0, 10 * us, 10 * us, "TAU_CALLPATH|OP"),
    }


def test_replaces_an_earlier_export_but_nothing_else(cupti_run: Path, gpu_run: Path,
                                                      tmp_path: Path) -> None:
    out = tmp_path / "same.tau"
    export(cupti_run, out)
    assert set(export(gpu_run, out)) == {""}  # the MULTI__ directories are gone
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ExportError, match=r"notes\.txt"):
        TauExporter().export(dlprof.load(gpu_run), out)
    assert (out / "notes.txt").read_text() == "mine"
    (out / "notes.txt").unlink()
    (out / "MULTI__mine").mkdir()
    (out / "MULTI__mine" / "data.csv").write_text("mine too")
    with pytest.raises(ExportError, match=r"data\.csv"):
        TauExporter().export(dlprof.load(gpu_run), out)
    (tmp_path / "file.tau").write_text("a file")
    with pytest.raises(ExportError, match="a file is in the way"):
        TauExporter().export(dlprof.load(gpu_run), tmp_path / "file.tau")
    assert not list(tmp_path.glob("*.partial")) and not list(tmp_path.glob("*.old"))


def test_an_earlier_export_is_moved_aside_under_a_name_of_its_own(cupti_run: Path, gpu_run: Path,
                                                                   tmp_path: Path) -> None:
    out = tmp_path / "prof.tau"
    (tmp_path / "prof.tau.old").mkdir()
    (tmp_path / "prof.tau.old" / "keep.txt").write_text("the user's")
    export(cupti_run, out)
    export(gpu_run, out)
    assert (tmp_path / "prof.tau.old" / "keep.txt").read_text() == "the user's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prof.tau", "prof.tau.old"]


def test_command_line_and_registry(cnn_run: Path, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert exporter_for_format("tau") is TauExporter
    assert exporter_for_path(Path("x.tau")) is TauExporter
    out = tmp_path / "cli"
    assert main(["export", str(cnn_run), "--format", "tau", "-o", str(out)]) == 0
    assert capsys.readouterr().out == f"{out / 'profile.0.0.0'}\n"
    read_directory(out)
