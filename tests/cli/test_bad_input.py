"""Bad input gets one clear line and a non-zero exit, never a traceback."""

from __future__ import annotations

import json
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
    part = min((damaged / "slices" / "rank=0").glob("part-*.parquet"))
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


def small_run(run_dir: Path) -> Path:
    from tests.builders import write_small_run

    return write_small_run(run_dir)


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dlprof: error: "), err
    return lines[0]


def test_report_refuses_to_write_through_a_symlink(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = small_run(tmp_path / "run")
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    (run / "report.html").symlink_to(victim)
    assert main(["report", str(run)]) == 2
    assert "report.html: a link to a place outside the run" in one_error_line(capsys), "the run is damaged"
    assert victim.read_text() == "keep me"
    inside = run / "precious.txt"  # a link that stays in the run is no damage, and still not written through
    inside.write_text("keep me")
    (run / "report.html").unlink()
    (run / "report.html").symlink_to(inside)
    assert main(["report", str(run)]) == 2
    assert "symbolic link" in one_error_line(capsys)
    assert inside.read_text() == "keep me"


def test_export_refuses_to_write_through_a_symlink(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = small_run(tmp_path / "run")
    victim = tmp_path / "precious.json"
    victim.write_text("keep me")
    (tmp_path / "out.json").symlink_to(victim)
    assert main(["export", str(run), "-o", str(tmp_path / "out.json")]) == 2
    assert "symbolic link" in one_error_line(capsys)
    assert victim.read_text() == "keep me"


@pytest.mark.parametrize(("manifest", "words"), [
    ("[1, 2]", "the file should be an object, not a list"),
    ("{}", "the file has no 'name', 'command'"),
    ('{"name": "x", "command": ["p"], "start_ns": "soon"}', "field 'start_ns' should be an integer, not a string"),
    ('{"name": "x", "command": ["p"], "host": {"cpu_cores": "8"}}', "field 'host.cpu_cores' should be an integer"),
])
def test_a_damaged_manifest_is_one_line_naming_the_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], manifest: str, words: str) -> None:
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / "run.json").write_text(manifest)
    for command in ("info", "top", "export"):
        assert main([command, str(run)]) == 2
        line = one_error_line(capsys)
        assert words in line and "__init__" not in line
    assert main(["ls", "--dir", str(tmp_path / "runs"), "--format", "json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["status"] == "unreadable" and words in row["problem"]


def test_one_bad_manifest_never_hides_the_good_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    good = small_run(tmp_path / "dlprof-runs" / "a-good")
    broken = tmp_path / "dlprof-runs" / "b-broken"
    broken.mkdir()
    (broken / "run.json").write_text("[1, 2]")  # newer by its file's age: no start time to read
    for command in (["info"], ["top"]):
        assert main(command) == 0
        err = capsys.readouterr().err
        assert "using a-good; skipped 1 newer unreadable run: b-broken" in err and "Traceback" not in err
    assert main(["ls", "--format", "json"]) == 0
    listed = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert listed["a-good"]["status"] == "complete" and listed["a-good"]["problem"] == ""
    assert listed["b-broken"]["status"] == "unreadable"
    assert "should be an object, not a list" in listed["b-broken"]["problem"]
    assert good.is_dir()


def test_ls_does_not_call_a_run_with_a_truncated_part_complete(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = small_run(tmp_path / "runs" / "r")
    part = run / "slices" / "rank=0" / "part-00000.parquet"
    part.write_bytes(part.read_bytes()[:200])
    assert main(["ls", "--dir", str(tmp_path / "runs"), "--format", "json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["status"] == "damaged"
    assert row["problem"].startswith("slices/rank=0/part-00000.parquet: damaged Parquet file")


@pytest.mark.parametrize("command", [["ranks"], ["diff", "BASE"], ["export"], ["report"], ["top"]])
@pytest.mark.parametrize(("damage", "words"), [
    ("retype", "column 'start_ns' is string, not an integer"),
    ("drop", "no column 'dur_ns'"),
])
def test_parquet_with_wrong_columns_is_one_line_never_an_empty_table(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str], damage: str, words: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    base = small_run(tmp_path / "base")
    run = small_run(tmp_path / "run")
    part = run / "slices" / "rank=0" / "part-00000.parquet"
    data = pq.read_table(part)
    if damage == "retype":
        data = data.set_column(data.column_names.index("start_ns"), "start_ns", data.column("start_ns").cast(pa.string()))
    else:
        data = data.drop_columns(["dur_ns"])
    pq.write_table(data, part)
    argv = [str(base) if word == "BASE" else word for word in command] + [str(run)]
    assert main(argv) == 2
    assert words in one_error_line(capsys)


@pytest.mark.parametrize("name", ["rank=abc", "rank=True", "rank=-1"])
def test_a_badly_named_partition_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    run = small_run(tmp_path / "run")
    (run / "slices" / "rank=0").rename(run / "slices" / name)
    assert main(["top", str(run)]) == 2
    line = one_error_line(capsys)
    assert f"slices/{name}: a partition's name must be rank=<integer>" in line and "holds no slices" not in line


def test_a_file_given_as_run_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("x")
    assert main(["top", str(tmp_path / "notes.txt")]) == 2
    assert one_error_line(capsys).endswith("notes.txt: a file, not a run directory")


def test_run_of_a_directory_says_what_is_wrong(tmp_path: Path) -> None:
    (tmp_path / "somedir").mkdir()
    done = run_cli("run", "somedir", cwd=tmp_path)
    assert_clean_failure(done, "somedir: a directory with no __main__.py, not a script")
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(("argv", "option"), [
    (["view", "--timeout", "nan"], "--timeout"), (["view", "--timeout", "inf"], "--timeout"),
    (["view", "--timeout", "-1"], "--timeout"), (["tree", "--min-percent", "nan"], "--min-percent"),
])
def test_nan_and_inf_are_refused(argv: list[str], option: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*argv, "no-such-run"]) == 2
    err = capsys.readouterr().err
    assert f"Invalid value for '{option}'" in err and "Traceback" not in err
