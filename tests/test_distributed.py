"""Many ranks, one run: real gloo jobs on the CPU through ``dlprof run --nproc`` and torchrun."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

import dlprof
from dlprof.cli.run import rank_table_state
from dlprof.collectors.rank_clock import EXCHANGE_RANGE
from dlprof.distributed import RUN_DIR_VARIABLE, RankEnvironment, shared_run_dir
from dlprof.keys import Kind, RunStatus
from dlprof.store.manifest import RANK0_CLOCK, Manifest
from tests.conftest import EXAMPLES, run_ddp_example

pytestmark = pytest.mark.torch


def _ddp_parameter_count() -> int:
    """The example's model, built here from its definition: the floats DDP all-reduces per step."""
    from torch import nn

    features = 256
    model = nn.Sequential(nn.Linear(features, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 2))
    return sum(p.numel() for p in model.parameters())


def test_every_rank_has_its_partition_and_manifest(two_rank_gloo_run: Path) -> None:
    run = dlprof.load(two_rank_gloo_run)
    assert run.status is RunStatus.COMPLETE
    assert run.manifest.ranks == [0, 1] and run.manifest.world_size == 2
    assert sorted(run.rank_manifests) == [0, 1]
    assert "--nproc" in run.manifest.command, "the job records the command typed, not each rank's"
    for rank, manifest in run.rank_manifests.items():
        assert manifest.ranks == [rank] and manifest.world_size == 2
        assert manifest.host.hostname and manifest.exit_code == 0
    for table in ("slices", "memory"):
        assert sorted(p.name for p in (two_rank_gloo_run / table).iterdir()) == ["rank=0", "rank=1"]
    # Each part file says in its footer where it came from, for readers of the files alone.
    for rank in (0, 1):
        # One part per save that held slices: an early save (while the ranks meet) may hold none.
        first = min((two_rank_gloo_run / "slices" / f"rank={rank}").glob("part-*.parquet"))
        footer = pq.read_metadata(first)
        assert footer.metadata[b"dlprof.rank"] == str(rank).encode()
        assert footer.metadata[b"dlprof.world_size"] == b"2" and footer.metadata[b"dlprof.host"]
    # Each rank wrote only its own files: one part per partition, no chunk left behind.
    assert not list(two_rank_gloo_run.glob("*/rank=*/chunk-*"))
    slices = run.slices
    pids = slices.groupby("rank").pid.unique()
    assert set(pids[0]).isdisjoint(pids[1]), "each rank is its own process"
    assert (slices[slices.kind == Kind.STEP].groupby("rank").size() >= 6).all()


def test_collectives_are_comm_slices_with_their_sizes(two_rank_gloo_run: Path) -> None:
    slices = dlprof.load(two_rank_gloo_run).slices
    comm = slices[slices.kind == Kind.COMM]
    assert set(comm["rank"]) == {0, 1}
    assert {"c10d::allreduce_", "gloo:all_reduce", "gloo:broadcast"} <= set(comm.name)
    # DDP all-reduces every gradient once per step: float32 parameters x steps, on each rank.
    steps = 6
    reduced = comm[comm.name == "gloo:all_reduce"].groupby("rank").bytes.sum()
    assert list(reduced) == [steps * 4 * _ddp_parameter_count()] * 2


def test_duckdb_and_pyarrow_read_the_ranks_without_dlprof(two_rank_gloo_run: Path) -> None:
    duckdb = pytest.importorskip("duckdb", reason="duckdb is part of dlprof's test extra")
    expected = dlprof.load(two_rank_gloo_run).slices.groupby("rank").size().to_dict()
    pattern = str(two_rank_gloo_run / "slices" / "*" / "*.parquet")
    rows = duckdb.sql(
        f"SELECT rank, count(*) FROM read_parquet('{pattern}', hive_partitioning=true) GROUP BY rank"
    ).fetchall()
    assert {int(rank): count for rank, count in rows} == expected
    comm = duckdb.sql(
        f"SELECT rank, sum(bytes) FROM read_parquet('{pattern}', hive_partitioning=true) "
        "WHERE kind = 'comm' AND name = 'gloo:all_reduce' GROUP BY rank ORDER BY rank"
    ).fetchall()
    assert [row[1] for row in comm] == [6 * 4 * _ddp_parameter_count()] * 2
    table = ds.dataset(two_rank_gloo_run / "slices", partitioning="hive").to_table(columns=["rank", "kind"])
    assert table.num_rows == sum(expected.values())


