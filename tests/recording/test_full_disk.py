"""A full disk stops the recording, never the program: real small tmpfs file systems fill up.

Each test mounts a tmpfs of its own (root only; skipped with the reason elsewhere), runs a real
program that exits 17 on it, and checks that the program ran to its end with its own exit code,
that stderr holds one line of dlprof's and no traceback, that the run keeps what was saved and
says why it holds no more, and that reading the run gives tables or one line.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import dlprof
from dlprof.keys import RunStatus
from tests.builders import simple_add_trace
from tests.conftest import dlprof_program

# Steps of a hundred regions each: the run outgrows a 512 kB disk within a few hundred steps.
REGIONS = """
import sys
import dlprof
with dlprof.profile(out=sys.argv[1], collectors=["host"], save_seconds=0.1) as prof:
    for step in range(3000):
        for i in range(100):
            with dlprof.region(f"region {i}"):
                pass
        prof.step()
print("program done", step)
sys.exit(17)
"""

# A small model trained under `dlprof run`: once a save holding its ops is final (a part of the
# slices table), the program itself fills the disk (as a checkpoint would), leaving 64 kB; the
# next save fails. (A minute at most: the check then fails on the ops it wants.)
TRAINING = """
import glob, os, sys, time
import torch
model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)])
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 64)
disk, start, filled_at, step = sys.argv[1], time.monotonic(), None, 0
while filled_at is None or step < filled_at + 50:
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    saved = glob.glob(os.path.join(disk, "run", "slices", "*", "part-*.parquet"))
    if filled_at is None and (saved or time.monotonic() - start > 60):
        free = os.statvfs(disk)
        with open(os.path.join(disk, "checkpoint"), "wb") as checkpoint:
            checkpoint.write(bytes(free.f_bavail * free.f_frsize - (64 << 10)))
        filled_at = step
    step += 1
print("program done", step)
sys.exit(17)
"""

pytestmark = pytest.mark.slow  # real programs in subprocesses, each filling a disk

STOPPED = re.compile(r"dlprof: disk full after step (\d+): recording stopped; the program goes on, and "
                     r".* keeps what was saved before")


def small_disk(tmp_path: Path, size: str) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def half_megabyte(tmp_path: Path) -> Iterator[Path]:
    yield from small_disk(tmp_path, "512k")


@pytest.fixture
def sixty_four_megabytes(tmp_path: Path) -> Iterator[Path]:
    yield from small_disk(tmp_path, "64m")


def assert_reads(run: Path) -> None:
    """Reading commands on the run succeed, or fail in one error line (after the notices a run
    whose saves are not all final gets: `dlprof finish` makes them final); never a traceback."""
    for command in ("info", "top", "steps"):
        done = subprocess.run([*dlprof_program(), command, str(run)], capture_output=True, text=True,
                              timeout=300, check=False)
        assert "Traceback" not in done.stderr, (command, done.stderr)
        lines = done.stderr.strip().splitlines()
        notices = [line for line in lines if "`dlprof finish" in line]
        assert done.returncode == 0 or len(lines) - len(notices) == 1, (command, done.stderr)


def test_a_full_disk_stops_the_recording_not_the_program(half_megabyte: Path, tmp_path: Path) -> None:
    script = tmp_path / "regions.py"
    script.write_text(REGIONS)
    run = half_megabyte / "run"
    done = subprocess.run([sys.executable, str(script), str(run)], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 17, done.stderr
    assert "program done 2999" in done.stdout, "the program ran to its end"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and STOPPED.fullmatch(lines[0]), done.stderr
    step = STOPPED.fullmatch(lines[0])[1]  # type: ignore[index]
    loaded = dlprof.load(run)
    assert loaded.manifest.degraded == [f"disk full after step {step}: recording stopped"]
    assert loaded.status is RunStatus.DEGRADED, "the program ended well; the recording is not whole"
    kept = loaded.query("SELECT count(*) FROM slices WHERE kind = 'region'").rows[0][0]
    assert kept >= 100, "what was saved before the disk filled is kept"
    assert_reads(run)


@pytest.mark.torch
def test_a_full_disk_under_dlprof_run_lets_a_training_script_exit_with_its_own_code(
        sixty_four_megabytes: Path, tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="needs PyTorch (pip install 'dlprof[torch]')")
    script = tmp_path / "train.py"
    script.write_text(TRAINING)
    run = sixty_four_megabytes / "run"
    done = subprocess.run([*dlprof_program(), "run", "-o", str(run), "-n", "0", "--save-seconds", "0.5", str(script),
                           str(sixty_four_megabytes)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 17, done.stderr
    assert re.search(r"program done \d+", done.stdout), "the program ran to its end"
    lines = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr and all(line.startswith("dlprof: ") for line in lines), done.stderr
    assert sum(1 for line in lines if STOPPED.fullmatch(line)) == 1, done.stderr
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["status"] == "failed" and manifest["exit_code"] == 17
    (full,) = manifest["degraded"]
    assert full.startswith("disk full after step "), "the full disk is the one reason the recording stopped"
    assert dlprof.load(run).query("SELECT count(*) FROM slices WHERE kind = 'op'").rows[0][0] > 0
    assert_reads(run)


def test_an_import_to_a_full_disk_says_so_in_one_line(half_megabyte: Path) -> None:
    (half_megabyte / "filler").write_bytes(b"\0" * (480 << 10))
    done = subprocess.run([*dlprof_program(), "import", "-o", str(half_megabyte / "run"), str(simple_add_trace())],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("dlprof: error: ") and "no space left on device (the disk is full)" in line
    assert not (half_megabyte / "run").exists(), "a failed import removes what it wrote"
