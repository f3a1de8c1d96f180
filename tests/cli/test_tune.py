"""``dlprof tune``: in-process through main(), on real A100 kernel traces and on a run with
counters; once as the installed program."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from dlprof.cli.main import main
from tests.builders import COUNTED, cupti_profiler_trace, import_trace_run, kineto_trace, write_counter_run
from tests.conftest import dlprof_program
from tests.references import expected_scores


@pytest.fixture(scope="module")
def simple_add(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return import_trace_run(tmp_path_factory.mktemp("runs") / "add", kineto_trace("critical_path/simple_add"))


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_table_with_reasons(simple_add: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["tune", str(simple_add), "--limit", "3"], capsys)
    assert code == 0
    assert "no per-kernel counters in this run: ranked by exclusive time x launch-configuration" in err
    assert "score = exclusive ms x launch-configuration signals" in out
    assert "- 252 registers per thread (> 64): registers alone cap occupancy at 12%" in out
    assert "- theoretical occupancy 12% (< 50%, limited by registers): too few warps" in out
    assert "- estimated occupancy 25% (< 50%): too few warps to hide latency" in out
    # Three candidates, each with its rank above its reasons.
    assert [line.split()[0] for line in out.splitlines() if line[:4].strip().isdigit()] == ["1", "2", "3"]


def test_json_ranking(simple_add: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["tune", str(simple_add), "--format", "json", "-n", "0"], capsys)
    assert code == 0
    rows = json.loads(out)
    want = expected_scores(kineto_trace("critical_path/simple_add"))
    assert [row["name"] for row in rows] == sorted(want, key=lambda n: (-want[n], n))
    assert [row["rank"] for row in rows] == list(range(1, len(rows) + 1))
    for row in rows:
        assert row["score"] == pytest.approx(want[row["name"]], rel=1e-6)
        assert row["reasons"] and all(isinstance(r, str) for r in row["reasons"])
        assert len(row["rules"]) == len(row["reasons"])


def test_csv_joins_reasons(simple_add: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["tune", str(simple_add), "--format", "csv", "-n", "1"], capsys)
    assert code == 0
    header, first = out.strip().splitlines()
    assert header == "rank,name,calls,self_ns,total_ns,score,reasons,rules"
    assert first.startswith("1,ampere_sgemm_32x32_sliced1x4_tn,")
    assert "too few warps to hide latency; 86 registers" in first
    assert first.endswith("low-occupancy register-pressure")


def test_counters_are_preferred(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_counter_run(tmp_path / "counted", COUNTED)
    code, out, err = run_cli(["tune", str(run), "--format", "json"], capsys)
    assert code == 0 and err == ""
    rows = json.loads(out)
    assert [row["name"] for row in rows] == ["gemm", "relu", "copy"]
    assert rows[0]["rules"] == ["warps-per-instruction", "global-loads-per-instruction"]


def test_a_run_without_kernels(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = import_trace_run(tmp_path / "cupti", cupti_profiler_trace())
    code, out, err = run_cli(["tune", str(run)], capsys)
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert "no kernels to rank" in line and "cuda_profiler_range slices carry counters" in line


def test_help_as_the_installed_program() -> None:
    done = subprocess.run([*dlprof_program(), "tune", "--help"], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0
    assert "Examples:" in done.stdout and "TAU" in done.stdout
