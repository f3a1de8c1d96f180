"""``dlprof diff``: its tables, CSV and JSON, the --fail-above gate and its exit codes, ranks, run
names, and one-line errors, in-process and as the installed program, on imported real traces
(expected figures summed from the raw JSON in tests/analysis/test_diff.py) and native torch runs."""

from __future__ import annotations

import csv
import io
import json
import subprocess
from pathlib import Path

import pytest

import dlprof
from dlprof.analysis.diff import DIFF_COLUMNS, TOTAL_NAME
from dlprof.analysis.energy import step_energy, step_power
from dlprof.analysis.steps import StepStatus, step_report
from dlprof.cli.main import main
from dlprof.config import RUNS_DIR
from dlprof.keys import Kind
from dlprof.viewers.names import readable, short_name
from tests.builders import add_power, profile_steps
from tests.conftest import dlprof_program
from tests.references import raw_trace


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def per_step_kernels() -> dict[str, tuple[float, float]]:
    """Each kernel's time per step in the control and the test trace, from the raw JSON."""
    control, test = raw_trace("control"), raw_trace("test")
    names = {n for raw in (control, test) for (c, n) in raw.time_ns if c == "kernel"}
    return {
        name: (control.time_ns.get(("kernel", name), 0) / control.steps,
               test.time_ns.get(("kernel", name), 0) / test.steps)
        for name in names
    }


def json_rows(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[dict[str, object]], str]:
    code, out, err = run_cli([*argv, "--format", "json"], capsys)
    return code, json.loads(out)["rows"], err