@pytest.mark.slow  # two ranks launched, not the shared job
def test_a_rank_that_dies_fails_the_run_and_keeps_the_others(tmp_path: Path) -> None:
    script = tmp_path / "flaky.py"
    script.write_text(
        "import os, runpy, sys, torch\n"
        "if os.environ['RANK'] == '1':\n"
        "    real, calls = torch.optim.SGD.step, [0]\n"
        "    def step(self, *a, **k):\n"
        "        calls[0] += 1\n"
        "        if calls[0] == 4:\n"
        "            raise RuntimeError('rank 1 gives up')\n"
        "        return real(self, *a, **k)\n"
        "    torch.optim.SGD.step = step\n"
        f"sys.argv = ['ddp_train.py', '--steps', '12']\n"
        f"runpy.run_path({str(EXAMPLES / 'ddp_train.py')!r}, run_name='__main__')\n"
    )
    out = tmp_path / "flaky-run"
    done = subprocess.run(
        [sys.executable, "-m", "dlprof", "run", "--nproc", "2", "-o", str(out), str(script)],
        check=False, capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert done.returncode == 1
    assert "rank 1 ended failed: RuntimeError: rank 1 gives up" in done.stderr
    run = dlprof.load(out)
    assert run.status is RunStatus.FAILED
    assert run.manifest.error.startswith("rank 1 ended failed: RuntimeError: rank 1 gives up")
    steps = run.slices[run.slices.kind == Kind.STEP].groupby("rank").size()
    # Rank 1 kept its three steps (and the one it died in); rank 0 kept what it did before.
    assert steps[1] == 4 and steps[0] >= 3


@pytest.mark.slow  # torchrun launches two ranks
def test_plain_torchrun_ranks_agree_on_a_directory(tmp_path: Path) -> None:
    environment = {k: v for k, v in os.environ.items() if k != RUN_DIR_VARIABLE}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "-m", "dlprof", "run", str(EXAMPLES / "ddp_train.py"), "--steps", "3", "--workers", "0"],
        check=False, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=environment,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    runs = list((tmp_path / "dlprof-runs").iterdir())
    # --standalone gives the job a random id: both ranks read it, so one directory holds both.
    assert len(runs) == 1 and "-ddp_train-" in runs[0].name
    run = dlprof.load(runs[0])
    assert run.manifest.ranks == [0, 1] and run.status is RunStatus.COMPLETE
    # Rank 0 prints its table once its own part is saved; the job may still be saving then, and
    # the title says so rather than calling the shown rank's run "running".
    title = " ".join(done.stdout.split())
    assert "top op by total (rank 0 complete; " in title, done.stdout[:2000]
    assert "(running)" not in title


def test_a_rank_table_title_says_what_is_still_running() -> None:
    assert rank_table_state(0, RunStatus.COMPLETE, RunStatus.RUNNING) == "rank 0 complete; other ranks still saving"
    assert rank_table_state(0, RunStatus.COMPLETE, RunStatus.FAILED) == "rank 0 complete; job failed"


def test_rank_environment_reads_torchrun_variables() -> None:
    place = RankEnvironment.from_environment(
        {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "none"}
    )
    assert (place.rank, place.world_size, place.local_rank, place.job_id) == (3, 4, 1, "")
    assert place.distributed
    assert not RankEnvironment.from_environment({}).distributed
    for bad in ({"RANK": "x", "WORLD_SIZE": "2"}, {"RANK": "2", "WORLD_SIZE": "2"}):
        with pytest.raises(ValueError, match="RANK"):
            RankEnvironment.from_environment(bad)


def test_shared_run_dir_prefers_the_variable_then_the_launcher(tmp_path: Path) -> None:
    named = shared_run_dir("train", tmp_path, {RUN_DIR_VARIABLE: str(tmp_path / "here")})
    assert named == tmp_path / "here"
    by_id = shared_run_dir("train", tmp_path, {"TORCHELASTIC_RUN_ID": "abc"})
    assert by_id.parent == tmp_path and by_id.name.endswith("-train-abc")
    # Without an id, the launcher (this process's parent) names it: the same on every call.
    derived = shared_run_dir("train", tmp_path, {})
    assert derived.name.endswith(f"-train-job{os.getppid()}")
    assert derived == shared_run_dir("train", tmp_path, {})


def test_nproc_must_be_positive(tmp_path: Path) -> None:
    done = run_ddp_example(tmp_path / "none", "--nproc", "0")
    assert done.returncode == 2 and "Traceback" not in done.stderr


def test_ranks_on_one_host_keep_one_clock(two_rank_gloo_run: Path) -> None:
    run = dlprof.load(two_rank_gloo_run)
    for manifest in run.rank_manifests.values():
        clock = next(c for c in manifest.clocks if c.name == RANK0_CLOCK)
        assert clock.offset_ns == 0 and clock.method.startswith("same host")
        assert clock.bounds_ns is not None and clock.bounds_ns[0] <= clock.bounds_ns[1]
    # The exchange is labelled in the timeline, so its collectives are not mistaken for training's.
    slices = run.slices
    assert set(slices.loc[slices.name == EXCHANGE_RANGE, "rank"]) == {0, 1}


def test_a_measured_offset_moves_that_ranks_times(two_rank_gloo_run: Path, tmp_path: Path) -> None:
    copy = tmp_path / "shifted"
    shutil.copytree(two_rank_gloo_run, copy)
    manifest = Manifest.read_rank(copy, 1)
    for clock in manifest.clocks:
        if clock.name == RANK0_CLOCK:
            clock.offset_ns = 1_500_000
    manifest.write(copy, rank=1)
    before, after = dlprof.load(two_rank_gloo_run), dlprof.load(copy)
    for table in ("slices", "memory"):
        column = "start_ns" if table == "slices" else "ts_ns"
        old, new = getattr(before, table), getattr(after, table)
        assert (new.loc[new["rank"] == 0, column] == old.loc[old["rank"] == 0, column]).all()
        assert (new.loc[new["rank"] == 1, column] == old.loc[old["rank"] == 1, column] - 1_500_000).all()
