"""Where a new run may be written: never into an existing run, unless asked to replace it.

A session writes its parts beside whatever the directory holds, so a new run written into an
old one would mix with it (or overwrite its first parts). So a run directory named for a new
run must be missing or empty; an old run there is replaced only when the caller says so::

    prepare_run_dir(Path("runs/base"), force=False)   # RunExistsError if runs/base holds a run

A directory that holds other files is never emptied, whatever ``force`` says: dlprof deletes
only what it recognises as its own; nor is a run that a live process is writing
(:mod:`dlprof.store.writer_lock`).
"""

from __future__ import annotations

import shutil
from fnmatch import fnmatch
from pathlib import Path

from dlprof.store.manifest import MANIFEST_NAME, RANK_MANIFESTS
from dlprof.store.writer_lock import LOCK_GLOB, in_use


class RunExistsError(FileExistsError):
    """The directory chosen for a new run is taken; the message is one line naming what to do."""


def holds_run(path: Path) -> bool:
    """Whether ``path`` is a dlprof run directory (its manifest, or a job's rank manifests)."""
    return (path / MANIFEST_NAME).is_file() or (path / RANK_MANIFESTS).is_dir()


def prepare_run_dir(path: Path, force: bool, force_hint: str = "--force") -> None:
    """Make sure a new run may be written to ``path``; remove the run there when ``force``.

    Args:
        path: the run directory asked for.
        force: replace a run found there.
        force_hint: how the caller passes ``force`` (``--force``, ``force=True``), for the message.

    Raises:
        RunExistsError: ``path`` is a file or a link, holds a run and ``force`` is false, holds
            a run a live process is writing, or holds files that are not a run.
    """
    if path.is_symlink():
        raise RunExistsError(f"{path}: a symbolic link; name the run directory itself")
    if not path.exists():
        return
    if not path.is_dir():
        raise RunExistsError(f"{path}: a file, not a directory; choose another run directory")
    writer = in_use(path)
    if writer is not None:  # even with force: a run being written is never removed under its writer
        raise RunExistsError(f"{path}: in use: {writer} is writing a run there; wait for it to end, "
                             "or choose another run directory")
    if not any(entry for entry in path.iterdir() if not fnmatch(entry.name, LOCK_GLOB)):
        return  # empty, or a lock file a killed writer left before writing anything
    if not holds_run(path):
        raise RunExistsError(f"{path}: not empty and not a dlprof run; choose another run directory")
    if not force:
        raise RunExistsError(f"{path}: already holds a run; pass {force_hint} to replace it, "
                             "or choose another run directory")
    shutil.rmtree(path)