def test_tables_for_a_person(trace_diff_runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    control, test = map(str, trace_diff_runs)
    code, out, err = run_cli(["diff", control, test, "-n", "5"], capsys)
    assert code == 0 and err == ""
    assert "A: control  vs  B: test; times and calls per step (A: 6 steps, B: 6)" in out
    assert "Totals" in out and "op: 5 of" in out and "kernel: 5 of" in out
    kernels = per_step_kernels()
    biggest = max(kernels, key=lambda n: (abs(kernels[n][1] - kernels[n][0]), n))
    # The largest kernel change heads its table, its long C++ name shortened (whole in JSON).
    kernel_table = out.split("kernel: 5 of", 1)[1].splitlines()
    first_row = kernel_table[next(i for i, line in enumerate(kernel_table) if "───" in line) + 1]
    shortened = first_row.split()[0]
    assert readable(biggest).startswith(shortened.split("…")[0]) and "…" in shortened
    assert len(biggest) > 200 and biggest not in out
    assert "new" in first_row.split() if kernels[biggest][0] == 0 else "%" in first_row


def test_json_holds_every_name(trace_diff_runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    control, test = map(str, trace_diff_runs)
    code, rows, _ = json_rows(["diff", control, test, "--kind", "kernel", "-n", "0"], capsys)
    assert code == 0
    assert all(list(row) == DIFF_COLUMNS for row in rows)
    assert rows[0]["name"] == TOTAL_NAME and {row["kind"] for row in rows} == {Kind.KERNEL}
    kernels = per_step_kernels()
    got = {row["name"]: (row["time_a_ns"], row["time_b_ns"]) for row in rows[1:]}
    assert set(got) == set(kernels)
    for name, (time_a, time_b) in kernels.items():
        assert got[name] == (round(time_a), round(time_b))


def test_csv_and_whole_run_totals(trace_diff_runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    control, test = map(str, trace_diff_runs)
    code, out, _ = run_cli(["diff", control, test, "--per", "run", "--kind", "kernel", "-n", "3",
                            "--format", "csv"], capsys)
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert list(rows[0]) == DIFF_COLUMNS and len(rows) == 4
    kernels = raw_trace("control").time_ns, raw_trace("test").time_ns
    total_a, total_b = (sum(t for (c, _), t in side.items() if c == "kernel") for side in kernels)
    assert (rows[0]["time_a_ns"], rows[0]["time_b_ns"]) == (str(total_a), str(total_b))
    assert {row["per"] for row in rows} == {"run"}


def test_gate_fails_on_a_regression(trace_diff_runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    control, test = map(str, trace_diff_runs)
    kernels = per_step_kernels()
    grown = {n: (b - a) / a for n, (a, b) in kernels.items() if a and b - a >= 1_000_000}
    worst = max(grown, key=grown.__getitem__)
    # Just under the worst growth: that kernel regresses; kernels new in B count too.
    threshold = 100 * grown[worst] - 0.5
    code, rows, err = json_rows(["diff", control, test, "--kind", "kernel", "-n", "0",
                                 "--fail-above", f"{threshold}", "--min-time", "1ms"], capsys)
    assert code == 1
    flagged = {row["name"] for row in rows if row["regressed"] and row["name"] != TOTAL_NAME}
    new = {n for n, (a, b) in kernels.items() if not a and b >= 1_000_000}
    assert flagged == {worst} | new
    assert f"{len(flagged)} regression(s) above {threshold:g}%" in err  # totals grew less than this
    assert f"kernel {short_name(worst)}:" in err


def test_gate_passes_within_the_threshold(trace_diff_runs: tuple[Path, Path],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    control, test = map(str, trace_diff_runs)
    kernels = per_step_kernels()
    largest_new = max(b for a, b in kernels.values() if not a)
    largest_growth = max((b - a) / a for a, b in kernels.values() if a)
    floor_us = largest_new / 1000 + 1
    code, out, err = run_cli(["diff", control, test, "--kind", "kernel", "--fail-above",
                              f"{100 * largest_growth + 1}", "--min-time", f"{floor_us}us"], capsys)
    assert code == 0 and "kernel:" in out
    assert "no regression above" in err


@pytest.mark.torch
def test_same_run_has_no_regression_as_a_program(cnn_run: Path) -> None:
    done = subprocess.run([*dlprof_program(), "diff", str(cnn_run), str(cnn_run), "--fail-above", "0",
                           "--min-time", "0"], capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "per step (A: 6 steps, B: 6)" in done.stdout and "kernel" not in done.stdout  # CPU only
    assert "no regression above 0%" in done.stderr


def test_regression_exits_1_as_a_program(trace_diff_runs: tuple[Path, Path]) -> None:
    control, test = map(str, trace_diff_runs)
    done = subprocess.run([*dlprof_program(), "diff", control, test, "--fail-above", "5"],
                          capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "op total:" in done.stderr and "kernel total:" in done.stderr and "Traceback" not in done.stderr


def test_ranks_and_run_names(trace_diff_runs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
                             tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / RUNS_DIR).mkdir()
    for run in trace_diff_runs:
        (tmp_path / RUNS_DIR / run.name).symlink_to(run)
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli(["diff", "control", "test", "--rank", "3:1", "-n", "1"], capsys)
    assert code == 0 and "A: control rank 3  vs  B: test rank 1" in out
    code, _, err = run_cli(["diff", "control", "test", "--rank", "3"], capsys)
    assert code == 2 and "no rank 3; this run has ranks: 1" in err


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--kind", "nope"], "no slices of kind 'nope' in either run"),
        (["--rank", "x"], "give a rank (0) or a rank per run (3:1)"),
        (["--min-time", "5"], "not a time with a unit"),
        (["--fail-above", "-1"], "--fail-above"),
    ],
)
def test_bad_input_is_one_line(args: list[str], words: str, trace_diff_runs: tuple[Path, Path],
                               capsys: pytest.CaptureFixture[str]) -> None:
    control, test = map(str, trace_diff_runs)
    code, out, err = run_cli(["diff", control, test, *args], capsys)
    assert code == 2 and out == ""
    assert words in err and "Traceback" not in err


def test_missing_run_and_steps(gpu_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["diff", str(tmp_path / "nowhere"), str(gpu_run)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(["diff", str(gpu_run), str(gpu_run), "--per", "step"], capsys)
    assert code == 2 and "no steps to compare per step" in err
    code, out, _ = run_cli(["diff", str(gpu_run), str(gpu_run)], capsys)
    assert code == 0 and "whole-run totals" in out


def test_help_states_the_rule(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["diff", "--help"], capsys)
    assert code == 0
    assert "time in B > time in A x (1 + PCT/100)" in out and "--min-time" in out and "Exit status" in out


@pytest.fixture(scope="module")
def energy_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Host steps drawing a constant 100 W (A) and 150 W (B) on one GPU, and one without power."""
    folder = tmp_path_factory.mktemp("energy")
    runs = {name: profile_steps(folder / name) for name in ("a", "b", "cpu")}
    add_power(runs["a"], lambda t: (100.0,))
    add_power(runs["b"], lambda t: (150.0,))
    return {name: str(path) for name, path in runs.items()}


def mean_step_s(run: str) -> float:
    steps = step_report(dlprof.load(run)).steps
    return float(steps[steps["status"] == StepStatus.COUNTED]["dur_ns"].mean()) / 1e9


def test_energy_and_cost_per_step_a_to_b(energy_runs: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    a, b = energy_runs["a"], energy_runs["b"]
    code, out, _ = run_cli(["diff", a, b, "--kind", "region", "-f", "json", "--price-per-hour", "3.6"], capsys)
    assert code == 0
    found = json.loads(out)
    power_a, power_b = (step_power(step_energy(dlprof.load(run))) for run in (a, b))
    assert power_a is not None and power_b is not None
    energy = found["energy"]
    assert energy["joules_a"] == pytest.approx(power_a.joules) and energy["joules_b"] == pytest.approx(power_b.joules)
    # A constant draw: a step's joules are its watts times its time.
    assert energy["joules_a"] == pytest.approx(100.0 * mean_step_s(a), rel=1e-6)
    assert energy["joules_b"] == pytest.approx(150.0 * mean_step_s(b), rel=1e-6)
    assert (energy["watts_a"], energy["watts_b"], energy["watts_pct"]) == pytest.approx((100.0, 150.0, 50.0))
    assert energy["joules_pct"] == pytest.approx((power_b.joules / power_a.joules - 1) * 100)
    assert energy["steps_a"] == energy["steps_b"] == 5
    cost = found["cost"]
    assert cost["a"] == pytest.approx(mean_step_s(a) / 1000) and cost["b"] == pytest.approx(mean_step_s(b) / 1000)
    assert found["rows"][0]["name"] == TOTAL_NAME
    code, out, _ = run_cli(["diff", a, b, "--kind", "region"], capsys)
    pct = f"{energy['joules_pct']:+.1f}%"
    assert (f"energy per counted step: {energy['joules_a']:.3f} J -> {energy['joules_b']:.3f} J ({pct}); "
            "power 100.0 W -> 150.0 W (+50.0%)") in out
    assert "cost per counted step" not in out


def test_energy_lacking_in_one_run_or_both(energy_runs: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    a, cpu = energy_runs["a"], energy_runs["cpu"]
    code, out, _ = run_cli(["diff", a, cpu, "--kind", "region"], capsys)
    assert code == 0
    assert "energy: not recorded in B; A: " in out
    code, out, _ = run_cli(["diff", cpu, a, "--kind", "region", "-f", "json"], capsys)
    energy = json.loads(out)["energy"]
    assert energy["joules_a"] is None and energy["watts_b"] == pytest.approx(100.0) and energy["joules_pct"] is None
    code, out, _ = run_cli(["diff", cpu, cpu, "--kind", "region", "--price-per-hour", "2"], capsys)
    assert "energy" not in out and "cost per counted step at 2 an hour: " in out
    code, out, _ = run_cli(["diff", cpu, cpu, "--kind", "region", "-f", "json"], capsys)
    assert json.loads(out)["energy"] is None and json.loads(out)["cost"] is None
