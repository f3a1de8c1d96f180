"""``dlprof metrics``: in-process through main(), on a real counter trace, on runs whose counters
the test sets, on a run without counters, and once as the installed program."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from dlprof.cli.main import main
from dlprof.importers.kineto_rows import UNNAMED_RANGE
from tests.builders import (
    HAND_BUILT,
    cupti_profiler_trace,
    import_trace_run,
    simple_add_trace,
    write_counter_run,
)
from tests.conftest import dlprof_program
from tests.references import expected, raw_flops, raw_ranges


@pytest.fixture(scope="module")
def cupti_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return import_trace_run(tmp_path_factory.mktemp("runs") / "cupti", cupti_profiler_trace())


@pytest.fixture(scope="module")
def counter_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_counter_run(tmp_path_factory.mktemp("runs") / "counters", HAND_BUILT)


@pytest.fixture(scope="module")
def plain_gpu_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real A100 kernels with launch configurations, but no counters."""
    return import_trace_run(tmp_path_factory.mktemp("runs") / "gpu", simple_add_trace())


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_flops_per_kernel_name_as_json(cupti_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["metrics", str(cupti_run), "--format", "json", "--limit", "0"], capsys)
    assert code == 0
    rows = json.loads(out)
    by_name: dict[str, float] = {}
    for event in raw_ranges():
        by_name[event["name"]] = by_name.get(event["name"], 0.0) + raw_flops(event)
    # A range Kineto found no kernel name for is "__missing__" in the file: not a kernel's name.
    assert "__missing__" not in {r["name"] for r in rows} and UNNAMED_RANGE in by_name
    assert {r["name"] for r in rows} == set(by_name)
    for row in rows:
        assert row["flop_count"] == pytest.approx(by_name[row["name"]], rel=1e-12)
        assert set(row) == {"name", "calls", "flop_count"}
    # The built-ins this trace's counters cannot give are named on stderr, once.
    assert "not computed for this run: ipc" in err and "flop_rate" in err
    assert len(err.strip().splitlines()) == 1


def test_per_slice_table(cupti_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["metrics", str(cupti_run), "--group-by", "slice", "-n", "0",
                            "--metric", "flop_count", "--format", "csv"], capsys)
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[0] == "id,name,kind,flop_count"
    assert len(lines) == 1 + 77


def test_table_for_a_person(counter_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["metrics", str(counter_run)], capsys)
    assert code == 0
    assert "derived metrics per name" in out
    for header in ("ipc (inst/cycle)", "warps_per_inst (warps/inst)", "achieved_occupancy (%)",
                   "flop_rate (FLOP/s)", "arithmetic_intensity (FLOP/byte)"):
        assert header in out
    gemm = next(line for line in out.splitlines() if line.strip().startswith("gemm"))
    assert " 5 " in f"{gemm} "  # ipc of gemm: 10000 instructions over 2000 cycles


def test_user_formulas_in_legacy_and_perfworks_names(counter_run: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["metrics", str(counter_run), "--format", "json",
                            "-m", "legacy=gld_request / inst_executed",
                            "-m", "modern=cupti:smsp__inst_executed_op_global_ld.sum"
                                  " / smsp__inst_executed.sum",
                            "-m", "gld_per_inst"], capsys)
    assert code == 0
    rows = {r["name"]: r for r in json.loads(out)}
    for name in ("gemm", "relu"):
        want = expected([k for k in HAND_BUILT if k.name == name])["gld_per_inst"]
        assert rows[name]["legacy"] == rows[name]["modern"] == pytest.approx(want, rel=1e-12)
        assert rows[name]["gld_per_inst"] == rows[name]["legacy"]
        assert set(rows[name]) == {"name", "calls", "legacy", "modern", "gld_per_inst"}


def test_user_formula_header_shows_the_formula(counter_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["metrics", str(counter_run), "-m", "x_ns=inst_executed / time"], capsys)
    assert code == 0
    assert "x_ns (= inst_executed / time)" in out


def test_list_says_what_this_run_has(cupti_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["metrics", str(cupti_run), "--list"], capsys)
    assert code == 0
    assert "ipc [inst/cycle]: instructions executed per active SM cycle" in out
    assert "    = inst_executed / active_cycles" in out
    assert "    counters: smsp__inst_executed.sum, sm__cycles_active.sum" in out
    assert out.count("available in this run") == 1  # flop_count only
    assert "not available: time is unknown: cuda_profiler_range durations are placeholders" in out
    code, out, _ = run_cli(["metrics", str(cupti_run), "--list", "--format", "json"], capsys)
    listed = {row["name"]: row for row in json.loads(out)}
    assert [n for n, row in listed.items() if row["available"]] == ["flop_count"]
    assert listed["warps_per_inst"]["formula"] == "active_warps / inst_executed"


def test_a_run_without_counters_says_which_are_missing(plain_gpu_run: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["metrics", str(plain_gpu_run)], capsys)
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith("dlprof: error: ") and "it holds no counter values" in line
    for counter in ("smsp__inst_executed.sum", "sm__cycles_active.sum", "sm__warps_active.sum",
                    "smsp__inst_executed_op_global_ld.sum", "dram__bytes.sum"):
        assert counter in line


def test_formulas_over_time_and_flops_need_no_counters(plain_gpu_run: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["metrics", str(plain_gpu_run), "--kind", "kernel", "-n", "0",
                            "-m", "us=time * 1e6", "--format", "json"], capsys)
    assert code == 0
    rows = json.loads(out)
    assert rows and all(row["us"] > 0 for row in rows)


@pytest.mark.parametrize(
    ("option", "words"),
    [
        ("x=__import__('os')", "calls not allowed; use numbers, metric names"),
        ("x=foo / inst_executed", "--metric x: this run has no counter foo"),
        ("x=1 // 2", "operator // not allowed"),
        ("nosuch", "no such built-in"),
        ("ipc=1", "the name is taken"),
    ],
)
def test_bad_metrics_are_one_line_errors(counter_run: Path, option: str, words: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["metrics", str(counter_run), "--metric", option], capsys)
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert words in line


def test_help_as_the_installed_program() -> None:
    done = subprocess.run([*dlprof_program(), "metrics", "--help"], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0
    assert "Examples:" in done.stdout and "--metric" in done.stdout
