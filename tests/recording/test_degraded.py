"""A collector that fails is loud: the run is degraded, never complete, and every command says so.

The failures are real ones, provoked as a program would: torch.profiler's own profiler recording
when dlprof's torch collector would start, or started by the program while dlprof's records (one
process records one torch.profiler at a time), and a collector asked for that cannot run here.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

import dlprof
from dlprof.recording.collector_set import CollectorError
from dlprof.recording.session import DegradedRun
from tests.conftest import dlprof_program

pytestmark = pytest.mark.torch

torch = pytest.importorskip("torch", reason="needs PyTorch (pip install 'dlprof[torch]')")


def _work(steps: int, prof: dlprof.Session | None = None, seconds: float = 0.0) -> None:
    x = torch.randn(64, 64)
    for _ in range(steps):
        x @ x
        time.sleep(seconds)
        if prof is not None:
            prof.step()


def test_under_the_programs_own_profiler_the_torch_collector_does_not_start(tmp_path: Path) -> None:
    """Before, dlprof's torch collector took Kineto over from the program's profiler (which then
    held no event) and the run read complete."""
    with torch.profiler.profile() as theirs:
        with dlprof.profile(out=tmp_path / "run", collectors=["torch", "layers"]) as prof:
            _work(3, prof)
    assert any(event.name == "aten::mm" for event in theirs.events()), "the program's profiler kept its ops"
    run = dlprof.load(tmp_path / "run")
    assert str(run.status) == "degraded"
    assert len(run.manifest.degraded) == 1
    assert run.manifest.degraded[0].startswith("torch collector could not start: ProfilerBusy: the program's own")
    torch_info = next(info for info in run.manifest.collectors if info.name == "torch")
    assert not torch_info.active


def test_strict_refuses_to_start_where_the_failure_is_known(tmp_path: Path) -> None:
    with torch.profiler.profile():
        with pytest.raises(CollectorError, match="torch could not start: ProfilerBusy"):
            with dlprof.profile(out=tmp_path / "run", collectors=["torch"], strict=True):
                pytest.fail("the block must not run")
    run = dlprof.load(tmp_path / "run")
    assert str(run.status) == "failed" and run.manifest.error.startswith("strict: collector torch")


def test_a_profiler_stopped_by_the_program_degrades_the_run_and_strict_raises_at_the_end(tmp_path: Path) -> None:
    """torch.autograd's own switch, thrown by the program mid-run: dlprof's recording is gone, and
    nothing more is asked of it (its trace cannot be saved)."""
    with pytest.raises(DegradedRun, match=r"stopped recording at step 2: torch\.profiler was stopped"):
        # Steps longer than save_seconds: each boundary saves what the step recorded.
        with dlprof.profile(out=tmp_path / "run", collectors=["torch"], strict=True, save_seconds=0.1) as prof:
            _work(2, prof, seconds=0.15)
            torch.autograd._disable_profiler()
            _work(2, prof)
    run = dlprof.load(tmp_path / "run")
    assert str(run.status) == "degraded"
    assert (run.slices["name"] == "aten::mm").sum() == 2, "the saves before it were kept"


def test_a_failure_giving_way_to_the_programs_profiler_stops_the_torch_collector_not_the_profiler(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """dlprof saves its cycle before the program's profiler takes Kineto; that save cannot be
    written here (the cycle's file name is taken by a directory). Before, its OSError was raised
    from the program's torch.profiler.profile()."""
    out = tmp_path / "run"
    with dlprof.profile(out=out, collectors=["torch"]) as prof:
        _work(2, prof)
        cycles = out / "kineto" / "rank=0"
        cycles.mkdir(parents=True, exist_ok=True)
        for number in range(100):  # whichever cycle comes next (a save may have been made)
            taken = cycles / f"cycle-{number:05d}.json"
            if not taken.exists():
                taken.mkdir()
                (taken / "the program's").write_text("")
        with torch.profiler.profile() as theirs:
            _work(1)
    assert sum(event.name == "aten::mm" for event in theirs.events()) == 1, "the program's profiler recorded"
    run = dlprof.load(out)
    (reason,) = run.manifest.degraded
    assert re.fullmatch(r"torch collector: write error \(.*cycle-\d+\.json: torch\.profiler could not write its "
                        r"trace\) in giving way to the program's "
                        r"torch\.profiler after step 2: its recording stopped", reason), reason
    assert capsys.readouterr().err == f"dlprof: {reason}; the program goes on\n"
    assert str(run.status) == "degraded"


OWN_PROFILER = """
import torch

x = torch.randn(64, 64)
for step in range(6):
    if step == 3:
        with torch.profiler.profile() as prof:
            x @ x
        print("their ops:", sum(e.name == "aten::mm" for e in prof.events()))
    else:
        x @ x
print("done")
"""


def _run_script(tmp_path: Path, source: str, *options: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(source)
    return subprocess.run([*dlprof_program(), "run", "-o", str(tmp_path / "run"), "-n", "0", *options, str(script)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False)


@pytest.mark.slow
def test_a_program_that_starts_its_own_profiler_runs_and_the_run_is_degraded(tmp_path: Path) -> None:
    """Before, the program's profiler took Kineto over and dlprof's next save read a trace that was
    gone: SIGSEGV. Now dlprof gives way, the program's profiler works, and every view says the
    recording is not whole: run's last line, ls, info, top (above the table) and the report."""
    done = _run_script(tmp_path, OWN_PROFILER, "--collectors", "torch")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[:1] == ["their ops: 1"] and done.stdout.splitlines()[-1] == "done"
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("dlprof: warning: run degraded, recording not whole: torch collector stopped "
                           "recording at step 0: the program started a torch.profiler of its own"), last

    listed = subprocess.run([*dlprof_program(), "ls", "--dir", str(tmp_path), "-f", "json"],
                            capture_output=True, text=True, timeout=120, check=True)
    row = json.loads(listed.stdout)[0]
    assert row["status"] == "degraded" and "torch.profiler of its own" in row["problem"]

    info = subprocess.run([*dlprof_program(), "info", str(tmp_path / "run"), "--wide"],
                          capture_output=True, text=True, timeout=120, check=True)
    assert "degraded" in info.stdout and "torch collector stopped recording at step 0" in info.stdout

    top = subprocess.run([*dlprof_program(), "top", str(tmp_path / "run"), "--wide"],
                         capture_output=True, text=True, timeout=120, check=True)
    assert top.stdout.splitlines()[0].startswith("degraded: recording not whole: torch collector stopped")

    report = tmp_path / "report.html"
    subprocess.run([*dlprof_program(), "report", str(tmp_path / "run"), "-o", str(report)],
                   capture_output=True, text=True, timeout=300, check=True)
    assert "the program started a torch.profiler of its own" in report.read_text()


@pytest.mark.slow
def test_strict_makes_a_degraded_run_exit_non_zero(tmp_path: Path) -> None:
    done = _run_script(tmp_path, OWN_PROFILER, "--collectors", "torch", "--strict")
    assert done.returncode == 3, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "done", "the script ran to its end"
    assert str(dlprof.load(tmp_path / "run").status) == "degraded"


def _unavailable_collector() -> str:
    from dlprof.collectors.registry import collector_class

    for name in ("cupti", "nvml", "rapl"):
        if not collector_class(name).available()[0]:
            return name
    pytest.skip("cupti, nvml and rapl all run on this machine: none is unavailable to ask for")


def test_a_collector_asked_for_that_cannot_run_degrades_the_run(tmp_path: Path) -> None:
    name = _unavailable_collector()
    done = _run_script(tmp_path, "print('ran')\n", "--collectors", f"host,{name}")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ran\n"
    assert done.stderr.strip().splitlines()[-1].startswith(
        f"dlprof: warning: run degraded, recording not whole: {name} collector unavailable: ")
    assert str(dlprof.load(tmp_path / "run").status) == "degraded"


def test_strict_refuses_a_collector_that_cannot_run_before_the_script_starts(tmp_path: Path) -> None:
    name = _unavailable_collector()
    done = _run_script(tmp_path, "print('ran')\n", "--collectors", f"host,{name}", "--strict")
    assert done.returncode == 2
    assert done.stdout == "", "the script did not run"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"dlprof: error: --strict: collector {name} unavailable: ")
    assert not (tmp_path / "run").exists()
