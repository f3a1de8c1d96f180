"""What one run of the GPU check leaves in its report directory for the session to bring back: at
most :data:`MAX_FILES` files of at most :data:`MAX_BYTES` each, the report's three among them.

    left = files_left(out)                                    # 5 while only the report is there
    size = pack_directory(run_dir, out / "gpt-dlprof-run.tar.gz")
    size = gzip_file(trace, out / "gpt-torch-profiler.json.gz")

A file that would pass the size limit is not left there (:class:`TooLarge` says how large it was).
Each is written under a temporary name and renamed, so a part killed meanwhile leaves no half
file. Standard library only.
"""

from __future__ import annotations

import gzip
import os
import shutil
import tarfile
from pathlib import Path

MAX_FILES = 8
MAX_BYTES = 16 * 2**20
REPORT_FILES = ("gpu-check.json", "gpu-check.md", "gpu-check.log")


class TooLarge(Exception):
    """A file to bring back is larger than :data:`MAX_BYTES`; it was removed."""

    def __init__(self, path: Path, size: int) -> None:
        super().__init__(f"{path.name} is {size / 2**20:.1f} MiB, more than the {MAX_BYTES // 2**20} MiB "
                         "a file brought back may be")
        self.size = size


def files_left(out: Path) -> int:
    """How many more files the report directory may hold (the report's own counted even before
    they are written)."""
    present = {p.name for p in out.iterdir() if p.is_file()} if out.is_dir() else set()
    return MAX_FILES - len(present | set(REPORT_FILES))


def _finish(partial: Path, target: Path) -> int:
    size = partial.stat().st_size
    if size > MAX_BYTES:
        partial.unlink()
        raise TooLarge(target, size)
    os.replace(partial, target)
    return size


def pack_directory(directory: Path, target: Path) -> int:
    """``directory`` as a gzipped tar (its files under its own name); the size written.

    Raises:
        TooLarge: the archive is larger than :data:`MAX_BYTES` (nothing is left at ``target``).
    """
    partial = target.with_name(target.name + ".partial")
    with tarfile.open(partial, "w:gz", compresslevel=6) as archive:
        archive.add(directory, arcname=directory.name)
    return _finish(partial, target)


def gzip_file(source: Path, target: Path) -> int:
    """``source`` gzipped into ``target``; the size written.

    Raises:
        TooLarge: the result is larger than :data:`MAX_BYTES` (nothing is left at ``target``).
    """
    partial = target.with_name(target.name + ".partial")
    with source.open("rb") as raw, gzip.open(partial, "wb", compresslevel=6) as packed:
        shutil.copyfileobj(raw, packed, 1 << 20)
    return _finish(partial, target)
