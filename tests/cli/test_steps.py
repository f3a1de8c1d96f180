"""``dlprof steps``, ``dlprof top --kind step`` and the report's Steps section on a real DataLoader
loop; one-line errors; data-wait slices surviving an export to Kineto's layout and back."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

import dlprof
from dlprof.analysis.report_data import report_data
from dlprof.analysis.steps import STEP_COLUMNS, StepPart, StepStatus, step_report
from dlprof.cli.main import main
from dlprof.importers.trace_file import import_traces
from dlprof.keys import Kind

pytestmark = pytest.mark.torch


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_tables_name_the_steps_left_out_and_why(dataloader_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, printed, err = run_cli(["steps", str(dataloader_run), "-n", "3"], capsys)
    assert code == 0, err
    out = " ".join(printed.split())  # a title longer than its table wraps
    for title in ("step times over the counted steps", "time per counted step by part",
                  "steps left out of the statistics", "the 3 slowest counted steps"):
        assert title in out
    assert "warm-up: the program's first step" in out
    assert "partial: open when profiling stopped" in out
    assert max(len(line) for line in printed.splitlines()) <= 80
    code, printed, err = run_cli(["steps", str(dataloader_run), "-n", "3", "--wide"], capsys)
    out = " ".join(printed.split())
    for header in ("Median", "p90", "p99", "Std", "Data wait", "Forward", "Backward", "Optimizer", "Other"):
        assert header in out


def test_csv_lists_every_step_with_its_status(dataloader_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["steps", str(dataloader_run), "--format", "csv", "-n", "0"], capsys)
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert list(rows[0]) == STEP_COLUMNS
    assert [r["status"] for r in rows] == [StepStatus.WARMUP, *[StepStatus.COUNTED] * 5, StepStatus.PARTIAL]
    for row in rows:
        assert sum(int(row[c]) for c in STEP_COLUMNS if c.endswith("_ns") and c not in ("start_ns", "dur_ns")) \
            == int(row["dur_ns"])


def test_json_holds_statistics_breakdown_and_the_slowest(dataloader_run: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["steps", str(dataloader_run), "-f", "json", "-n", "2", "--rank", "0"], capsys)
    assert code == 0
    document = json.loads(out)
    assert document["statistics"][0]["steps"] == 5
    assert [part["part"] for part in document["breakdown"]] == [
        "data_wait", "forward", "backward", "optimizer", "communication", "compile", "profiler", "other"]
    assert document["device_breakdown"] == []  # no GPU work
    slowest = document["steps"]
    assert len(slowest) == 2 and slowest[0]["dur_ns"] >= slowest[1]["dur_ns"]
    assert {step["status"] for step in slowest} == {StepStatus.COUNTED}


def test_bad_input_is_one_line_and_status_2(dataloader_run: Path, gpu_run: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["steps", str(dataloader_run), "--rank", "7"], capsys)
    assert (code, out) == (2, "") and err.startswith("dlprof: error:") and err.count("\n") == 1
    code, out, err = run_cli(["steps", str(gpu_run)], capsys)  # an imported trace with no steps
    assert code == 2 and "has no steps" in err and err.count("\n") == 1


def test_top_marks_the_partial_and_warm_up_steps(dataloader_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["top", str(dataloader_run), "--kind", "step", "-n", "0"], capsys)
    assert code == 0
    assert "ProfilerStep#6 [partial]" in out and "ProfilerStep#0 [warm-up]" in out
    assert "ProfilerStep#3 [" not in out


def test_the_report_counts_steps_as_steps_does(dataloader_run: Path) -> None:
    steps = report_data(dlprof.load(dataloader_run))["steps"]
    assert [row[4] for row in steps["rows"]] == [StepStatus.WARMUP, *[StepStatus.COUNTED] * 5, StepStatus.PARTIAL]
    statistics = dict(zip(steps["statistics"]["columns"], steps["statistics"]["rows"][0], strict=True))
    assert statistics["steps"] == 5 and statistics["partial"] == 1
    assert len(steps["breakdown"]["rows"]) == len(StepPart) == 8  # compile and profiler among them


def test_data_wait_survives_an_export_and_import(dataloader_run: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.json"
    code, _, err = run_cli(["export", str(dataloader_run), "-o", str(trace)], capsys)
    assert code == 0, err
    events = json.loads(trace.read_text())["traceEvents"]
    waits = [e for e in events if e.get("name", "").startswith("enumerate(DataLoader)#")]
    assert waits and {e["cat"] for e in waits} == {"user_annotation"}
    import_traces(sorted(tmp_path.glob("trace*.json")), tmp_path / "again")
    slices = dlprof.load(tmp_path / "again").slices
    again = slices[slices["name"].str.startswith("enumerate(DataLoader)#")]
    assert len(again) == len(waits) and set(again["kind"]) == {Kind.DATA_WAIT}


def test_within_keeps_the_steps_inside_a_region(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Train against eval: two epochs of 4 training steps (5 ms of work) and 3 evaluation steps
    (25 ms); --within picks each side's steps, their statuses as among all. Each region begins a
    moment into the step its first step call ends (that step began at the call before, in the
    other region): with 3 steps the region outlives that step by more than it lies in it, so
    nesting holds the step in the region rather than cutting the region at the step's end."""
    import time

    def work(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    out = tmp_path / "run"
    with dlprof.profile(out=out, collectors=()) as prof:
        for _ in range(2):
            with dlprof.region("train"):
                for _ in range(4):
                    work(0.005)
                    prof.step()
            with dlprof.region("eval"):
                for _ in range(3):
                    work(0.025)
                    prof.step()
    run = dlprof.load(out)
    every = step_report(run).steps
    train, evaluation = step_report(run, within="train").steps, step_report(run, within="eval").steps
    assert len(train) == 8 and len(evaluation) == 6
    assert set(train["step"]) | set(evaluation["step"]) <= set(every["step"])
    assert evaluation["dur_ns"].median() > train.loc[train["status"] == "counted", "dur_ns"].median()
    assert train.iloc[0]["status"] == "warm-up", "statuses as among all the steps"
    code, printed, _ = run_cli(["steps", str(out), "--within", "eval", "-f", "csv"], capsys)
    assert code == 0 and printed.count("\n") == 1 + 6
    code, _, err = run_cli(["steps", str(out), "--within", "nowhere"], capsys)
    assert code == 2 and "no step lies inside a slice named 'nowhere'" in err and err.count("\n") == 1
