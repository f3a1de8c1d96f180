"""``dlprof import`` as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dlprof.cli.main import main
from tests.conftest import KINETO_TRACES


def test_import_then_kernel_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (trace,) = (KINETO_TRACES / "critical_path" / "simple_add").glob("*.json.gz")
    assert main(["import", "-o", str(tmp_path / "run"), str(trace)]) == 0
    out = capsys.readouterr().out
    assert "imported 1 file(s)" in out and "normalised to nest" in out
    assert main(["top", str(tmp_path / "run"), "--kind", "kernel", "--group-by", "op", "--format", "csv"]) == 0
    rows = capsys.readouterr().out.strip().splitlines()
    assert rows[0].startswith("name,calls") and "device_ns" in rows[0] and len(rows) > 2


def test_import_refuses_a_non_empty_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "x").write_text("")
    (trace,) = (KINETO_TRACES / "critical_path" / "simple_add").glob("*.json.gz")
    assert main(["import", "-o", str(tmp_path / "run"), str(trace)]) == 2
    assert "not empty" in capsys.readouterr().err


def test_bad_trace_as_a_real_program(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00garbage")
    done = subprocess.run([sys.executable, "-m", "dlprof", "import", "-o", str(tmp_path / "run"), str(bad)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "damaged or truncated gzip" in done.stderr and len(done.stderr.strip().splitlines()) == 1
