"""A run directory is input: reading or finishing one writes and deletes nothing outside it.

Runs travel (copied, attached to bug reports), so whatever a run's files say, a command acting
on it must leave everything else as it was: each test snapshots the directory around the run
(names, kinds, sizes, contents, link targets) and compares it afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import dlprof
from dlprof.keys import RunStatus
from dlprof.store.integrity import outside_problem
from tests.builders import write_killed_run, write_small_run
from tests.conftest import run_in_process

JOB = Path("pending") / "rank=0" / "save-00000.json"
CYCLE = Path("kineto") / "rank=0" / "cycle-00000.json"


def snapshot(root: Path, leave_out: Path | None = None) -> dict[str, tuple[str, str]]:
    """Every entry under ``root`` (but ``leave_out``'s): its kind and what it holds."""
    found: dict[str, tuple[str, str]] = {}
    for directory, subdirectories, files in os.walk(root):
        for name in [*subdirectories, *files]:
            entry = Path(directory) / name
            if leave_out is not None and entry.is_relative_to(leave_out):
                continue
            key = str(entry.relative_to(root))
            if entry.is_symlink():
                found[key] = ("link", os.readlink(entry))
            elif entry.is_dir():
                found[key] = ("directory", "")
            else:
                found[key] = ("file", hashlib.sha256(entry.read_bytes()).hexdigest())
    return found


def one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dlprof: error: "), stderr
    return lines[0]


def crafted(run: Path, elsewhere: Path, how: str) -> None:
    """Make the run's waiting save name a place outside it, as an attacker would."""
    job = json.loads((run / JOB).read_text())
    job["run_dir"] = str(elsewhere)  # ignored: a job's run is where it was found
    if how == "absolute":
        job["chunks"]["slices"] = [str(elsewhere / "victim.txt")]
    elif how == "dot-dot":
        job["cycles"][0]["trace"] = "../elsewhere/trace.json"
    else:  # a link inside the run to a file outside it
        (run / CYCLE).unlink()
        (run / CYCLE).symlink_to(elsewhere / "trace.json")
    (run / JOB).write_text(json.dumps(job))


@pytest.mark.parametrize("how", ["absolute", "dot-dot", "link"])
def test_a_crafted_waiting_save_writes_and_deletes_nothing_elsewhere(tmp_path: Path, how: str) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "victim.txt").write_text("keep me")
    evil = write_killed_run(tmp_path / "evil")
    shutil.copy(evil / CYCLE, elsewhere / "trace.json")
    crafted(evil, elsewhere, how)
    before = snapshot(tmp_path, leave_out=evil)

    code, _, err = run_in_process(["info", str(evil)])
    assert code == 0 and "Traceback" not in err
    assert len(err.strip().splitlines()) <= 1, "at most the line saying a save waits"
    code, out, err = run_in_process(["finish", str(evil)])
    assert code == 2 and out == ""
    assert "outside" in one_error_line(err)
    code, _, err = run_in_process(["top", str(evil)])
    assert "Traceback" not in err

    assert snapshot(tmp_path, leave_out=evil) == before
    assert (elsewhere / "victim.txt").read_text() == "keep me"
    assert not list(elsewhere.rglob("part-*")), "no part written outside the run"


def test_a_copied_run_finishes_into_itself_and_leaves_the_original_alone(tmp_path: Path) -> None:
    original = write_killed_run(tmp_path / "run")
    moved = Path(shutil.copytree(original, tmp_path / "moved", symlinks=True))
    before = snapshot(original)
    assert dlprof.load(moved).status is RunStatus.KILLED

    code, out, err = run_in_process(["finish", str(moved)])
    assert (code, err) == (0, "") and "1 save(s) made final" in out

    assert snapshot(original) == before, "the original still waits, untouched"
    assert list((moved / "slices" / "rank=0").glob("part-*.parquet"))
    assert not (moved / "pending").exists() and not (moved / CYCLE).exists()
    kernels = dlprof.load(moved).query("SELECT count(*) FROM slices WHERE kind = 'kernel'").rows[0][0]
    assert kernels > 0, "the cycle's trace was converted into the copy"


def test_reading_commands_refuse_a_link_out_of_the_run(tmp_path: Path) -> None:
    other = write_small_run(tmp_path / "other")
    run = write_small_run(tmp_path / "run")
    part = run / "slices" / "rank=0" / "part-00000.parquet"
    part.unlink()
    part.symlink_to(other / "slices" / "rank=0" / "part-00000.parquet")
    before = snapshot(tmp_path, leave_out=run)
    for command in (["top", str(run)], ["export", str(run)], ["finish", str(run)]):
        code, _, err = run_in_process(command)
        assert code == 2, (command, err)
        assert "slices/rank=0/part-00000.parquet: a link to a place outside the run" in one_error_line(err)
    assert snapshot(tmp_path, leave_out=run) == before


def test_a_link_that_stays_inside_the_run_is_not_damage(tmp_path: Path) -> None:
    run = write_small_run(tmp_path / "run")
    (run / "notes").symlink_to(run / "run.json")
    assert outside_problem(run) is None
    (run / "away").symlink_to(tmp_path)
    assert outside_problem(run) == "away: a link to a place outside the run"


@pytest.mark.parametrize("manifest", ["run.json", "ranks/0.json"])
def test_a_manifest_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path, manifest: str) -> None:
    run = write_small_run(tmp_path / "run")
    if manifest != "run.json":
        (run / "ranks").mkdir()
    (run / manifest).unlink(missing_ok=True)
    os.mkfifo(run / manifest)
    # A subprocess: reading a FIFO without a writer would hang this one for ever.
    done = subprocess.run([sys.executable, "-m", "dlprof", "info", str(run)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_manifest_that_is_a_link_is_not_followed(tmp_path: Path) -> None:
    run = write_small_run(tmp_path / "run")
    other = write_small_run(tmp_path / "other")
    (run / "run.json").unlink()
    (run / "run.json").symlink_to(other / "run.json")
    code, _, err = run_in_process(["info", str(run)])
    assert code == 2 and "symbolic link" in one_error_line(err)


def test_a_damaged_part_beside_waiting_chunks_is_one_line(tmp_path: Path) -> None:
    run = write_killed_run(tmp_path / "run")
    (run / "slices" / "rank=0" / "part-00005.parquet").write_bytes(b"junk")
    for command in (["info", str(run)], ["ls", "--dir", str(tmp_path)], ["top", str(run)]):
        code, _, err = run_in_process(command)
        assert "Traceback" not in err and code in (0, 2), (command, err)
        assert len([line for line in err.splitlines() if line.startswith("dlprof: error: ")]) == (code == 2)


@pytest.mark.slow
def test_a_chunk_that_is_a_fifo_is_named_not_waited_on(tmp_path: Path) -> None:
    run = write_killed_run(tmp_path / "run")
    (chunk,) = (run / "slices" / "rank=0").glob("chunk-*.parquet")
    chunk.unlink()
    os.mkfifo(chunk)
    for command in ("info", "top", "finish"):
        done = subprocess.run([sys.executable, "-m", "dlprof", command, str(run)], capture_output=True, text=True,
                              timeout=120, check=False)
        assert "Traceback" not in done.stderr and done.returncode in (0, 2), (command, done.stderr)
    assert "a FIFO (named pipe), not a Parquet file" in done.stderr
