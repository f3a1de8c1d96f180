"""Every line a command prints about a run is safe to print, and says what is wrong in one line.

Paths and names come from anyone's files: escape sequences and bidirectional controls in them
are shown, not obeyed, in error lines, success lines and tables alike; values a run holds that
break an analysis (durations adding up past int64) are one line; a run stating a huge number of
devices prints a bounded summary.
"""

from __future__ import annotations

from pathlib import Path

from dlprof.store.manifest import Manifest
from tests.builders import op, write_rows_run, write_small_run
from tests.conftest import run_in_process

ESCAPE = "\x1b]0;pwned\x07"
OVERRIDE = "\u202e"


def assert_safe(text: str) -> None:
    assert "\x1b" not in text and "\x07" not in text and OVERRIDE not in text, repr(text)


def test_an_error_line_shows_the_escapes_in_a_path(tmp_path: Path) -> None:
    code, out, err = run_in_process(["info", str(tmp_path / f"{ESCAPE}run{OVERRIDE}")])
    assert code == 2 and out == ""
    assert_safe(err)
    assert err == f"dlprof: error: {tmp_path}/\u241b]0;pwned\u2407run\ufffd: no such run directory\n"


def test_a_success_line_shows_the_escapes_in_a_path(tmp_path: Path) -> None:
    run = write_small_run(tmp_path / "run")
    code, out, err = run_in_process(["export", str(run), "-o", str(tmp_path / f"{ESCAPE}trace.json")])
    assert code == 0
    assert_safe(out + err)
    assert out == f"{tmp_path}/\u241b]0;pwned\u2407trace.json\n"


def test_tables_show_bidirectional_controls_in_names(tmp_path: Path) -> None:
    write_rows_run(tmp_path / "run", [op(1, f"evil{OVERRIDE}gnp.py", 0, 1000, kind="region"),
                                      op(2, f"bell{ESCAPE}", 2000, 500, kind="region")])
    for command in (["top", str(tmp_path / "run"), "--kind", "region"], ["pprof", str(tmp_path / "run")]):
        code, out, err = run_in_process(command)
        assert code == 0, err
        assert_safe(out + err)
        assert "evil\ufffdgnp.py" in out


def test_durations_adding_up_past_int64_are_one_line(tmp_path: Path) -> None:
    # Each within the store's ±3e18 ns, together past 2**63: a run edited, or written by a bug.
    write_rows_run(tmp_path / "run", [op(i, "aten::mm", i, 3 * 10**18) for i in range(1, 5)])
    report = tmp_path / "report.html"
    for command in (["top", str(tmp_path / "run")], ["report", str(tmp_path / "run"), "-o", str(report)]):
        code, out, err = run_in_process(command)
        assert code == 2 and out == "", (command, err)
        (line,) = err.strip().splitlines()
        assert line.startswith("dlprof: error: ") and "past the range" in line, line
    assert not report.exists()


def test_info_lists_a_few_devices_and_counts_the_rest(tmp_path: Path) -> None:
    run = write_small_run(tmp_path / "run")
    manifest = Manifest.read(run)
    manifest.devices = [{"id": n, "name": "NVIDIA H100", "numSms": 132} for n in range(200_000)]
    manifest.write(run)
    code, out, err = run_in_process(["info", str(run)])
    assert code == 0 and err == ""
    assert "15: NVIDIA H100 (132 SMs)" in out and "16: NVIDIA H100" not in out
    assert "... and 199,984 more (dlprof info --format json lists them)" in " ".join(out.split())
    assert len(out.splitlines()) < 80
