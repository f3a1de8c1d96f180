"""A run killed at any moment keeps what it saved seconds before, and reads as killed."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

import dlprof
from dlprof.keys import RunStatus
from dlprof.store.layout import PENDING
from tests.conftest import dlprof_program

pytestmark = [pytest.mark.torch, pytest.mark.slow]

pytest.importorskip("torch", reason="needs PyTorch (pip install 'dlprof[torch]')")

# Small ops for a minute, no steps: only saves by time keep the data.
WORKING = """
import os, sys, time, torch
print("ready", flush=True)
x = torch.ones(64)
end = time.time() + 60
while time.time() < end:
    x = (x * 1.0001).sin()
    time.sleep(0.0005)
    exit_file = os.environ.get("EXIT_FILE", "")
    if exit_file and os.path.exists(exit_file) and time.time() > float(open(exit_file).read() or "inf"):
        os._exit(0)  # gone without a word: no exit handler runs
"""


def _start(tmp_path: Path, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], Path]:
    script = tmp_path / "working.py"
    script.write_text(WORKING)
    out = tmp_path / "run"
    process = subprocess.Popen([*dlprof_program(), "run", "--top", "0", "--save-seconds", "1", "-o", str(out),
                                str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, env={**os.environ, **(env or {})})
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    return process, out


def _wait_for_saves(out: Path, timeout_s: float = 120.0) -> None:
    """The finisher's child outlives the program it served and finishes what waits (at nice 19:
    on a busy machine that takes a while)."""
    deadline = time.monotonic() + timeout_s
    while (out / PENDING).exists() and time.monotonic() < deadline:
        time.sleep(0.1)


def _finisher_of(process: subprocess.Popen[str]) -> psutil.Process:
    """The profiled process's finisher child (started at its first save)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        finishers = [child for child in psutil.Process(process.pid).children()
                     if "dlprof.recording.finisher" in " ".join(child.cmdline())]
        if finishers:
            assert len(finishers) == 1
            return finishers[0]
        time.sleep(0.1)
    raise AssertionError("no finisher child started")


def _ops_end_ns(run: dlprof.Run) -> int:
    ops = run.slices[run.slices.kind == "op"]
    assert len(ops) > 1000, "seconds of ops were kept"
    return int((ops.start_ns + ops.dur_ns).max())


def test_sigkill_keeps_all_but_the_last_seconds(tmp_path: Path) -> None:
    process, out = _start(tmp_path)
    time.sleep(4)
    killed_at = time.time_ns()
    process.kill()
    process.wait()
    _wait_for_saves(out)
    run = dlprof.load(out)
    assert run.status is RunStatus.KILLED
    assert killed_at - _ops_end_ns(run) < 3e9, "saved at least every second, converted after the kill"


def test_os_exit_keeps_all_but_the_last_seconds(tmp_path: Path) -> None:
    exit_file = tmp_path / "exit_at"
    process, out = _start(tmp_path, {"EXIT_FILE": str(exit_file)})
    # The program runs long enough to save several times (torch's start-up is slow on a busy machine).
    deadline = time.monotonic() + 60
    while not list((out / "slices").rglob("*.parquet")) and time.monotonic() < deadline:
        time.sleep(0.2)
    # The finisher's child stalls until the program is gone, so that it has results to hand over
    # to a parent that no longer reads them.
    finisher = _finisher_of(process)
    finisher.suspend()
    exit_at = time.time() + 3
    exit_file.write_text(str(exit_at))
    assert process.wait(timeout=60) == 0
    finisher.resume()
    _wait_for_saves(out)
    assert process.stderr is not None
    # The finisher's child outlived the program: its results go nowhere, and no traceback of
    # dlprof's reaches the program's terminal.
    assert "Traceback" not in process.stderr.read()
    run = dlprof.load(out)
    assert run.status is RunStatus.KILLED
    assert exit_at * 1e9 - _ops_end_ns(run) < 3e9


def test_saves_left_by_killed_processes_are_said_when_read_and_finished_on_request(tmp_path: Path) -> None:
    process, out = _start(tmp_path)
    time.sleep(1.5)
    # The finisher's child stalls (stopped), so that saves wait; then both processes are killed.
    _finisher_of(process).suspend()
    time.sleep(3)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert list((out / PENDING).rglob("save-*")), "saves were waiting"
    pending = sorted(path.name for path in (out / PENDING).rglob("save-*"))
    read = subprocess.run([*dlprof_program(), "top", str(out), "--limit", "3"], capture_output=True,
                          text=True, timeout=120, check=False)
    # What the raw chunks hold is read (here perhaps nothing: the ops are in the waiting traces).
    assert read.returncode in (0, 2) and "Traceback" not in read.stderr, read.stderr
    assert "not final" in read.stderr and f"dlprof finish {out}" in read.stderr
    assert sorted(path.name for path in (out / PENDING).rglob("save-*")) == pending, "reading wrote nothing"
    finished = subprocess.run([*dlprof_program(), "finish", str(out)], capture_output=True,
                              text=True, timeout=120, check=False)
    assert finished.returncode == 0, finished.stderr
    assert "made final" in finished.stdout
    assert not (out / PENDING).exists()
    done = subprocess.run([*dlprof_program(), "top", str(out), "--limit", "3"], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0 and "not final" not in done.stderr, done.stderr
    assert "aten::" in done.stdout
