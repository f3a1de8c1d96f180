"""Files written whole, beside their target, and never through a link."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest

from dlprof.store.safe_files import SymlinkTargetError, atomic_path, partial_directory, write_text
from dlprof.store.schema import write_parquet


def test_write_text_replaces_whole_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "report.html"
    write_text(target, "first")
    write_text(target, "second")
    assert target.read_text() == "second"
    assert sorted(p.name for p in target.parent.iterdir()) == ["report.html"]
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask, "permissions as an ordinary open() gives"


def test_a_symlink_target_is_refused_and_its_file_untouched(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    link = tmp_path / "report.html"
    link.symlink_to(victim)
    with pytest.raises(SymlinkTargetError, match="symbolic link"):
        write_text(link, "overwritten")
    with pytest.raises(SymlinkTargetError):
        write_parquet(pa.table({"a": [1]}), link)
    with pytest.raises(SymlinkTargetError):
        partial_directory(link)
    assert victim.read_text() == "keep me" and link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "victim.txt"]


def test_a_failed_write_keeps_the_old_file_and_removes_its_temporary(tmp_path: Path) -> None:
    target = tmp_path / "run.json"
    write_text(target, "old")
    with pytest.raises(RuntimeError), atomic_path(target) as partial:
        partial.write_text("half")
        raise RuntimeError("killed mid-write")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


def test_the_temporary_name_matches_no_glob_of_the_store(tmp_path: Path) -> None:
    with atomic_path(tmp_path / "part-00000.parquet") as partial:
        assert partial.exists() and partial.parent == tmp_path
        assert not list(tmp_path.glob("part-*.parquet")) and not list(tmp_path.glob("chunk-*.parquet"))
