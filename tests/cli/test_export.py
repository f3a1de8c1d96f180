"""``dlprof export``: in-process through main(), and once as the installed program."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from dlprof.cli.main import main
from dlprof.config import RUNS_DIR
from dlprof.keys import RunStatus
from dlprof.store.manifest import Manifest
from dlprof.store.writer import RankWriter
from tests.conftest import dlprof_program


def copy_run(run: Path, where: Path) -> Path:
    """A private copy, for commands that write into the run directory."""
    return Path(shutil.copytree(run, where))


def test_perfetto_to_a_named_file(cnn_run: Path, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cnn.trace"
    assert main(["export", str(cnn_run), "--format", "perfetto", "-o", str(out)]) == 0
    assert capsys.readouterr().out == f"{out}\n"
    assert any(p.HasField("track_event") for p in pb.Trace.FromString(out.read_bytes()).packet)


@pytest.mark.parametrize(("name", "is_json"), [("t.json", True), ("t.perfetto-trace", False)])
def test_format_follows_the_extension(name: str, is_json: bool, cnn_run: Path,
                                      tmp_path: Path) -> None:
    out = tmp_path / name
    assert main(["export", str(cnn_run), "-o", str(out)]) == 0
    if is_json:
        assert "traceEvents" in json.loads(out.read_bytes())
    else:
        assert len(pb.Trace.FromString(out.read_bytes()).packet) > 1000


@pytest.mark.parametrize(("args", "written"), [
    ([], "trace.json"),
    (["--format", "perfetto"], "trace.perfetto-trace"),
])
def test_default_output_goes_into_the_run(args: list[str], written: str, cnn_run: Path,
                                          tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    run = copy_run(cnn_run, tmp_path / "run")
    assert main(["export", str(run), *args]) == 0
    assert capsys.readouterr().out == f"{run / written}\n"
    assert (run / written).stat().st_size > 0


def test_newest_run_by_default(cnn_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    run = copy_run(cnn_run, tmp_path / RUNS_DIR / "20990101-000000-cnn")
    monkeypatch.chdir(tmp_path)
    assert main(["export"]) == 0
    assert Path(capsys.readouterr().out.strip()).resolve() == (run / "trace.json").resolve()


def test_every_rank_file_is_printed(two_rank_run: Path, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", str(two_rank_run), "-o", str(tmp_path / "job.json")]) == 0
    assert capsys.readouterr().out.splitlines() == [
        str(tmp_path / "job.rank0.json"), str(tmp_path / "job.rank1.json")]


def test_unknown_extension_asks_for_a_format(cnn_run: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", str(cnn_run), "-o", str(tmp_path / "t.txt")]) == 2
    err = capsys.readouterr().err
    assert "t.txt" in err and "--format" in err and ".perfetto-trace" in err
    assert not (tmp_path / "t.txt").exists()


def test_unknown_format_is_refused(cnn_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", str(cnn_run), "--format", "svg"]) == 2
    assert "'svg' is not one of 'chrome', 'perfetto'" in capsys.readouterr().err


def test_a_run_without_slices(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    Manifest(name="empty", command=["x"], status=RunStatus.COMPLETE).write(tmp_path)
    RankWriter(tmp_path, 0).compact()
    assert main(["export", str(tmp_path)]) == 2
    assert "holds no slices" in capsys.readouterr().err
    assert not (tmp_path / "trace.json").exists()


def test_help_lists_formats_and_examples(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "--help"]) == 0
    text = capsys.readouterr().out
    assert "Examples:" in text and "perfetto" in text and ".perfetto-trace" in text


def test_as_the_installed_program(gpu_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "gpu.perfetto-trace"
    done = subprocess.run([*dlprof_program(), "export", str(gpu_run), "-o", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{out}\n" and "Traceback" not in done.stderr
    assert any(p.track_event.flow_ids for p in pb.Trace.FromString(out.read_bytes()).packet)
    failed = subprocess.run([*dlprof_program(), "export", str(gpu_run), "-o", str(tmp_path / "x.svg")],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False)
    assert failed.returncode == 2 and "Traceback" not in failed.stderr
    assert failed.stderr.startswith("dlprof: error:") and len(failed.stderr.splitlines()) == 1


def test_tau_exports_twice_into_the_same_directory(cnn_run: Path, tmp_path: Path) -> None:
    target = tmp_path / "profiles.tau"
    for _ in range(2):
        assert main(["export", str(cnn_run), "--format", "tau", "-o", str(target)]) == 0
    assert sorted(p.name for p in target.iterdir())[0] == "profile.0.0.0"
