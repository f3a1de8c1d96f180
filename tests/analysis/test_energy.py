"""Energy per step on real runs whose power samples are constructed: NVML's readings through the
nvml collector's own translation; each step's joules checked against the integral of the power
written. (No GPU here: the hardware path was not run.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import dlprof
from dlprof.analysis.energy import PowerSource, energy_summary, part_joules, power_sources, step_energy
from dlprof.analysis.steps import StepPart, StepStatus, step_report
from dlprof.cli.main import main
from tests.builders import add_power, profile_steps


def gpu_watts(t_s: float) -> tuple[float, float]:
    """cuda:0 draws a constant 200 W; cuda:1 ramps, 100 W plus 50 W a second."""
    return 200.0, 100.0 + 50.0 * t_s


def gpu_joules(a_s: float, b_s: float) -> tuple[float, float]:
    """The integrals of gpu_watts over [a, b], by hand."""
    return 200.0 * (b_s - a_s), 100.0 * (b_s - a_s) + 25.0 * (b_s**2 - a_s**2)


@pytest.fixture(scope="module")
def powered_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    run_dir = profile_steps(tmp_path_factory.mktemp("energy") / "run")
    return run_dir, add_power(run_dir, gpu_watts)


def test_each_steps_joules_are_the_integral_of_the_power_written(powered_run: tuple[Path, int]) -> None:
    run_dir, origin = powered_run
    run = dlprof.load(run_dir)
    assert power_sources(run) == [("cuda:0", PowerSource.NVML), ("cuda:1", PowerSource.NVML)]
    energy = step_energy(run)
    steps = step_report(run).steps
    assert len(energy) == 2 * len(steps)
    for step in steps.itertuples():
        a, b = (step.start_ns - origin) / 1e9, (step.start_ns + step.dur_ns - origin) / 1e9
        rows = energy[energy["start_ns"] == step.start_ns].set_index("device")
        constant, ramp = gpu_joules(a, b)
        assert rows.loc["cuda:0", "joules"] == pytest.approx(constant, rel=1e-9)
        assert rows.loc["cuda:1", "joules"] == pytest.approx(ramp, rel=1e-9)  # the trapezoid is exact on a line
        assert rows.loc["cuda:0", "watts"] == pytest.approx(200.0)
        assert rows["covered_pct"].tolist() == pytest.approx([100.0] * 2)
        assert set(rows["status"]) == {step.status}


def test_summary_and_parts_add_up_over_the_counted_steps(powered_run: tuple[Path, int]) -> None:
    run = dlprof.load(powered_run[0])
    energy, report = step_energy(run), step_report(run)
    counted = energy[energy["status"] == StepStatus.COUNTED]
    summary = energy_summary(energy).set_index("device")
    assert summary.loc["cuda:1", "steps"] == len(report.steps[report.steps["status"] == StepStatus.COUNTED])
    assert summary.loc["cuda:1", "total_joules"] == pytest.approx(counted[counted["device"] == "cuda:1"]["joules"].sum())
    parts = part_joules(report.steps, energy).set_index("part")["mean_joules"]
    per_step = counted.groupby("start_ns")["joules"].sum().mean()
    assert parts.sum() == pytest.approx(per_step)  # the parts add up to the step, so do their joules
    assert parts[str(StepPart.OTHER)] > 0


def test_dlprof_steps_shows_energy_and_cost(powered_run: tuple[Path, int], capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir, _ = powered_run
    assert main(["steps", str(run_dir), "--format", "json", "--price-per-hour", "3.6", "-n", "0"]) == 0
    report = json.loads(capsys.readouterr().out)
    energy = step_energy(dlprof.load(run_dir))
    for step in report["steps"]:
        assert step["joules"] == pytest.approx(energy[energy["start_ns"] == step["start_ns"]]["joules"].sum())
        assert step["cost"] == pytest.approx(step["dur_ns"] / 1e9 / 3600 * 3.6)
    assert {row["device"] for row in report["energy"]} == {"cuda:0", "cuda:1"}
    manifest = dlprof.load(run_dir).manifest
    assert report["run_cost"] == pytest.approx((manifest.end_ns - manifest.start_ns) / 1e9 / 1000)
    monkeypatch.setenv("COLUMNS", "300")
    assert main(["steps", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "energy per counted step, per device" in out and "Energy (J)" in out


def test_a_run_without_power_says_so_when_a_cost_is_asked_for(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = profile_steps(tmp_path / "run")
    assert step_energy(dlprof.load(run_dir)).empty
    assert main(["steps", str(run_dir)]) == 0
    assert "energy:" not in capsys.readouterr().out
    assert main(["steps", str(run_dir), "--price-per-hour", "2"]) == 0
    out = capsys.readouterr().out
    assert "energy: not recorded" in out and "cost of the run:" in out
    assert main(["steps", str(run_dir), "--price-per-hour", "-1"]) == 2
