"""``make gpu-check`` on a machine without a GPU: one line and exit 3, as a user runs it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tools.gpu_check.driver import find_gpus
from tools.gpu_check.report import ExitCode
from tools.gpu_check.runner import ROOT

HAS_DRIVER = not find_gpus().reason
needs_no_gpu = pytest.mark.skipif(HAS_DRIVER, reason="an NVIDIA driver is here: gpu-check runs for real instead")
NO_GPU_LINE = "gpu-check: no NVIDIA GPU here ("


def test_a_driver_library_that_is_not_there_is_the_reason() -> None:
    gpus = find_gpus("libcuda-that-does-not-exist.so.1")
    assert gpus.names == [] and gpus.cuda_version == 0
    assert gpus.reason.startswith("no NVIDIA driver: libcuda-that-does-not-exist.so.1")


@needs_no_gpu
def test_without_a_gpu_it_says_so_in_one_line_and_exits_3(tmp_path: os.PathLike[str]) -> None:
    env = {**os.environ, "DLPROF_GPU_CHECK_OUT": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "tools.gpu_check"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == ExitCode.NO_GPU == 3
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith(NO_GPU_LINE)
    assert lines[0].endswith("nothing was checked (exit 3)")
    assert list(os.scandir(tmp_path)) == []  # nothing written: there was nothing to report


@needs_no_gpu
@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_gpu_check_shows_the_line_and_makes_error_3(tmp_path: os.PathLike[str]) -> None:
    done = subprocess.run(["make", "-s", "gpu-check", f"GPU_PYTHON={sys.executable}"], cwd=ROOT,
                          env={**os.environ, "DLPROF_GPU_CHECK_OUT": str(tmp_path)}, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.stdout.splitlines()[0].startswith(NO_GPU_LINE)
    assert "gpu-check] Error 3" in done.stderr  # make exits 2 itself, as for any failing recipe
    assert done.returncode == 2


def test_bad_options_exit_2_with_one_message() -> None:
    done = subprocess.run([sys.executable, "-m", "tools.gpu_check", "--check", "warp_drive"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == ExitCode.USAGE == 2
    assert "invalid choice: 'warp_drive'" in done.stderr and "Traceback" not in done.stderr


def test_each_check_names_rows_of_the_readmes_verification_table() -> None:
    from tools.gpu_check.checks import CHECKS

    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## What was verified where"):readme.index("## Performance")]
    rows = {line.split(" | ")[0].removeprefix("| ") for line in table.splitlines() if line.startswith("| ")}
    for spec in CHECKS:
        assert spec.covers and set(spec.covers) <= rows, spec.name
        assert f"`{spec.name}`" in table  # and the table says which check proves the row
