"""Writing a file so that no reader sees half of it, and never through a link dlprof did not make.

Every file dlprof writes, in a run directory or at a path the user named, goes through here::

    write_text(run_dir / "report.html", page)            # whole, or not at all
    with atomic_path(part) as partial:                    # for writers that take a path (Arrow)
        pq.write_table(table, partial)
    with atomic_binary(trace) as file:                    # for writers that take a file
        file.write(data)
    with atomic_files([rank0, rank1]) as (partial0, partial1):   # several files: all or none
        ...

The data goes to a new file beside the target (same directory, so the rename cannot cross file
systems), created exclusively (``O_EXCL``: a link planted under that name is not followed), and
is renamed over the target once complete: a process killed at any moment leaves either the old
file or the new one, never a mix. A target that is a symbolic link is refused: writing through it
would change the file it points to, and a rename would silently replace the link. A failed write
removes its temporary file. Files written together (one per rank) appear together or not at all.

Errors are said in words here too: :func:`os_error_text` (a full disk named as one) and
:func:`not_a_file` (a directory, a FIFO or a device where a file was expected).
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Iterator, Sequence
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


@contextmanager
def atomic_files(paths: Sequence[Path]) -> Iterator[list[Path]]:
    """Temporary paths for several files that appear together, or not at all.

    Every target is checked before anything is written (a link among them refuses them all),
    and the temporaries are renamed over their targets only once the block has written every
    one; a failure anywhere in the block leaves none of them.

    Args:
        paths: the files to write (distinct); their directories are created if missing.

    Yields:
        One temporary path per target, in the same order.

    Raises:
        SymlinkTargetError: one of ``paths`` is a symbolic link.
    """
    for path in paths:
        refuse_symlink(path)
    partials: list[Path] = []
    try:
        for path in paths:
            path.parent.mkdir(parents=True, exist_ok=True)
            partials.append(_create_exclusively(path))
        yield partials
        for path in paths:
            refuse_symlink(path)  # once more: one may have been planted while writing
        for partial, path in zip(partials, paths, strict=True):
            os.replace(partial, path)
    except BaseException:
        for partial in partials:
            partial.unlink(missing_ok=True)
        raise


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


def replace_directory(partial: Path, path: Path) -> None:
    """Put a finished directory (:func:`partial_directory`) in place of an earlier one.

    The earlier one is moved aside under a new name made here, never a name the user may own
    (``path.old``), and removed once the new one is in place; if that fails it is put back.

    Args:
        partial: the finished directory, beside ``path``.
        path: where it goes; what is there must be dlprof's own earlier output (the caller
            checks).
    """
    if not path.exists():
        partial.rename(path)
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".replaced", dir=path.parent))
    earlier = aside / path.name
    path.rename(earlier)
    try:
        partial.rename(path)
    except BaseException:
        earlier.rename(path)
        aside.rmdir()
        raise
    shutil.rmtree(aside)


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


class NotAFileError(OSError):
    """A file to read is a link, a directory, a FIFO or a device; ``strerror`` says which."""


def read_regular(path: Path) -> bytes:
    """The bytes of a regular file found in a run, never through a link, never blocking.

    A run directory is anyone's files: its manifest may be a link to a file elsewhere, a FIFO
    that would wait for a writer forever, or ``/dev/zero``.

    Args:
        path: the file.

    Returns:
        Its contents.

    Raises:
        NotAFileError: ``path`` is a link, or not a regular file.
        OSError: it cannot be read (FileNotFoundError where it is missing).
    """
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise NotAFileError(errno.ELOOP, "a symbolic link; dlprof does not follow links in a run",
                                str(path)) from None
        raise
    with os.fdopen(descriptor, "rb") as file:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            raise NotAFileError(errno.EINVAL, _kind(mode), str(path))
        return file.read()


def not_a_file(path: Path) -> str | None:
    """What ``path`` is, in words, when it is not a regular file one can read; None when it is.

    Opening a FIFO would wait for a writer and a device may never end (``/dev/zero``), so a
    reader asks here first.

    Args:
        path: a file named by the user or found in a run (a link is followed).

    Returns:
        "no such file", "a directory", "a FIFO (named pipe)", "a character device", "a block
        device", "a socket" or "not a regular file"; None for a regular file.
    """
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "no such file" if not path.is_symlink() else "a symbolic link to nothing"
    except OSError as error:
        return f"cannot be read ({error.strerror or error})"
    return None if stat.S_ISREG(mode) else _kind(mode)


def _kind(mode: int) -> str:
    """What a file that is not a regular one is, in words, from its ``st_mode``."""
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"))
    return next((words for test, words in kinds if test(mode)), "not a regular file")


def os_error_text(error: OSError) -> str:
    """An error of the file system as one line: the file it names, and why, in words.

    Args:
        error: what an open, a write or a rename raised.

    Returns:
        ``"<file>: no space left on device (the disk is full)"``, or the system's reason.
    """
    if error.errno in DISK_FULL:
        reason = "no space left on device (the disk is full)"
    else:
        reason = error.strerror or str(error) or type(error).__name__
    return f"{error.filename}: {reason}" if error.filename else reason


# The errors a write gets when the file system has no room left (ENOSPC), or none for this user
# (EDQUOT).
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
