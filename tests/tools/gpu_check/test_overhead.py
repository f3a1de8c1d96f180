"""The overhead part: its figures from measurements, and its processes for real on the CPU (the
same commands it runs on cuda, with the device changed)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tools.gpu_check.checks.harness import Check
from tools.gpu_check.checks.overhead import command, measure, workload_part
from tools.gpu_check.overhead import Measurement, round_order, step_period_ms, summarise
from tools.gpu_check.report import Status
from tools.gpu_check.runner import ROOT
from tools.gpu_check.workloads import CNN, OWN_GPT, Workload, gpt_program


def test_each_way_comes_first_in_one_of_three_rounds() -> None:
    assert [round_order(n)[0] for n in range(3)] == ["plain", "bare", "dlprof"]
    assert all(sorted(round_order(n)) == ["bare", "dlprof", "plain"] for n in range(5))


def test_the_step_period_leaves_the_first_steps_out() -> None:
    ms = 1_000_000
    steps = [0, 50 * ms, 60 * ms, 70 * ms, 80 * ms, 92 * ms, 102 * ms]  # slow start, then ~10 ms
    assert step_period_ms(steps) == 10.0
    assert step_period_ms(steps[:4]) is None  # nothing after the warm-up steps


def _round(number: int, plain: float, bare: float, ours: float, memory: float = 1000.0) -> list[Measurement]:
    return [Measurement("gpt", "plain", number, plain, plain, memory, 9000.0),
            Measurement("gpt", "bare", number, bare, bare, 2 * memory, 9000.0, events=70_000),
            Measurement("gpt", "dlprof", number, ours, ours, 1.5 * memory, 9000.0, events=100_000)]


def test_ratios_are_taken_round_by_round() -> None:
    measured = [*_round(0, 10, 20, 21), *_round(1, 12, 24, 24), *_round(2, 11, 20, 23)]
    rows, ratios = summarise(measured)
    assert [(r["way"], r["rounds"], r["wall_s"]) for r in rows] == [("plain", 3, 11), ("bare", 3, 20),
                                                                    ("dlprof", 3, 23)]
    dlprof_bare = ratios[0]
    assert dlprof_bare["ratio"] == "dlprof/bare" and dlprof_bare["wall"] == 1.05
    assert dlprof_bare["wall range"] == "1.000-1.150" and dlprof_bare["memory"] == 0.75
    part = workload_part(Workload("gpt", OWN_GPT, ()), measured, 3, "")
    assert part.status is Status.PASSED and part.detail.startswith("3 rounds: dlprof/bare wall 1.05")


def test_a_failed_process_or_too_few_rounds_is_said() -> None:
    measured = _round(0, 10, 20, 21)
    short = workload_part(Workload("gpt", OWN_GPT, ()), measured, 1, "round 2 needs about 90 s, 40 s were left")
    assert short.status is Status.COULD_NOT_RUN and short.detail.startswith("1 of 3 rounds: round 2 needs")
    broken = [*measured[:2], Measurement("gpt", "dlprof", 0, 5.0, None, 100.0, None, returncode=1)]
    part = workload_part(Workload("gpt", OWN_GPT, ()), broken, 1, "")
    assert part.status is Status.FAILED and part.detail == "dlprof round 1 exited 1"
    assert part.figures["per way"][2]["rounds"] == 0  # a failed process gives no figure


def test_the_benchmarks_gpt_is_taken_once_it_exists(tmp_path: Path) -> None:
    assert gpt_program(tmp_path / "gpt.py").script == OWN_GPT
    (tmp_path / "gpt.py").write_text("")
    chosen = gpt_program(tmp_path / "gpt.py")
    assert chosen.script == tmp_path / "gpt.py" and chosen.argv(5) == [str(tmp_path / "gpt.py"), "--device",
                                                                       "cuda", "--steps", "5"]


@pytest.mark.slow
def test_each_way_runs_the_script_through_the_step_timer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The three processes for real, the CNN on the CPU: steps timed, memory sampled, events counted."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # as the orchestrator runs every check
    check = Check(tmp_path, tmp_path / "result.json", time.monotonic() + 600)
    workload = Workload("cnn", CNN, ("--device", "cpu", "--batch-size", "16", "--threads", "1"))
    measured = {way: measure(check, workload, way, 0, 12) for way in ("plain", "bare", "dlprof")}
    for way, found in measured.items():
        assert found.returncode == 0, way
        assert found.step_ms is not None and found.step_ms > 0, way
        assert found.peak_rss_mib > 50 and found.peak_cuda_mib is None, way
    assert measured["bare"].events > 1000 and measured["dlprof"].events > 1000
    assert measured["plain"].events == 0
    assert list(tmp_path.iterdir()) == []  # each process's scratch directory is removed


def test_bare_and_dlprof_wrap_the_step_timer(tmp_path: Path) -> None:
    workload = Workload("cnn", CNN, ("--device", "cuda"))
    bare = command("bare", workload, 5, tmp_path)
    assert bare[1].endswith("bench/bare_profiler.py") and bare[4].endswith("programs/step_timer.py")
    ours = command("dlprof", workload, 5, tmp_path)
    assert ours[1:4] == ["-m", "dlprof", "run"] and ours[-2:] == ["--steps", "5"]


@pytest.mark.slow
def test_the_step_timer_passes_the_scripts_exit_status_and_still_writes(tmp_path: Path) -> None:
    script = tmp_path / "fails.py"
    script.write_text("import sys\nsys.exit(5)\n")
    done = subprocess.run([sys.executable, str(ROOT / "tools/gpu_check/programs/step_timer.py"), "--out",
                           str(tmp_path / "steps.json"), str(script)], cwd=ROOT, capture_output=True,
                          timeout=300, check=False, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 5, done.stderr
    assert json.loads((tmp_path / "steps.json").read_text())["steps_ns"] == []
