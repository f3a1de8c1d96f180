"""One writer per rank of a run, and room kept on its disk for the run's last word.

Two ``dlprof run -o SAME`` at once would both write rank 0: parts overwriting each other, every
step twice, a run that reads as complete. So a writer holds an exclusive ``flock`` on a file in
the run for as long as it writes::

    lock = WriterLock(run_dir, rank)
    lock.acquire()          # RunInUseError while another live process holds it
    ...
    lock.free_reserve()     # the disk is full: the room kept for the final manifest
    lock.release()

The kernel drops the lock when its holder dies however it dies (SIGKILL, out of memory), so a
killed writer leaves no lock behind, only a small file that the next writer locks again. Forked
children (DataLoader workers, which save chunks of their own) share their parent's lock; other
processes the program starts do not inherit it.

The lock file also keeps :data:`RESERVE_BYTES` of the disk while the run is written: a write that
finds the disk full frees them (:meth:`WriterLock.free_reserve`), so the run's manifest can still
say why its recording stopped.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from pathlib import Path

# The lock file of each rank, hidden among the run's files.
LOCK_NAME = ".writer-rank={rank}.lock"
LOCK_GLOB = ".writer-rank=*.lock"
# Kept for the final manifest (a few kB; a run's notes and collectors rarely pass 100 kB).
RESERVE_BYTES = 128 << 10
# A lock found held is asked for again this often, this far apart: a reader's in_use() holds it
# shared for microseconds, a writer for its whole run.
_TRIES = 5
_RETRY_S = 0.02


class RunInUseError(FileExistsError):
    """Another live process writes this run; the message is one line naming what to do."""

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


class WriterLock:
    """The exclusive right to write one rank of one run, held until released or the process ends."""

    def __init__(self, run_dir: Path, rank: int) -> None:
        self.path = run_dir / LOCK_NAME.format(rank=rank)
        self.run_dir = run_dir
        self._descriptor: int | None = None
        self._pid_line = f"{os.getpid()}\n".encode()

    def acquire(self) -> None:
        """Take the lock (the run directory must exist), and keep the reserve on the disk.

        Raises:
            RunInUseError: another live process holds it.
            OSError: the lock file cannot be made (a full disk, a read-only directory).
        """
        tries = 0
        while True:
            descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(descriptor)
                os.close(descriptor)
                tries += 1
                if tries < _TRIES:  # a reader asking in_use() holds it shared for a moment
                    time.sleep(_RETRY_S)
                    continue
                raise RunInUseError(
                    errno.EBUSY, f"in use: {holder or 'another process'} is writing this run; wait for it "
                    "to end, or choose another directory", str(self.run_dir)) from None
            except BaseException:
                os.close(descriptor)
                raise
            if _same_file(descriptor, self.path):
                break
            os.close(descriptor)  # removed by a writer that ended meanwhile: lock the new one
        self._descriptor = descriptor
        os.ftruncate(descriptor, 0)
        os.write(descriptor, self._pid_line)
        with contextlib.suppress(OSError):  # no room even for that: the run simply has no reserve
            os.posix_fallocate(descriptor, len(self._pid_line), RESERVE_BYTES)

    def free_reserve(self) -> None:
        """Give the reserve back to the disk (a write found it full)."""
        if self._descriptor is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._descriptor, len(self._pid_line))

    def release(self) -> None:
        """Remove the lock file and let go of the lock (once the run's last file is written)."""
        descriptor, self._descriptor = self._descriptor, None
        if descriptor is None:
            return
        # Removed while still held, so that no one locks a file about to be removed (a process
        # that opened it meanwhile sees it gone after locking, and opens a new one).
        with contextlib.suppress(OSError):
            if _same_file(descriptor, self.path):
                self.path.unlink()
        os.close(descriptor)

    def forget(self) -> None:
        """In a forked child: the lock is the parent's (the child shares it; it never releases it)."""
        self._descriptor = None


def in_use(run_dir: Path) -> str | None:
    """Whether a live process writes ``run_dir``, and which, read without writing anything.

    Args:
        run_dir: a run directory.

    Returns:
        ``"dlprof (pid N)"`` for the first rank whose lock is held, or None.
    """
    for path in sorted(run_dir.glob(LOCK_GLOB)) if run_dir.is_dir() else ():
        try:
            descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _holder(descriptor) or "another process"
        except OSError:
            continue
        finally:
            os.close(descriptor)
    return None


def _holder(descriptor: int) -> str:
    """Who holds a lock, from the pid its holder wrote first in the file."""
    try:
        first = os.pread(descriptor, 24, 0).partition(b"\n")[0]
    except OSError:
        return ""
    return f"dlprof (pid {int(first)})" if first.isdigit() else ""


def _same_file(descriptor: int, path: Path) -> bool:
    try:
        named = path.stat(follow_symlinks=False)
    except OSError:
        return False
    held = os.fstat(descriptor)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)
