"""The speedscope exporter: files valid against speedscope's published schema, replayed as speedscope does.

The schema is speedscope's own ``file-format-schema.json`` (npm package ``speedscope`` 1.25.0,
``dist/release/``), kept in tests/data/speedscope with its MIT licence. Beyond the schema, each
evented profile is replayed with the rules of speedscope's importer (``CallTreeProfileBuilder``):
events in time order, every ``C`` closing the frame on top of the stack, nothing left open; the
times and counts the replay finds are then compared with ``dlprof top``'s.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import dlprof
from dlprof.analysis.aggregate import top
from dlprof.cli.main import main
from dlprof.exporters.registry import exporter_for_path
from dlprof.exporters.speedscope import SCHEMA_URL, SpeedscopeExporter
from dlprof.store.reader import Run
from tests.references import stack_self_ns

jsonschema = pytest.importorskip("jsonschema", reason="needs jsonschema (the `test` extra)")

SCHEMA = Path(__file__).resolve().parents[1] / "data" / "speedscope" / "file-format-schema.json"
RUNS = ["cnn_run", "gpu_run", "two_rank_run"]


@dataclass
class Replay:
    """What speedscope's importer makes of one file."""

    file: dict[str, Any]
    total: Counter[str] = field(default_factory=Counter)  # per frame name: time open
    own: Counter[str] = field(default_factory=Counter)  # per frame name: time open, children not
    calls: Counter[str] = field(default_factory=Counter)
    profiles: dict[str, Counter[str]] = field(default_factory=dict)  # name -> time per frame


def replay(path: Path) -> Replay:
    """Validate a file against the schema and replay its events as speedscope's importer does."""
    file = json.loads(path.read_bytes())
    jsonschema.Draft7Validator(json.loads(SCHEMA.read_text())).validate(file)
    frames = [frame["name"] for frame in file["shared"]["frames"]]
    result = Replay(file)
    for profile in file["profiles"]:
        assert profile["type"] == "evented" and profile["unit"] == "nanoseconds"
        assert profile["name"] not in result.profiles
        per_frame = result.profiles[profile["name"]] = Counter()
        stack: list[tuple[int, int, int]] = []  # (frame, opened at, time in children)
        last = profile["startValue"]
        for event in profile["events"]:
            at = event["at"]
            assert isinstance(at, int) and at >= last, "speedscope: events must come in time order"
            last = at
            if event["type"] == "O":
                stack.append((event["frame"], at, 0))
                continue
            assert stack, "speedscope: leaving a frame when the stack is empty"
            frame, opened, children = stack.pop()
            assert frame == event["frame"], "speedscope: leaving a frame that is not on top"
            name = frames[frame]
            result.total[name] += at - opened
            result.own[name] += at - opened - children
            result.calls[name] += 1
            per_frame[name] += at - opened
            if stack:
                parent = stack[-1]
                stack[-1] = (parent[0], parent[1], parent[2] + at - opened)
        assert not stack, "frames left open at the end of a profile"
        assert last <= profile["endValue"]
    return result


def export(run_dir: Path, tmp_path: Path) -> tuple[Run, Replay]:
    run = dlprof.load(run_dir)
    [path] = SpeedscopeExporter().export(run, tmp_path / "p.speedscope.json")
    return run, replay(path)


@pytest.mark.parametrize("run_name", RUNS)
def test_valid_against_speedscopes_schema_and_importer(run_name: str, tmp_path: Path,
                                                       request: pytest.FixtureRequest) -> None:
    run, replayed = export(request.getfixturevalue(run_name), tmp_path)
    file = replayed.file
    assert file["$schema"] == SCHEMA_URL and file["exporter"] == "dlprof"
    assert file["name"] == run.manifest.name
    assert sum(replayed.calls.values()) == len(run.slices)
    # One time base: every profile spans the run, which starts at 0.
    end = int((run.slices["start_ns"] + run.slices["dur_ns"]).max() - run.slices["start_ns"].min())
    assert {(p["startValue"], p["endValue"]) for p in file["profiles"]} == {(0, end)}
    assert min(p["events"][0]["at"] for p in file["profiles"]) == 0


