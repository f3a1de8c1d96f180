"""``dlprof gpu``: its tables, CSV and JSON, the rank filter, and one-line errors, in-process and
as a real program, on recorded GPU traces imported into run directories."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

import dlprof
from dlprof.analysis.gpu import ALL, BREAKDOWN_COLUMNS, gpu_breakdown
from dlprof.cli.main import main
from dlprof.keys import RunStatus
from dlprof.store.manifest import Manifest
from dlprof.store.writer import RankWriter
from tests.builders import simple_add_trace, write_imported_run
from tests.conftest import KINETO_TRACES


def only_trace(folder: str) -> Path:
    (found,) = (KINETO_TRACES / folder).glob("*.json.gz")
    return found


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A run without steps (A100), one with two steps (production model), two ranks, no GPU."""
    parent = tmp_path_factory.mktemp("gpu-cli")
    return {
        "simple_add": write_imported_run(parent / "simple_add", simple_add_trace(), (0,)),
        "steps": write_imported_run(parent / "steps", only_trace("timeline_analysis"), (0,)),
        "ranks": write_imported_run(parent / "ranks", simple_add_trace(), (0, 1)),
        "cpu_only": write_imported_run(parent / "cpu_only", only_trace("cpu_only"), (0,)),
    }


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_tables_for_a_person(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["gpu", str(runs["steps"])], capsys)
    assert code == 0 and err == ""
    assert "GPU time per step" in out and "kernel launch cost" in out and "kernel queueing" in out
    for word in ("ProfilerStep#551", "ProfilerStep#552", "cuda:0", "Busy %", "Kernel %", "p95 (ms)"):
        assert word in out
    row = next(line for line in out.splitlines() if "ProfilerStep#551" in line)
    expected = gpu_breakdown(dlprof.load(runs["steps"])).iloc[0]
    assert f"{expected['busy_pct']:.2f}" in row.split()
    assert "Rank" not in out  # one rank: no rank column


def test_json_is_the_analysis(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["gpu", str(runs["steps"]), "--format", "json"], capsys)
    assert code == 0
    rows = json.loads(out)
    expected = gpu_breakdown(dlprof.load(runs["steps"]))
    assert [list(r) for r in rows] == [BREAKDOWN_COLUMNS] * len(expected)
    assert [r["step"] for r in rows] == ["ProfilerStep#551", "ProfilerStep#552", ALL]
    for got, want in zip(rows, expected.to_dict("records"), strict=True):
        assert got["busy_ns"] == want["busy_ns"] and got["kernels"] == want["kernels"]
        assert got["delay_p95_ns"] == pytest.approx(want["delay_p95_ns"])


def test_csv_has_every_column(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["gpu", str(runs["simple_add"]), "--format", "csv"], capsys)
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert list(rows[0]) == BREAKDOWN_COLUMNS
    assert [r["step"] for r in rows] == [ALL] and rows[0]["kernels"] == "79"


def test_rank_filter(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["gpu", str(runs["ranks"]), "--format", "json"], capsys)
    assert code == 0 and [r["rank"] for r in json.loads(out)] == [0, 1]
    code, out, _ = run_cli(["gpu", str(runs["ranks"]), "--rank", "1", "--format", "json"], capsys)
    assert code == 0 and [r["rank"] for r in json.loads(out)] == [1]
    code, out, _ = run_cli(["gpu", str(runs["ranks"])], capsys)
    assert "Rank" in out  # several ranks: the rank is shown
    code, _, err = run_cli(["gpu", str(runs["ranks"]), "--rank", "5"], capsys)
    assert code == 2 and err.strip() == f"dlprof: error: {runs['ranks']}: no rank 5; this run has ranks: 0, 1"


def test_a_run_without_device_activity(runs: dict[str, Path], tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["gpu", str(runs["cpu_only"])], capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "no GPU activity" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    Manifest(name="empty", command=["python"], status=RunStatus.COMPLETE).write(empty)
    RankWriter(empty, 0).compact()
    code, _, err = run_cli(["gpu", str(empty)], capsys)
    assert code == 2 and "no GPU activity" in err


def test_as_a_real_program(runs: dict[str, Path]) -> None:
    done = subprocess.run([sys.executable, "-m", "dlprof", "gpu", str(runs["simple_add"])],
                          capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "cuda:0" in done.stdout and ALL in done.stdout
    helped = subprocess.run([sys.executable, "-m", "dlprof", "gpu", "--help"], capture_output=True,
                            text=True, check=False, timeout=120)
    assert helped.returncode == 0 and "Examples:" in helped.stdout and "dlprof gpu RUN --rank 1" in helped.stdout
    failed = subprocess.run([sys.executable, "-m", "dlprof", "gpu", str(runs["cpu_only"])],
                            capture_output=True, text=True, check=False, timeout=120)
    assert failed.returncode == 2 and "Traceback" not in failed.stderr
    assert "no GPU activity" in failed.stderr
