"""``dlprof pprof``: TAU pprof's text layout, in-process and as a real program, and its errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dlprof.cli.main import main
from dlprof.viewers.tau_profile_text import HEADER, RULE, format_row, tau_time
from tests.builders import MS, NESTED, SEVERAL_TRACKS, Span, write_span_run


@pytest.fixture()
def program() -> Path:
    """The installed ``dlprof`` script beside this Python, as a user would run it."""
    script = Path(sys.executable).parent / "dlprof"
    assert script.is_file(), f"{script} missing: install the package (pip install -e .)"
    return script


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    ("usec", "text"),
    [
        (563.0, "       0.563"),  # below a millisecond: three significant digits
        (12.34, "      0.0123"),
        (0.0, "           0"),
        (45_000.0, "          45"),  # whole milliseconds, truncated
        (999_999.0, "         999"),
        (1_027_419.0, "       1,027"),  # seconds,milliseconds
        (65_432_100.0, "    1:05.432"),  # minutes
        (3_723_004_000.0, " 1:02:03.004"),  # hours
    ],
)
def test_times_are_formatted_as_tau_does(usec: float, text: str) -> None:
    assert tau_time(usec) == text
    assert len(text) == 12


def test_rows_line_up_under_the_header() -> None:
    row = format_row(66.66, 45 * MS, 100 * MS, 1, 3, 100 * MS, "main")
    assert row == " 66.7           45          100           1           3     100000 main"
    header, units = HEADER.splitlines()
    # Each number ends in the column where its heading ends; the name starts under "Name".
    ends = [header.index("Exclusive") + 9, header.index("Inclusive") + 9,
            header.index("#Call") + 5, header.index("#Subrs") + 6, header.rindex("Inclusive") + 9]
    assert ends == [18, 31, 43, 55, 66]
    for end in ends:
        assert row[end - 1] != " " and row[end] == " "
    assert row.index("main") == header.index("Name")
    assert units.rstrip().endswith("usec/call")
    assert format_row(0.0, 0, 0, 2, 0, 0, "idle") == (
        "  0.0            0            0           2           0          0 idle"
    )
    assert format_row(50.0, MS, 2 * MS, 0.5, 0.25, 4 * MS, "mean").split()[3:5] == ["0.5", "0.25"]


def test_prints_one_tau_block_for_the_real_cnn_run(
    cnn_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(["pprof", str(cnn_run), "-n", "0", "--wide"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"Reading run {cnn_run}")
    start = lines.index("NODE 0;CONTEXT 0;THREAD 0:")
    assert lines[start + 1].startswith("(rank 0, main: pid ") and ", cpu; wall " in lines[start + 1]
    assert lines[start + 2 : start + 6] == [RULE, *HEADER.splitlines(), RULE]
    assert "FUNCTION SUMMARY" not in out  # one thread: TAU prints no summary
    body = lines[start + 6 :]
    names = [line[67:] for line in body]
    assert "train_step" in names and "aten::conv2d" in names
    # Rows come by inclusive time: the %Time column never increases down the table.
    percents = [float(line[:5]) for line in body]
    assert percents == sorted(percents, reverse=True)
    assert percents[0] <= 100.0


def test_hand_built_run_prints_tau_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_span_run(tmp_path / "nested", NESTED)
    code, out, _ = run_cli(["pprof", str(run), "--wide"], capsys)
    assert code == 0
    assert out.splitlines()[-5:] == [
        " 66.7           45          100           1           3     100000 main",
        " 33.3           40           50           2           1      25000 a",
        " 20.0           30           30           1           0      30000 late",
        "  6.7           10           10           1           0      10000 b",
        "  3.3            5            5           1           0       5000 c",
    ]
    assert "(rank 0, pid 100, tid 1, cpu; wall 150.000 ms)" in out


def test_several_threads_get_a_block_each_then_total_and_mean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = write_span_run(tmp_path / "tracks", SEVERAL_TRACKS)
    code, out, _ = run_cli(["pprof", str(run), "--wide"], capsys)
    assert code == 0
    headers = [line for line in out.splitlines() if line.startswith(("NODE", "FUNCTION"))]
    assert headers == [
        "NODE 0;CONTEXT 0;THREAD 0:",
        "NODE 0;CONTEXT 0;THREAD 1:",
        "NODE 0;CONTEXT 0;THREAD 2:",
        "NODE 1;CONTEXT 0;THREAD 0:",
        "FUNCTION SUMMARY (total):",
        "FUNCTION SUMMARY (mean):",
    ]
    assert "(rank 0, pid 100, stream 7, cuda:0; wall 4.000 ms)" in out
    mean = out.split("FUNCTION SUMMARY (mean):")[1].splitlines()
    # x: 90 ms over 4 threads, 3 calls over 4 threads, as TAU's mean prints them.
    assert " 78.9           22           22        0.75           0      30000 x" in mean


def test_rank_option_keeps_one_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_span_run(tmp_path / "tracks", SEVERAL_TRACKS)
    code, out, _ = run_cli(["pprof", str(run), "--rank", "1"], capsys)
    assert code == 0
    assert "NODE 1;CONTEXT 0;THREAD 0:" in out
    assert "NODE 0;" not in out and "FUNCTION SUMMARY" not in out


def test_unknown_rank_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = write_span_run(tmp_path / "tracks", SEVERAL_TRACKS)
    code, out, err = run_cli(["pprof", str(run), "--rank", "9"], capsys)
    assert code == 2 and out == ""
    assert err == f"dlprof: error: {run}: no rank 9; this run has ranks: 0, 1\n"


def test_limit_folds_the_rest_into_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = write_span_run(tmp_path / "nested", NESTED)
    code, out, _ = run_cli(["pprof", str(run), "--limit", "2", "--wide"], capsys)
    assert code == 0
    body = out.split(RULE + "\n")[-1].splitlines()
    assert [line[67:] for line in body] == ["main", "a", "-others-"]
    assert body[-1] == " 30.0           45           45           3           0      15000 -others-"


def test_a_run_without_slices_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = write_span_run(tmp_path / "empty", [])
    code, _, err = run_cli(["pprof", str(run)], capsys)
    assert code == 2
    assert err == f"dlprof: error: {run}: the run holds no slices (complete)\n"


def test_a_directory_that_is_not_a_run_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(["pprof", str(tmp_path)], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("dlprof: error: ")
    assert "not a dlprof run" in err and "Traceback" not in err


def test_as_a_program_a_missing_run_exits_2_without_traceback(
    tmp_path: Path, program: Path
) -> None:
    missing = tmp_path / "notarun"
    done = subprocess.run(
        [str(program), "pprof", str(missing)], check=False, capture_output=True, text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == f"dlprof: error: {missing}: no such run directory\n"


def test_as_a_program_prints_the_profile(tmp_path: Path, program: Path) -> None:
    run = write_span_run(tmp_path / "nested", [Span("only", 0, 2)])
    done = subprocess.run(
        [str(program), "pprof", str(run)], check=False, capture_output=True, text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == (
        "100.0            2            2           1           0       2000 only"
    )


def test_help_shows_examples(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["pprof", "--help"], capsys)
    assert code == 0
    assert "Examples:" in out and "dlprof pprof RUN --rank 1" in out


def test_others_on_the_h200_run_counts_each_nested_slice_once(
        h200_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Folded layers nest inside one another: their plain sum read 129.7% of the main thread's
    wall time at -n 5; the time they cover is less than the thread's wall time."""
    code, out, err = run_cli(["pprof", str(h200_run), "-n", "5", "--format", "json"], capsys)
    assert code == 0, err
    rows = json.loads(out)
    others = [r for r in rows if r["name"] == "-others-"]
    assert others and all(0 <= r["time_pct"] <= 100 for r in others)
    assert all(r["inclusive_ns"] >= r["exclusive_ns"] for r in others)


def test_threads_are_named_by_what_ran_on_them(h200_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["pprof", str(h200_run), "-n", "3"], capsys)
    assert code == 0
    assert "(rank 0, main: pid 5137, tid 5137, cpu;" in out
    assert "(rank 0, autograd: pid 5137, tid 6494, cpu;" in out
    # torch's optimizer range on the GPU is no CPU thread.
    assert "(rank 0, GPU annotations, stream 7;" in out and "pid 0, tid 7, cpu" not in out
