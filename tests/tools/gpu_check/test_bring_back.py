"""What a run of the GPU check brings back: the H200 recording packed as the recordings part packs
a GPU run, the limits on files and sizes."""

from __future__ import annotations

import gzip
import tarfile
from pathlib import Path

import pytest

import dlprof
from tools.gpu_check import bring_back
from tools.gpu_check.bring_back import (
    MAX_FILES,
    REPORT_FILES,
    TooLarge,
    files_left,
    gzip_file,
    pack_directory,
)

H200 = Path(__file__).resolve().parents[2] / "data" / "h200"


def test_a_packed_run_unpacks_into_a_run_that_loads(tmp_path: Path) -> None:
    size = pack_directory(H200 / "gpt2-dlprof-run", tmp_path / "gpt-dlprof-run.tar.gz")
    assert size == (tmp_path / "gpt-dlprof-run.tar.gz").stat().st_size < bring_back.MAX_BYTES
    with tarfile.open(tmp_path / "gpt-dlprof-run.tar.gz") as archive:
        archive.extractall(tmp_path / "unpacked", filter="data")
    run = dlprof.load(tmp_path / "unpacked" / "gpt2-dlprof-run")
    assert run.manifest.counts == dlprof.load(H200 / "gpt2-dlprof-run").manifest.counts
    assert [p.name for p in tmp_path.iterdir() if p.is_file()] == ["gpt-dlprof-run.tar.gz"]  # no partial left


def test_a_file_over_the_limit_is_not_left_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bring_back, "MAX_BYTES", 100_000)
    with pytest.raises(TooLarge, match=r"gpt-dlprof-run.tar.gz is [\d.]+ MiB, more than the 0 MiB"):
        pack_directory(H200 / "gpt2-dlprof-run", tmp_path / "gpt-dlprof-run.tar.gz")
    with pytest.raises(TooLarge):
        gzip_file(H200 / "gpt2-torch-profiler.json.gz", tmp_path / "trace.json.gz")
    assert list(tmp_path.iterdir()) == []


def test_gzip_file_round_trips(tmp_path: Path) -> None:
    source = H200 / "gpu-check-report.md"
    gzip_file(source, tmp_path / "report.md.gz")
    assert gzip.decompress((tmp_path / "report.md.gz").read_bytes()) == source.read_bytes()


def test_the_reports_own_files_count_before_they_are_written(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert files_left(out) == MAX_FILES - len(REPORT_FILES) == 5
    out.mkdir()
    (out / REPORT_FILES[0]).write_text("{}")
    (out / "gpt-dlprof-run.tar.gz").write_bytes(b"x")
    assert files_left(out) == 4
