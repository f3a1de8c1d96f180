"""Combining the manifests of a job's ranks into the run's one manifest."""

from __future__ import annotations

from pathlib import Path

import pytest

import dlprof
from dlprof.keys import RunStatus
from dlprof.store.job import combine
from dlprof.store.manifest import Manifest, read_rank_manifests
from dlprof.store.reader import RunError


def _rank(rank: int, status: RunStatus, end_ns: int, error: str = "", exit_code: int | None = 0) -> Manifest:
    return Manifest(name="job", command=["train.py"], status=status, start_ns=100 + rank,
                    end_ns=end_ns, error=error, exit_code=exit_code, ranks=[rank], world_size=3,
                    counts={"slices": 10 * (rank + 1)}, writer_pid=-1)


def _never_alive(manifest: Manifest) -> bool:
    return False


def test_the_first_rank_to_fail_is_named() -> None:
    ranks = {
        0: _rank(0, RunStatus.FAILED, 900, "RuntimeError: peer closed", 1),
        1: _rank(1, RunStatus.FAILED, 500, "ValueError: bad batch", 3),
        2: _rank(2, RunStatus.INTERRUPTED, 950, "Interrupted", 143),
    }
    job = combine(ranks, base=None, alive=_never_alive)
    assert job.status is RunStatus.FAILED
    assert job.error == "rank 1 ended failed: ValueError: bad batch"
    assert job.exit_code == 3
    assert job.ranks == [0, 1, 2] and job.world_size == 3
    assert (job.start_ns, job.end_ns) == (100, 950)
    assert job.counts == {"slices": 60}


def test_a_rank_left_running_by_a_dead_writer_is_killed() -> None:
    ranks = {0: _rank(0, RunStatus.COMPLETE, 900), 1: _rank(1, RunStatus.RUNNING, 0, exit_code=None)}
    job = combine(ranks, base=None, alive=_never_alive)
    assert job.status is RunStatus.KILLED and job.error == "rank 1 was killed"
    assert combine(ranks, base=None, alive=lambda m: True).status is RunStatus.RUNNING


def test_all_complete_is_complete() -> None:
    base = _rank(0, RunStatus.RUNNING, 0)  # rank 0's run.json, written before the others ended
    ranks = {r: _rank(r, RunStatus.COMPLETE, 800 + r) for r in range(3)}
    job = combine(ranks, base=base, alive=_never_alive)
    assert job.status is RunStatus.COMPLETE and job.error == "" and job.exit_code == 0


def test_a_run_of_rank_manifests_without_run_json_loads(tmp_path: Path) -> None:
    # Rank 0 never started: ranks 1 and 2 still make a readable run.
    for rank in (1, 2):
        _rank(rank, RunStatus.COMPLETE, 700).write(tmp_path, rank=rank)
    assert sorted(read_rank_manifests(tmp_path)) == [1, 2]
    run = dlprof.load(tmp_path)
    assert run.manifest.ranks == [1, 2] and run.status is RunStatus.COMPLETE


def test_a_damaged_rank_manifest_is_one_clear_error(tmp_path: Path) -> None:
    _rank(0, RunStatus.COMPLETE, 700).write(tmp_path)
    (tmp_path / "ranks").mkdir()
    (tmp_path / "ranks" / "1.json").write_text("{not json")
    with pytest.raises(RunError, match="unreadable rank manifest"):
        dlprof.load(tmp_path)
