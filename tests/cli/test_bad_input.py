"""Bad input gets one clear line and a non-zero exit, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dlprof.cli.main import main
from dlprof.keys import StoreTable
from dlprof.store.manifest import Manifest
from dlprof.store.writer import RankWriter


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dlprof", *args], capture_output=True, text=True, check=False,
                          cwd=cwd, timeout=120)


def assert_clean_failure(done: subprocess.CompletedProcess[str], words: str) -> None:
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert words in done.stderr, done.stderr


def test_missing_script(tmp_path: Path) -> None:
    done = run_cli("run", "missing.py", cwd=tmp_path)
    assert_clean_failure(done, "missing.py: no such file")
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "dlprof-runs").exists(), "nothing is written for a script that is not there"


def test_missing_module_and_bad_schedule_and_collector(tmp_path: Path) -> None:
    assert_clean_failure(run_cli("run", "-m", "no_such_module_xyz", cwd=tmp_path), "no module named")
    assert_clean_failure(run_cli("run", "--schedule", "1,x", "a.py", cwd=tmp_path), "schedule")
    assert_clean_failure(run_cli("run", "--collectors", "nope", "a.py", cwd=tmp_path), "unknown collector")


def test_top_on_a_directory_that_is_not_a_run(tmp_path: Path) -> None:
    (tmp_path / "some" / "dir").mkdir(parents=True)
    assert_clean_failure(run_cli("top", "some/dir", cwd=tmp_path), "not a dlprof run")


def test_top_without_any_run(tmp_path: Path) -> None:
    assert_clean_failure(run_cli("top", cwd=tmp_path), "no runs under")


def test_unknown_sort_key(cnn_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["top", str(cnn_run), "--by", "colour"]) == 2
    assert "colour" in capsys.readouterr().err


def test_truncated_parquet(cnn_run: Path, tmp_path: Path) -> None:
    import shutil

    damaged = tmp_path / "damaged"
    shutil.copytree(cnn_run, damaged)
    part = damaged / "slices" / "rank=0" / "part-00000.parquet"
    part.write_bytes(part.read_bytes()[:1000])
    assert_clean_failure(run_cli("top", str(damaged), cwd=tmp_path), "damaged Parquet file")


def test_empty_run(tmp_path: Path) -> None:
    Manifest(name="empty", command=["x"]).write(tmp_path)
    RankWriter(tmp_path, 0).compact()
    assert_clean_failure(run_cli("top", str(tmp_path), cwd=tmp_path), "holds no slices")


def test_kind_absent_from_run(cnn_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["top", str(cnn_run), "--kind", "kernel"]) == 2
    err = capsys.readouterr().err
    assert "no slices of kind 'kernel'" in err and "op" in err


def test_chunk_only_run_still_reads(tmp_path: Path, cnn_run: Path) -> None:
    import dlprof

    Manifest(name="partial", command=["x"]).write(tmp_path)
    table = dlprof.load(cnn_run).arrow(StoreTable.SLICES).drop_columns(["rank"])
    RankWriter(tmp_path, 0).write_chunk(StoreTable.SLICES, table, "test")
    assert main(["top", str(tmp_path), "--limit", "3"]) == 0
