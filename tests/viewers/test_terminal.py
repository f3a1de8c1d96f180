"""Tables for a person: they fit the terminal, show one time unit, and never pass an escape.

Every table command runs in-process on real runs at ``COLUMNS=80`` (captured, so piped, as a
user's ``| less`` is); a run profiled here names its regions with terminal escapes.
"""

from __future__ import annotations

import gzip
import io
import json
import re
from pathlib import Path

import pandas as pd
import pytest

import dlprof
from dlprof.cli.main import main
from dlprof.keys import NANOSECOND_COUNTERS
from dlprof.support.perf_event import EVENTS
from dlprof.viewers.fit import NAME_FLOOR, Column, fit_columns
from dlprof.viewers.names import short_name
from dlprof.viewers.screen import PIPED_WIDTH, printable, set_wide, table_width
from dlprof.viewers.terminal import render_table, time_unit
from tests.conftest import KINETO_TRACES

# Region names as a hostile program or trace could write them: set the window title, write the
# clipboard (OSC 52), clear the screen; and a C1 control (CSI) and DEL.
TITLE = "step\x1b]0;owned\x07"
CLIPBOARD = "load\x1b]52;c;cm0gLXJmIH4=\x07"
CLEAR = "clear\x1b[2J\x9b2J\x7f"
UNIT = re.compile(r"\((s|ms|us|ns)\)")


@pytest.fixture(autouse=True)
def _eighty_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")


