"""One writer per run: a second ``dlprof run -o SAME`` is refused while the first lives, and a
killed writer leaves no lock behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlprof.config import ProfileConfig
from dlprof.recording.session import Session
from dlprof.store.new_run import RunExistsError, prepare_run_dir
from dlprof.store.writer_lock import RESERVE_BYTES, RunInUseError, WriterLock, in_use
from tests.builders import write_small_run

# Runs until the file its first argument names appears; writes its second argument first, so a
# test knows it ran.
WAITING = """
import pathlib, sys, time
pathlib.Path(sys.argv[2]).write_text("ran")
while not pathlib.Path(sys.argv[1]).exists():
    time.sleep(0.05)
"""


def dlprof_run(tmp_path: Path, out: Path, marker: str, *extra: str) -> subprocess.Popen[str]:
    script = tmp_path / "waiting.py"
    script.write_text(WAITING)
    return subprocess.Popen([sys.executable, "-m", "dlprof", "run", "-o", str(out), "-n", "0", "--collectors", "host",
                             *extra, str(script), str(tmp_path / "go"), str(tmp_path / marker)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def wait_for(path: Path, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


@pytest.mark.slow  # dlprof run in subprocesses
def test_a_second_run_into_a_directory_being_written_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "same"
    first = dlprof_run(tmp_path, out, "first-ran")
    wait_for(tmp_path / "first-ran")
    assert in_use(out) == f"dlprof (pid {first.pid})"
    for force in ((), ("--force",)):
        second = dlprof_run(tmp_path, out, "second-ran", *force)
        _, err = second.communicate(timeout=120)
        assert second.returncode == 2, err
        assert err.strip().splitlines() == [
            f"dlprof: error: {out}: in use: dlprof (pid {first.pid}) is writing a run there; wait for it to end, "
            "or choose another run directory"]
        assert not (tmp_path / "second-ran").exists(), "the refused program never started"
    (tmp_path / "go").touch()
    _, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert "complete" in err and in_use(out) is None
    assert not list(out.glob(".writer-*")), "a writer that ended removes its lock file"


@pytest.mark.slow  # dlprof run in subprocesses
def test_a_killed_writer_leaves_no_lock(tmp_path: Path) -> None:
    out = tmp_path / "same"
    first = dlprof_run(tmp_path, out, "first-ran")
    wait_for(tmp_path / "first-ran")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    assert in_use(out) is None
    (tmp_path / "go").touch()
    second = dlprof_run(tmp_path, out, "second-ran", "--force")
    _, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    assert (tmp_path / "second-ran").exists()


def test_a_session_does_not_start_on_a_rank_another_process_holds(tmp_path: Path) -> None:
    # Both found the directory empty (prepare_run_dir passed for both): the lock decides.
    out = tmp_path / "run"
    out.mkdir()
    held = WriterLock(out, 0)
    held.acquire()  # an open file description of its own: as another process's lock
    try:
        session = Session(ProfileConfig(out=out, collectors=("host",)))
        with pytest.raises(RunInUseError, match="in use"):
            session.start()
        assert not (out / "run.json").exists(), "nothing written before the lock was taken"
        with pytest.raises(RunExistsError, match="in use"):
            prepare_run_dir(out, force=True)
    finally:
        held.release()
    assert not list(out.iterdir())


def test_force_never_removes_a_run_being_written_and_the_lock_keeps_room(tmp_path: Path) -> None:
    run = write_small_run(tmp_path / "run")
    lock = WriterLock(run, 0)
    lock.acquire()
    assert lock.path.stat().st_size > RESERVE_BYTES
    lock.free_reserve()
    assert lock.path.stat().st_size == len(f"{os.getpid()}\n")
    with pytest.raises(RunExistsError, match="in use"):
        prepare_run_dir(run, force=True)
    assert (run / "run.json").is_file(), "a run being written is never removed under its writer"
    lock.release()
    prepare_run_dir(run, force=True)
    assert not run.exists()


def test_a_lock_file_a_killed_writer_left_does_not_make_a_directory_foreign(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    WriterLock(out, 0).path.write_text("12345\n")  # killed before it wrote anything else
    prepare_run_dir(out, force=False)
