"""``dlprof ranks`` and ``dlprof top --rank/--per-rank``: tables, CSV and JSON, thresholds and
one-line errors, in-process and as the installed program, on recorded traces of two NCCL ranks
imported into one run, on two identical ranks, and on a hand-built empty run."""

from __future__ import annotations

import csv
import io
import json
import subprocess
from pathlib import Path

import pytest

import dlprof
from dlprof.analysis.aggregate import PER_RANK_COLUMNS, default_sort, top
from dlprof.analysis.ranks import STEP_COLUMNS, SUMMARY_COLUMNS, rank_steps, rank_summary, stragglers
from dlprof.cli.main import main
from dlprof.importers.trace_file import import_traces
from dlprof.keys import RunStatus
from dlprof.store.manifest import Manifest
from dlprof.store.writer import RankWriter
from tests.conftest import KINETO_TRACES, dlprof_program


@pytest.fixture(scope="module")
def nccl_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Ranks 0 and 1 of a recorded NCCL job, two steps each; rank 1 reached a collective late."""
    run_dir = tmp_path_factory.mktemp("ranks-cli") / "nccl"
    import_traces([KINETO_TRACES / "timeline_analysis" / "sampled_rank-0.json.gz",
                   KINETO_TRACES / "trace_filter" / "sampled_rank-1.json.gz"], run_dir)
    return run_dir


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_summary_then_stragglers(nccl_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # --wide: every column (at 80 columns the lesser ones are hidden).
    code, out, err = run_cli(["ranks", str(nccl_run), "--wide"], capsys)
    assert code == 0 and err == ""
    assert "per rank (overlap" in out and "stragglers (held the others up over 10%" in out
    for header in ("Rank", "On", "Step median (ms)", "Compute %", "Comm %", "Overlap %", "Idle %",
                   "Straggler steps", "Arrival lag %", "Latest arrival"):
        assert header in out
    run = dlprof.load(nccl_run)
    summary = rank_summary(run)
    lines = out.splitlines()
    for row in summary.to_dict("records"):
        shown = next(line.split() for line in lines if line.split()[:2] == [str(row["rank"]), row["measured_on"]])
        assert f"{row['comm_pct']:.2f}" in shown and f"{row['overlap_pct']:.2f}" in shown
    late = stragglers(run)
    assert len(late) >= 1  # the recorded job has one at the default threshold
    section = out[out.index("stragglers (held"):]
    for row in late.to_dict("records"):
        shown = next(line for line in section.splitlines() if line.split()[:2] == [row["step"], str(row["rank"])])
        assert f"{row['arrival_lag_pct']:.2f}" in shown.split()
        assert f"#{row['late_occurrence']}" in shown


def test_threshold(nccl_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = dlprof.load(nccl_run)
    worst = float(rank_summary(run)["max_lag_pct"].max())
    code, out, _ = run_cli(["ranks", str(nccl_run), "--threshold", f"{worst + 1:.1f}"], capsys)
    assert code == 0 and "No stragglers" in out and "2 steps, 2 ranks" in out
    code, out, _ = run_cli(["ranks", str(nccl_run), "--threshold", "0", "--format", "json"], capsys)
    assert code == 0 and [r["straggler_steps"] for r in json.loads(out)] == rank_summary(run, 0.0)[
        "straggler_steps"].tolist()
    code, _, err = run_cli(["ranks", str(nccl_run), "--threshold", "-5"], capsys)
    assert code == 2 and "--threshold" in err and "Traceback" not in err


def test_json_and_csv_are_the_analysis(nccl_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = dlprof.load(nccl_run)
    code, out, _ = run_cli(["ranks", str(nccl_run), "--format", "json"], capsys)
    assert code == 0
    rows = json.loads(out)
    expected = rank_summary(run).to_dict("records")
    assert [list(r) for r in rows] == [SUMMARY_COLUMNS] * len(expected)
    for got, want in zip(rows, expected, strict=True):
        assert got["comm_ns"] == want["comm_ns"] and got["overlap_pct"] == pytest.approx(want["overlap_pct"])
    code, out, _ = run_cli(["ranks", str(nccl_run), "--by-step", "--format", "csv"], capsys)
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    steps = rank_steps(run)
    assert list(rows[0]) == STEP_COLUMNS and len(rows) == len(steps)
    assert [r["straggler"] for r in rows] == [str(flag) for flag in steps["straggler"]]
    assert [int(r["idle_ns"]) for r in rows] == steps["idle_ns"].tolist()


def test_by_step_table(nccl_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["ranks", str(nccl_run), "--by-step"], capsys)
    assert code == 0 and "per rank and step" in out
    steps = rank_steps(dlprof.load(nccl_run))
    rows = [line.split() for line in out.splitlines() if "ProfilerStep#" in line]
    assert [(int(r[0]), r[2]) for r in rows] == list(zip(steps["rank"], steps["step"], strict=True))
    assert [r[-1] == "yes" for r in rows] == steps["straggler"].tolist()


def test_identical_ranks(two_rank_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["ranks", str(two_rank_run), "--wide"], capsys)
    assert code == 0 and "No stragglers" in out and "0 steps, 2 ranks" in out
    # No steps: the step times are missing, shown as "-".
    rows = [line.split() for line in out.splitlines() if line.split()[:2] in (["0", "cuda:0"], ["1", "cuda:0"])]
    assert len(rows) == 2 and rows[0][1:] == rows[1][1:] and rows[0][3:5] == ["-", "-"]


def test_a_run_without_slices(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    Manifest(name="empty", command=["python"], status=RunStatus.COMPLETE).write(tmp_path)
    RankWriter(tmp_path, 0).compact()
    code, out, err = run_cli(["ranks", str(tmp_path)], capsys)
    assert code == 2 and out == ""
    assert err.strip() == f"dlprof: error: {tmp_path}: the run holds no slices (complete)"


def test_top_rank_and_per_rank(nccl_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = dlprof.load(nccl_run)
    code, out, _ = run_cli(["top", str(nccl_run), "--rank", "1", "--limit", "0", "--format", "json"], capsys)
    assert code == 0
    one = top(run, limit=None, rank=1, by=default_sort(run))  # device time: the run has GPU work
    assert [(r["name"], r["total_ns"]) for r in json.loads(out)] == list(
        zip(one["name"], one["total_ns"], strict=True))
    code, out, _ = run_cli(["top", str(nccl_run), "--per-rank", "--format", "json"], capsys)
    rows = json.loads(out)
    assert code == 0 and list(rows[0])[-len(PER_RANK_COLUMNS):] == PER_RANK_COLUMNS
    expected = top(run, per_rank=True, by=default_sort(run))
    assert [r["max_rank"] for r in rows] == expected["max_rank"].tolist()
    code, out, _ = run_cli(["top", str(nccl_run), "--per-rank", "--wide"], capsys)
    for header in ("Rank min (ms)", "Rank median (ms)", "Rank max (ms)", "Max rank"):
        assert header in out
    code, _, err = run_cli(["top", str(nccl_run), "--rank", "5"], capsys)
    assert code == 2 and err.strip() == f"dlprof: error: {nccl_run}: no rank 5; this run has ranks: 0, 1"
    code, _, err = run_cli(["top", str(nccl_run), "--per-rank", "--group-by", "type"], capsys)
    assert code == 2 and "--per-rank" in err


def test_as_the_installed_program(nccl_run: Path) -> None:
    done = subprocess.run([*dlprof_program(), "ranks", str(nccl_run), "--format", "json"],
                          capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [r["rank"] for r in json.loads(done.stdout)] == [0, 1]
    helped = subprocess.run([*dlprof_program(), "ranks", "--help"], capture_output=True, text=True,
                            check=False, timeout=120)
    assert helped.returncode == 0 and "Examples:" in helped.stdout
    assert "dlprof ranks RUN --threshold 5" in helped.stdout
    missing = subprocess.run([*dlprof_program(), "ranks", str(nccl_run.parent / "nope")],
                             capture_output=True, text=True, check=False, timeout=120)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
