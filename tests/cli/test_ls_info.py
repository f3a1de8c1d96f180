"""``dlprof ls`` and ``dlprof info`` on a directory of real runs: complete, failed, killed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlprof.cli.main import main
from dlprof.keys import RunStatus, StoreTable
from dlprof.store.catalog import COLUMNS, UNREADABLE, list_runs, script_of
from dlprof.store.manifest import Manifest
from dlprof.store.writer import RankWriter
from tests.builders import slice_table

SECOND = 1_000_000_000


def dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(done.stdout)


@pytest.fixture
def runs(cnn_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """./dlprof-runs in a fresh working directory: the CNN run (oldest), a failed and a killed run."""
    monkeypatch.chdir(tmp_path)
    parent = tmp_path / "dlprof-runs"
    cnn = Path(shutil.copytree(cnn_run, parent / "a-cnn"))
    start = Manifest.read(cnn).start_ns

    failed = parent / "b-failed"
    Manifest(name="b-failed", command=["/usr/bin/python3", "-m", "app.train", "--lr", "1"],
             status=RunStatus.FAILED, start_ns=start + 10 * SECOND, end_ns=start + 12 * SECOND,
             exit_code=1, error="ValueError: boom").write(failed)
    RankWriter(failed, 0).compact()

    killed = parent / "c-killed"
    Manifest(name="c-killed", command=["python", "train.py", "--config", "other.py"],
             status=RunStatus.RUNNING, start_ns=start + 20 * SECOND, writer_pid=dead_pid()).write(killed)
    writer = RankWriter(killed, 0)
    writer.write_chunk(StoreTable.SLICES, slice_table([(1, 1, "step", "s", 0, 100)]), "a")
    writer.write_chunk(StoreTable.SLICES, slice_table([(2, 1, "op", "o", 10, 20)]), "b")

    (parent / "not-a-run").mkdir()  # no run.json: not listed
    return parent


def test_list_runs_newest_first_with_killed_status(runs: Path) -> None:
    listed = list_runs(runs)
    assert listed.columns == COLUMNS
    assert listed.column("name") == ["c-killed", "b-failed", "a-cnn"]
    assert listed.column("status") == ["killed", "failed", "complete"]
    assert listed.column("script") == ["train.py", "app.train", listed.column("script")[2]]
    assert all(size > 0 for size in listed.column("size_bytes"))
    # The killed run has no counts in its manifest: its chunks' footers are counted instead.
    assert listed.column("events")[:2] == [2, 0]
    assert listed.column("events")[2] == sum(Manifest.read(runs / "a-cnn").counts.values()) > 1000
    assert listed.column("duration_ns")[1] == 2 * SECOND


def test_ls_table(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ls"]) == 0
    out = capsys.readouterr().out
    assert "3 runs under dlprof-runs" in out
    for header in ("Name", "Script", "Status", "Started", "Duration", "Events", "Size"):
        assert header in out
    lines = [line for line in out.splitlines() if "-cnn" in line or "-failed" in line or "-killed" in line]
    assert [line.split()[0] for line in lines] == ["c-killed", "b-failed", "a-cnn"]
    assert "killed" in lines[0] and "app.train" in lines[1] and "2.00 s" in lines[1]


def test_ls_json_and_csv(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ls", "--format", "json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in records] == ["c-killed", "b-failed", "a-cnn"]
    assert set(records[0]) == set(COLUMNS)
    assert all(r["size_bytes"] > 0 for r in records)
    assert main(["ls", "--dir", str(runs), "--format", "csv"]) == 0
    csv_lines = capsys.readouterr().out.splitlines()
    assert csv_lines[0] == ",".join(COLUMNS) and len(csv_lines) == 4


def test_ls_without_runs_is_one_line_and_success(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["ls"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "no runs under dlprof-runs" in out
    assert main(["ls", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_an_unreadable_manifest_is_listed_not_fatal(runs: Path) -> None:
    (runs / "d-broken").mkdir()
    (runs / "d-broken" / "run.json").write_text("{not json")
    listed = list_runs(runs)
    assert dict(zip(listed.column("name"), listed.column("status"), strict=True))["d-broken"] == UNREADABLE
    assert len(listed) == 4


@pytest.mark.parametrize(("command", "script"), [
    ([".venv/bin/dlprof", "run", "--top", "3", "examples/torch_cnn.py", "--steps", "2"], "examples/torch_cnn.py"),
    (["/usr/bin/python3", "/x/site-packages/dlprof/__main__.py", "run", "-m", "app.main"], "app.main"),
    (["python", "-m", "dlprof", "run", "train.py"], "train.py"),
    (["/usr/bin/python3", ".venv/bin/pytest", "-q"], "pytest"),
    ([], ""),
])
def test_script_of(command: list[str], script: str) -> None:
    assert script_of(command) == script


def test_info_summary(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # --wide: every note on one line, whole (at 80 columns long notes wrap).
    assert main(["info", str(runs / "a-cnn"), "--wide"]) == 0
    out = capsys.readouterr().out
    manifest = Manifest.read(runs / "a-cnn")
    for collector in manifest.collectors:
        assert collector.name in out
        for note in collector.notes:
            assert note in out
    for table, rows in manifest.counts.items():
        assert table in out and f"{rows:,}" in out
    assert "complete" in out and "world size 1" in out and "clocks" in out


def test_info_of_failed_and_killed_runs(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(runs / "b-failed")]) == 0
    out = capsys.readouterr().out
    assert "failed, exit code 1: ValueError: boom" in out
    assert "python3 -m app.train --lr 1" in out
    assert main(["info", str(runs / "c-killed")]) == 0
    out = capsys.readouterr().out
    assert "killed (left running by process" in out


def test_info_defaults_to_the_newest_run(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The newest is the one that started last, the first row of `dlprof ls`, even when an older
    # run's manifest was written later.
    time.sleep(0.01)
    Manifest.read(runs / "b-failed").write(runs / "b-failed")
    assert main(["info"]) == 0
    assert "c-killed" in capsys.readouterr().out
    assert main(["ls", "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("c-killed")


def test_info_json(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(runs / "c-killed"), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["status"] == "running" and data["effective_status"] == "killed"
    assert data["path"] == str(runs / "c-killed")
    assert Manifest.from_dict(data).name == "c-killed"


def test_info_of_a_bad_run_is_one_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "dlprof", "info", str(tmp_path / "nope")],
                          capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"dlprof: error: {tmp_path / 'nope'}: no such run directory"]
