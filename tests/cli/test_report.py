"""``dlprof report``: in-process through main(), and once as the installed program."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dlprof.cli.main import main


def test_default_output_is_in_the_run(cnn_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(cnn_run)]) == 0
    captured = capsys.readouterr()
    target = cnn_run / "report.html"
    assert captured.out.strip() == str(target)
    assert "dlprof: report of cnn (complete)" in captured.err
    page = target.read_text(encoding="utf-8")
    assert 'id="report-data"' in page and "<title>dlprof report: cnn (complete)</title>" in page


def test_missing_output_directory(cnn_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(cnn_run), "-o", str(tmp_path / "nowhere" / "r.html")]) == 2
    assert "no such directory" in capsys.readouterr().err


def test_not_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path)]) == 2
    assert "not a dlprof run" in capsys.readouterr().err


def test_as_a_program(cnn_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    done = subprocess.run([sys.executable, "-m", "dlprof", "report", str(cnn_run), "-o", str(out)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out) and out.stat().st_size > 10_000
