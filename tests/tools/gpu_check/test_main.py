"""``make gpu-check`` on a machine without a GPU: one line and exit 3, as a user runs it; and, with
stand-ins for the GPU and the check processes, the order and time budget of the checks and the
parts after them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

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


def test_the_parts_after_the_checks_run_in_order_or_are_skipped_for_time(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """With a GPU that the stand-ins describe: each check and part is run in its turn with the
    report's directory, the report is rewritten after each, and a part that no longer fits in the
    budget says so instead of starting."""
    import json
    from types import SimpleNamespace

    import tools.gpu_check.__main__ as orchestrator
    from tools.gpu_check.checks import AFTER_CHECKS, CHECKS, CheckSpec
    from tools.gpu_check.driver import Gpus
    from tools.gpu_check.install import Prepared
    from tools.gpu_check.report import CheckResult, Part, Report, Status

    clock = [0.0]
    ran: list[tuple[str, float, Path | None]] = []
    reports: list[int] = []

    def run_check(spec: CheckSpec, python: str, work: Path, timeout_s: float, env: dict[str, str],
                  out: Path | None = None) -> CheckResult:
        ran.append((spec.name, timeout_s, out))
        clock[0] += 60  # each takes a minute
        return CheckResult.of(spec.name, spec.title, [Part("done", Status.PASSED)], 60, spec.covers)

    real_write = orchestrator.write_report

    def write_report(report: Report, directory: Path) -> tuple[Path, Path]:
        reports.append(len([c for c in report.checks if c.parts]))
        return real_write(report, directory)

    monkeypatch.setattr(orchestrator, "find_gpus", lambda: Gpus(names=["NVIDIA H200"], cuda_version=13000))
    monkeypatch.setattr(orchestrator, "prepare", lambda *args: Prepared(sys.executable, ["nothing installed"]))
    monkeypatch.setattr(orchestrator, "probe", lambda python, modules, env: ({m: "" for m in modules}, {}))
    monkeypatch.setattr(orchestrator, "run_check", run_check)
    monkeypatch.setattr(orchestrator, "write_report", write_report)
    monkeypatch.setattr(orchestrator, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    out = tmp_path / "out"
    code = orchestrator.main(["--out", str(out), "--work", str(tmp_path / "work"), "--budget", "350"])
    # 4 checks and the recordings fit (a minute each); then 350 - 300 - 15 = 35 s are left: the
    # overhead, needing 90, is skipped, and the commands (at least 20) run in what is left.
    assert [name for name, _, _ in ran] == [s.name for s in CHECKS] + ["recordings", "commands"]
    assert all(given == out for _, _, given in ran)
    assert ran[-1][1] == 35
    assert reports == [1, 2, 3, 4, 5, 5, 6, 6]  # after each, and once more at the end
    report = json.loads((out / "gpu-check.json").read_text())
    overhead = next(c for c in report["checks"] if c["name"] == "overhead")
    assert overhead["status"] == "could not run"
    assert overhead["reason"] == "out of time: 35 s of the 350 s budget left, 90 s needed"
    assert code == 4 and [c["name"] for c in report["checks"]] == [s.name for s in (*CHECKS, *AFTER_CHECKS)]
