"""Writing a file so that no reader sees half of it, and never through a link dlprof did not make.

Every file dlprof writes, in a run directory or at a path the user named, goes through here::

    write_text(run_dir / "report.html", page)            # whole, or not at all
    with atomic_path(part) as partial:                    # for writers that take a path (Arrow)
        pq.write_table(table, partial)
    with atomic_binary(trace) as file:                    # for writers that take a file
        file.write(data)

The data goes to a new file beside the target (same directory, so the rename cannot cross file
systems), created exclusively (``O_EXCL``: a link planted under that name is not followed), and
is renamed over the target once complete: a process killed at any moment leaves either the old
file or the new one, never a mix. A target that is a symbolic link is refused: writing through it
would change the file it points to, and a rename would silently replace the link. A failed write
removes its temporary file.
"""

from __future__ import annotations

import errno
import os
import secrets
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

# Temporary files start with a dot and end with this, so that no glob of the store
# (part-*.parquet, chunk-*.parquet, save-*.json) ever matches one.
PARTIAL_SUFFIX = ".partial"


class SymlinkTargetError(OSError):
    """The file to write is a symbolic link; its ``strerror`` is one line a person can act on."""


def refuse_symlink(path: Path) -> None:
    """Raise if ``path`` itself (not its directory) is a symbolic link.

    Args:
        path: the file about to be written.

    Raises:
        SymlinkTargetError: it is a link (dangling or not).
    """
    if path.is_symlink():
        raise SymlinkTargetError(
            errno.ELOOP, f"{path} is a symbolic link; dlprof does not write through links "
            "(remove it, or name another file)", str(path))


def partial_path(path: Path) -> Path:
    """A fresh temporary name beside ``path`` (hidden, unique to this call)."""
    return path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}{PARTIAL_SUFFIX}")


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path for a writer that opens files itself; renamed over ``path`` on success.

    The temporary file is created (empty, exclusively) before it is handed out, so a writer
    that opens it by name opens the file made here.

    Args:
        path: the file to write; its directory is created if missing.

    Yields:
        The temporary path to write to.

    Raises:
        SymlinkTargetError: ``path`` is a symbolic link.
    """
    refuse_symlink(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = _create_exclusively(path)
    try:
        yield partial
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


@contextmanager
def atomic_binary(path: Path, buffering: int = 1 << 20) -> Iterator[IO[bytes]]:
    """A binary file that appears at ``path`` only once it is complete.

    Args:
        path: the file to write; its directory is created if missing.
        buffering: the buffer size of the file object.

    Yields:
        The open temporary file.

    Raises:
        SymlinkTargetError: ``path`` is a symbolic link.
    """
    with atomic_path(path) as partial, partial.open("wb", buffering=buffering) as file:
        yield file


def write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole (see :func:`atomic_path`).

    Raises:
        SymlinkTargetError: ``path`` is a symbolic link.
        OSError: it cannot be written.
    """
    with atomic_binary(path) as file:
        file.write(data)


def write_text(path: Path, text: str) -> None:
    """Write ``text`` as UTF-8 to ``path`` whole (see :func:`atomic_path`).

    Raises:
        SymlinkTargetError: ``path`` is a symbolic link.
        OSError: it cannot be written.
    """
    write_bytes(path, text.encode("utf-8"))


def partial_directory(path: Path) -> Path:
    """A new, empty directory beside ``path``, to fill and then rename over it.

    Args:
        path: the directory to be written (a TAU profile directory); its parent is created.

    Returns:
        The temporary directory (hidden, unique to this call).

    Raises:
        SymlinkTargetError: ``path`` is a symbolic link.
    """
    refuse_symlink(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=PARTIAL_SUFFIX, dir=path.parent))


def _create_exclusively(path: Path) -> Path:
    """Create an empty temporary file beside ``path``; O_EXCL never follows a link."""
    while True:
        partial = partial_path(path)
        try:
            # 0o666 less the umask: the file gets the permissions an ordinary open() gives.
            os.close(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666))
        except FileExistsError:
            continue  # a name taken by chance: draw another
        return partial