def test_a_schema_violation_is_caught(tmp_path: Path) -> None:
    bad = tmp_path / "bad.speedscope.json"
    bad.write_text(json.dumps({"$schema": SCHEMA_URL, "shared": {"frames": [{"file": "x"}]}, "profiles": []}))
    with pytest.raises(jsonschema.ValidationError, match="'name' is a required property"):
        replay(bad)


@pytest.mark.parametrize("run_name", ["cnn_run", "gpu_run"])
def test_times_and_counts_equal_dlprof_top(run_name: str, tmp_path: Path,
                                           request: pytest.FixtureRequest) -> None:
    run, replayed = export(request.getfixturevalue(run_name), tmp_path)
    checked = 0
    for kind in sorted(set(run.slices["kind"])):
        for row in top(run, kind=kind, limit=None).itertuples():
            assert (replayed.calls[row.name], replayed.total[row.name]) == (row.calls, row.total_ns), row.name
            if (run.slices.loc[run.slices["name"] == row.name, "device"] == "cpu").all():
                # On a thread the nesting is the store's, so self time is too.
                assert replayed.own[row.name] == stack_self_ns(run, kind, row), row.name
            checked += 1
    assert checked == run.slices["name"].nunique()


def test_one_profile_per_thread_and_stream(two_rank_run: Path, tmp_path: Path) -> None:
    run, replayed = export(two_rank_run, tmp_path)
    names = set(replayed.profiles)
    tracks = run.slices[["rank", "pid", "device", "tid"]].drop_duplicates()
    for row in tracks.itertuples():
        where = f"thread {row.tid} (pid {row.pid})" if row.device == "cpu" else f"{row.device} stream {row.tid}"
        assert f"rank {row.rank}: {where}" in names
    lanes = {n for n in names if "(overlap " in n}
    assert len(names) == len(tracks) + len(lanes)
    # Each rank's profiles hold the same work (the same trace imported twice).
    for name in names:
        if name.startswith("rank 0: "):
            assert replayed.profiles[name] == replayed.profiles["rank 1: " + name.removeprefix("rank 0: ")]


def test_overlapping_work_on_a_stream_goes_beside_it(gpu_run: Path, tmp_path: Path) -> None:
    run, replayed = export(gpu_run, tmp_path)
    stream = replayed.profiles["cuda:0 stream 7"]
    beside = replayed.profiles["cuda:0 stream 7 (overlap 1)"]
    on_stream = run.slices[(run.slices["device"] == "cuda:0") & (run.slices["tid"] == 7)]
    # Every slice of the stream keeps its whole duration, on the stream or beside it.
    assert stream + beside == Counter(on_stream.groupby("name")["dur_ns"].sum().to_dict())
    assert beside and set(beside) <= set(stream)


def test_the_main_thread_is_shown_first(gpu_run: Path, tmp_path: Path) -> None:
    run, replayed = export(gpu_run, tmp_path)
    file = replayed.file
    active = file["profiles"][file["activeProfileIndex"]]
    cpu = run.slices[run.slices["device"] == "cpu"]
    tid, pid = cpu.groupby(["tid", "pid"]).size().idxmax()
    assert active["name"] == f"thread {tid} (pid {pid})"


def test_frames_are_the_distinct_names(cnn_run: Path, tmp_path: Path) -> None:
    run, replayed = export(cnn_run, tmp_path)
    frames = [frame["name"] for frame in replayed.file["shared"]["frames"]]
    assert sorted(frames) == sorted(run.slices["name"].unique())


def test_the_cli_writes_it_by_name_and_by_extension(cnn_run: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    named = tmp_path / "named.json"
    assert main(["export", str(cnn_run), "--format", "speedscope", "-o", str(named)]) == 0
    by_extension = tmp_path / "cnn.speedscope.json"
    assert main(["export", str(cnn_run), "-o", str(by_extension)]) == 0
    assert capsys.readouterr().out == f"{named}\n{by_extension}\n"
    assert replay(named).file == replay(by_extension).file
    # .json alone stays Chrome's.
    assert exporter_for_path(Path("x.speedscope.json")) is SpeedscopeExporter
    assert exporter_for_path(Path("x.json")).format_name == "chrome"