@pytest.fixture(scope="module")
def escape_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run (no framework) whose regions carry escapes, with CPU counters where this
    machine can count them."""
    out = tmp_path_factory.mktemp("escapes") / "run"
    with dlprof.profile(out=out, collectors=("host",), counters=["task-clock", "page-faults"]) as prof:
        for _ in range(3):
            with dlprof.region(TITLE):
                with dlprof.region(CLIPBOARD):
                    bytearray(8 << 20)[::4096] = b"\1" * 2048
                with dlprof.region(CLEAR):
                    sum(range(100_000))
            prof.step()
    return out


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


def assert_fits(out: str, width: int = 80) -> None:
    too_long = [line for line in out.splitlines() if len(line) > width]
    assert not too_long, too_long
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]", out)


def header_line(out: str, first: str = "Name") -> str:
    return next(line for line in out.splitlines() if line.split()[:1] == [first])


def test_printable_shows_every_control_character() -> None:
    assert printable("a\x1b[2Jb\x07\x00\x7f\x9b\t\n") == "a␛[2Jb␇␀\u2421\ufffd␉␊"
    assert printable("aten::conv2d ✓ 畳み込み") == "aten::conv2d ✓ 畳み込み"


def test_width_comes_from_columns_then_the_terminal_then_80(monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    with (tmp_path / "file").open("w") as piped:
        assert table_width(piped) == 80
        monkeypatch.setenv("COLUMNS", "123")
        assert table_width(piped) == 123
        monkeypatch.setenv("COLUMNS", "wide")
        assert table_width(piped) == PIPED_WIDTH
        set_wide(True)
        try:
            assert table_width(piped) is None
        finally:
            set_wide(False)


def test_short_name_cuts_the_middle() -> None:
    name = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int, float)"
    # Parameters and template arguments go first, then the middle of what is left; a digest of
    # the whole name ends it.
    shortened = short_name(name, 40)
    assert len(shortened) == 40 and shortened.startswith("void at::native:")
    assert re.fullmatch(r".*<…>\(…\) ~[0-9a-f]{6}", shortened)
    # Inner template arguments go before outer ones.
    assert short_name(name, 90).startswith("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<…>>(…) ~")
    plain = "autograd::engine::evaluate_function: ConvolutionBackward0"
    shortened = short_name(plain, 30)
    assert len(shortened) == 30 and shortened.startswith("autograd::e") and "Backward0 ~" in shortened
    assert short_name(plain, len(plain)) == plain


def _recorded_kernel_names(pattern: str) -> list[str]:
    """The distinct kernel names of a recorded PyTorch trace that contain ``pattern``."""
    trace = json.loads(gzip.decompress((KINETO_TRACES / "trace_diff" / "control" / "control.json.gz").read_bytes()))
    return sorted({e["name"] for e in trace["traceEvents"] if e.get("cat") == "kernel" and pattern in e["name"]})


def test_distinct_kernels_of_one_template_stay_distinct_in_a_table() -> None:
    kernels = _recorded_kernel_names("CatArrayBatchedCopy")
    assert len(kernels) >= 2  # instances of one template, differing in their template arguments
    for width in (20, 40, 60, NAME_FLOOR, 90):
        shortened = [short_name(k, width) for k in kernels]
        assert len(set(shortened)) == len(kernels), shortened
        assert all(len(s) <= width for s in shortened)
    frame = pd.DataFrame({"name": kernels, "total_ns": range(len(kernels), 0, -1)})
    out = io.StringIO()
    render_table(frame, "kernels", out, sort="total_ns")
    rows = [line for line in out.getvalue().splitlines() if "CatArrayBatchedCopy" in line]
    assert len(rows) == len(kernels) and len({" ".join(r.split()[:-1]) for r in rows}) == len(kernels)


def test_fitting_drops_lesser_columns_first_and_keeps_the_name() -> None:
    names = [Column("Name", ["x" * 60], text=True, priority=0)]
    numbers = [Column(f"Col {i}", ["12,345.678"], priority=i) for i in range(1, 8)]
    shown, dropped = fit_columns(names + numbers, 80)
    assert [c.header for c in shown][:1] == ["Name"]
    assert dropped == [f"Col {i}" for i in range(len(shown), 8)]
    assert len(shown[0].cells[0]) >= NAME_FLOOR and "…" in shown[0].cells[0]
    assert fit_columns(names + numbers, None) == (names + numbers, [])


@pytest.mark.torch
def test_top_at_80_columns_keeps_name_and_sort_column(cnn_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for by, header in (("micros", "Total ("), ("self", "Self ("), ("calls", "Calls")):
        out = run_cli(["top", str(cnn_run), "--by", by], capsys)
        assert_fits(out)
        assert header in header_line(out)
        assert "hidden to fit 80 columns" in out and "--wide" in out
        # One time unit for every time column of the table.
        assert len(set(UNIT.findall(header_line(out)))) == 1
    wide = run_cli(["top", str(cnn_run), "--wide"], capsys)
    for header in ("Min (", "Max (", "Cum %", "Avg ("):
        assert header in wide
    assert "hidden" not in wide and len(set(UNIT.findall(header_line(wide)))) == 1
    assert any(len(line) > 80 for line in wide.splitlines())


@pytest.mark.torch
@pytest.mark.parametrize("argv", [
    ["tree"], ["tree", "--view", "scope", "--depth", "2"], ["pprof"], ["top", "--group-by", "type"],
    ["top", "--kind", "module", "--by", "self"], ["info"],
])
def test_more_views_of_a_torch_run_fit(cnn_run: Path, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert_fits(run_cli([*argv[:1], str(cnn_run), *argv[1:]], capsys))


@pytest.mark.parametrize("argv", [
    ["tune"], ["gpu"], ["top", "--kind", "kernel"], ["top", "--kind", "kernel", "--group-by", "op"], ["pprof"],
])
def test_commands_on_a_gpu_trace_fit(gpu_run: Path, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    out = run_cli([*argv[:1], str(gpu_run), *argv[1:]], capsys)
    assert_fits(out)
    if argv[0] == "top":
        assert "Total (" in header_line(out)
    if argv[0] == "tune":
        assert {"Name", "Score"} <= set(header_line(out, "Rank").split())


def test_ranks_and_ls_fit(two_rank_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["ranks", str(two_rank_run)], ["ranks", str(two_rank_run), "--by-step"],
                 ["top", str(two_rank_run), "--per-rank"]):
        assert_fits(run_cli(argv, capsys))
    listing = run_cli(["ls", "--dir", str(two_rank_run.parent)], capsys)
    assert_fits(listing)
    assert header_line(listing).split()[:3] == ["Name", "Script", "Status"]


def test_counters_fit(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_cli(["counters"], capsys)
    assert_fits(out)
    assert "task-clock" in out


def test_diff_fits_and_its_gate_uses_one_unit_a_line(trace_diff_runs: tuple[Path, Path],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    control, test = map(str, trace_diff_runs)
    assert main(["diff", control, test, "-n", "5", "--fail-above", "1"]) == 1
    captured = capsys.readouterr()
    assert_fits(captured.out)
    for title in ("Totals", "op: 5 of", "kernel: 5 of"):
        table = captured.out.split(title, 1)[1]
        header = header_line(table, "!").split()  # regressions flagged in the first column
        assert header[1] == ("Kind" if title == "Totals" else "Name") and "Change" in header
        assert len(set(UNIT.findall(" ".join(header)))) == 1
    gate = [line for line in captured.err.splitlines() if " -> " in line]
    assert gate
    for line in gate:
        units = re.findall(r"[\d,.]+ (s|ms|us|ns)", line)
        assert len(units) == 2 and units[0] == units[1], line
    wide = run_cli(["diff", control, test, "-n", "5", "--wide"], capsys)
    assert "Share A %" in wide and "Avg A (" in wide and "hidden" not in wide


def test_escapes_never_reach_the_terminal(escape_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["top", str(escape_run), "--kind", "region"], ["pprof", str(escape_run)],
                 ["top", str(escape_run), "--kind", "region", "--wide"], ["ls", "--dir", str(escape_run.parent)]):
        out = run_cli(argv, capsys)
        assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out and "\x7f" not in out
        if argv[0] != "ls":
            for shown in ("step␛]0;owned␇", "load␛]52;c;cm0gLXJmIH4=␇", "clear␛[2J\ufffd2J\u2421"):
                assert shown in out
    # Scripts get the true names.
    rows = json.loads(run_cli(["top", str(escape_run), "--kind", "region", "--format", "json"], capsys))
    assert {row["name"] for row in rows} == {TITLE, CLIPBOARD, CLEAR}


def test_counter_columns_carry_their_unit(escape_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if not dlprof.load(escape_run).query("SELECT 1 FROM metrics LIMIT 1").rows:
        pytest.skip("perf_event cannot count on this machine: the run holds no counter values")
    out = run_cli(["top", str(escape_run), "--kind", "region", "--wide"], capsys)
    header = header_line(out)
    assert "perf:page-faults (count)" in header
    (clock_unit,) = re.findall(r"perf:task-clock \((s|ms|us|ns)\)", header)
    assert set(UNIT.findall(header)) == {clock_unit}  # the table's one time unit
    # Every perf event counted in nanoseconds is shown as a time.
    assert {f"perf:{name}" for name, spec in EVENTS.items() if spec.unit == "ns"} == NANOSECOND_COUNTERS



def test_one_outlier_does_not_turn_a_column_to_seconds() -> None:
    """A 22 s warm-up step among 56 ms ones: the steps read in ms, the outlier as 22,289 ms."""
    steps = [22_289_864_385, *[56_000_000 + 1_000_000 * i for i in range(19)]]
    assert time_unit(steps).symbol == "ms"
    assert time_unit([7_900_000]).symbol == "us"
    # Past six digits before the point the next unit up is taken.
    assert time_unit([5_000] * 10 + [22_000_000_000]).symbol == "ms"


def test_headers_read_as_words_and_units() -> None:
    frame = pd.DataFrame({"rank": [0], "mean_ns": [56e6], "std_ns": [3e6], "step_pct": [12.5], "data_wait_ns": [1e6]})
    out = io.StringIO()
    render_table(frame, "steps", out, sort="mean_ns")
    header = header_line(out.getvalue(), "Rank")
    assert "Mean (ms)" in header and "Std (ms)" in header and "Step %" in header and "Data wait (ms)" in header
    assert "_ns" not in out.getvalue()
