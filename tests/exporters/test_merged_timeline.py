"""One timeline for a whole job: the Perfetto trace and ``chrome --merged`` hold every rank, each
rank apart, on rank 0's clock."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

import dlprof
from dlprof.cli.main import main
from dlprof.exporters.chrome import ChromeExporter
from dlprof.exporters.chrome_rank import RANK_PID_STRIDE
from dlprof.store.manifest import RANK0_CLOCK, ClockDomain, Manifest
from tests.exporters.perfetto_trace import export as perfetto_export

SKEW_NS = 2_500_000_000  # rank 1's clock runs this far ahead of rank 0's


@pytest.fixture
def skewed_run(two_rank_run: Path, tmp_path: Path) -> Path:
    """The two-rank run, with rank 1's clock measured 2.5 s ahead of rank 0's."""
    run_dir = tmp_path / "skewed"
    shutil.copytree(two_rank_run, run_dir)
    base = Manifest.read(run_dir)
    for rank in (0, 1):
        clocks = [ClockDomain(RANK0_CLOCK, "test", offset_ns=SKEW_NS)] if rank == 1 else []
        Manifest(name=base.name, command=base.command, status=base.status, ranks=[0, 1], world_size=2,
                 clocks=clocks, counts=base.counts).write(run_dir, rank)
    return run_dir


def test_chrome_merged_holds_every_rank_apart(two_rank_run: Path, tmp_path: Path) -> None:
    run = dlprof.load(two_rank_run)
    [path] = ChromeExporter(merged=True).export(run, tmp_path / "job.json")
    trace = json.loads(path.read_bytes())
    assert "distributedInfo" not in trace, "one file of every rank states no single rank"
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(slices) == len(run.slices)
    per_rank = Counter(e["pid"] // RANK_PID_STRIDE for e in slices)
    assert per_rank == Counter(run.slices["rank"].tolist())
    labels = sorted(e["args"]["labels"] for e in trace["traceEvents"] if e["name"] == "process_labels")
    assert labels == ["rank 0 CPU", "rank 0 GPU 0", "rank 1 CPU", "rank 1 GPU 0"]
    # The ranks recorded the same correlation ids: each flow still pairs within its rank.
    starts = {e["id"]: e for e in trace["traceEvents"] if e["ph"] == "s"}
    ends = {e["id"]: e for e in trace["traceEvents"] if e["ph"] == "f"}
    assert starts and set(starts) == set(ends)
    assert len(starts) == sum(1 for e in trace["traceEvents"] if e["ph"] == "s")
    for flow, start in starts.items():
        assert start["pid"] // RANK_PID_STRIDE == ends[flow]["pid"] // RANK_PID_STRIDE


def test_merged_flag_from_the_command_line(two_rank_run: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", str(two_rank_run), "-o", str(tmp_path / "job.json"), "--merged"]) == 0
    assert capsys.readouterr().out.split() == [str(tmp_path / "job.json")]
    assert main(["export", str(two_rank_run), "-o", str(tmp_path / "job.perfetto-trace"), "--merged"]) == 2
    assert "--merged is for the chrome format" in capsys.readouterr().err


def test_perfetto_groups_each_rank_on_rank0s_clock(skewed_run: Path, tmp_path: Path) -> None:
    run, parsed = perfetto_export(skewed_run, tmp_path)

    def rank_of(track: int) -> str:
        while not parsed.tracks[track].HasField("process"):
            track = parsed.tracks[track].parent_uuid
            assert track, "every track lies inside a rank's process"
        name = parsed.tracks[track].process.process_name
        return name[name.index("(rank"):]

    by_rank = Counter(rank_of(s.track) for s in parsed.slices)
    assert by_rank == {f"(rank {r})": n for r, n in Counter(run.slices["rank"].tolist()).items()}
    devices = [t for t in parsed.tracks.values() if t.name.startswith("cuda:0")]
    assert {rank_of(t.uuid) for t in devices} == {"(rank 0)", "(rank 1)"}
    # Both ranks recorded the same trace; on rank 0's clock rank 1's copy starts 2.5 s earlier.
    first = {rank: min(s.start for s in parsed.slices if rank_of(s.track) == rank)
             for rank in ("(rank 0)", "(rank 1)")}
    assert first["(rank 0)"] - first["(rank 1)"] == SKEW_NS
    store = run.slices.groupby("rank").start_ns.min()
    assert first["(rank 0)"] == store[0] and first["(rank 1)"] == store[1]
