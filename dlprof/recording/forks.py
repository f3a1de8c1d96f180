"""Following the processes a profiled program forks: DataLoader workers, above all.

A forked child inherits the session, so regions and the dataloader collector's slices recorded
there land in the child's copy of the slice buffer. :class:`ForkFollower` restarts that copy
with the child's pid and an id slot of its own, and saves it as chunks of the same rank, so a
worker's slices sit beside the step that waited for them::

    follower = ForkFollower(session.slices, session.sink, run_dir, on_child=forget_parent_state)
    follower.follow()          # at start
    follower.gather()          # at stop: live children save what they hold, and stop recording
    follower.unfollow()

A child saves when it has buffered many slices, at least every second while it records (a
batch at a time: the dataloader collector asks after each), when it exits, and when the parent
stops: the parent signals its live forked children (``SIGURG``, which nothing else uses), each
saves and acknowledges with a small file, and records nothing more, so a persistent worker
(``persistent_workers=True``) or a worker still alive when profiling stops loses nothing. Each
child says how many slices of each kind it saved; the parent puts the counts in the manifest.

A child that ends normally (``sys.exit``, the end of the script) leaves through ``os._exit``
once its own exit handlers have run, as multiprocessing's children do: a forked copy of a
process whose torch.profiler ran would otherwise hang in libkineto's static destructors (a
condition variable with a waiter in the parent and none in the child).

Only forked children are followed: workers started with ``spawn`` or ``forkserver`` begin a new
interpreter without the session; children the program started otherwise are counted in the
manifest as not followed. A child killed with SIGKILL loses what it had not saved.
"""

from __future__ import annotations

import atexit
import json
import multiprocessing.util
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from dlprof.recording.failures import failure_words
from dlprof.recording.pauses import PauseCause, Pauses
from dlprof.recording.save_policy import in_dlprof_code
from dlprof.store.ids import forked_slot
from dlprof.store.safe_files import write_text
from dlprof.store.sink import Sink
from dlprof.store.slice_buffer import SliceBuffer
from dlprof.text import printable

# A child saves its buffer once it holds this many slices, or once this long has passed since
# its last save, not only at exit.
SAVE_EVERY = 20_000
SAVE_EVERY_NS = 1_000_000_000
# The signal a stopping parent sends its forked children: save, acknowledge, record no more.
GATHER_SIGNAL = signal.SIGURG
# Where children acknowledge (in the run directory), a folder per rank: each rank of a job
# gathers its own children and removes its own folder while the others still use theirs.
ACKS = "forks-rank={rank}"

_active: ForkFollower | None = None
_registered = False


class ForkFollower:
    """Keeps the slices a forked child records, under the parent's rank."""

    def __init__(self, slices: SliceBuffer, sink: Sink, run_dir: Path, on_child: Callable[[], None],
                 pauses: Pauses | None = None) -> None:
        self.slices = slices
        self.pauses = pauses  # a child's writes hold its thread: dlprof's pauses
        self.sink = sink
        self.run_dir = run_dir
        self.on_child = on_child  # the session forgets what belongs to the parent
        self.forks = 0
        self.in_child = False
        self.stopped = False  # in a child: the parent stopped profiling; record nothing more
        self.exit_code = 0
        self._saved_at = 0
        self._saved_kinds: dict[str, int] = {}
        self._wanted = False  # a save the parent asked for while dlprof's code ran
        self.failed = False  # in a child: a save failed (a full disk); nothing more is recorded

    def follow(self) -> None:
        """Follow every fork from now on (until :meth:`unfollow`)."""
        global _active, _registered
        _active = self
        if not _registered:
            os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
            _registered = True
        # multiprocessing clears inherited finalizers in its children, then runs these.
        multiprocessing.util.register_after_fork(self, ForkFollower._save_at_exit)

    def unfollow(self) -> None:
        global _active
        if _active is self:
            _active = None

    # --- in a child -----------------------------------------------------------------------

    def save(self) -> None:
        """Write what this child recorded since the last save (nothing in the parent).

        A save that fails (a full disk) closes the child's recording with one line on stderr;
        the worker itself goes on: its batches are the program's.
        """
        if not self.in_child or self.failed:
            return
        began = self._saved_at = time.perf_counter_ns()
        if len(self.slices) or self._wanted:
            try:
                batch = self.slices.drain()
                self.sink.append_slices(batch, f"fork{os.getpid()}")
                for kind in batch.column("kind").to_pylist():
                    self._saved_kinds[kind] = self._saved_kinds.get(kind, 0) + 1
                self._acknowledge()
                if self.pauses is not None and batch.num_rows:  # saved with the child's next save
                    self.pauses.record(began, PauseCause.FLUSH, inside_step=False, inside_layer=False)
            except Exception as failure:  # noqa: BLE001  dlprof's failure is never the program's
                self.stop_on_failure(failure)

    def collector_failed(self, failure: BaseException) -> None:
        """In a child: a collector's hook failed here. What the child recorded before is saved,
        then its recording stops (:meth:`stop_on_failure`)."""
        self.save()
        self.stop_on_failure(failure)

    def stop_on_failure(self, failure: BaseException) -> None:
        """In a child: dlprof failed here (a save, a collector's hook, following the fork): say
        so in one line, once, and record nothing more; the child goes on."""
        if self.failed:
            return
        self.failed = True
        self.slices.closed = True
        print(f"dlprof: forked process {os.getpid()}: {printable(failure_words(failure))}: "
              "its recording stopped", file=sys.stderr)

    def save_if_full(self) -> None:
        """A collector recording in a child calls this now and then (after each batch)."""
        if self.in_child and (self._wanted or len(self.slices) >= SAVE_EVERY
                              or time.perf_counter_ns() - self._saved_at >= SAVE_EVERY_NS):
            self.save()
            self._wanted = False

    def _start_child(self) -> None:
        self.in_child = True
        # The way out first, so that a child whose start fails below still leaves without the
        # static destructors. Registered first of this child's exit handlers, it runs last.
        atexit.register(self._leave)
        _record_exit_code(self)
        self._saved_at = time.perf_counter_ns()
        self.slices.restart_in_fork(os.getpid(), forked_slot(self.forks))
        self.on_child()
        atexit.register(self.save)
        signal.signal(GATHER_SIGNAL, self._gathered)
        signal.siginterrupt(GATHER_SIGNAL, False)

    def _gathered(self, signum: int, frame: FrameType | None) -> None:
        """The parent stops: save now (or after the batch under way) and record no more."""
        self.stopped = True
        self.slices.closed = True
        self._wanted = True  # acknowledged even with nothing to save
        if not in_dlprof_code(frame):  # else the dataloader collector saves after its batch
            self.save()

    def _acknowledge(self) -> None:
        """Tell the parent what this child saved so far (a small file, replaced whole)."""
        path = self._acks_dir() / f"{os.getpid()}.json"
        write_text(path, json.dumps({"kinds": self._saved_kinds, "stopped": self.stopped}))

    def _acks_dir(self) -> Path:
        return self.run_dir / ACKS.format(rank=self.slices.rank)

    def _leave(self) -> None:
        """The child's last exit handler: leave without the C++ static destructors."""
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(self.exit_code)

    def _save_at_exit(self) -> None:
        if self.in_child:
            multiprocessing.util.Finalize(None, self.save, exitpriority=100)

    # --- in the parent ----------------------------------------------------------------------

    def gather(self, timeout_s: float = 3.0) -> dict[str, Any]:
        """Ask the live forked children to save, wait for them, and say what every child saved.

        Returns:
            ``children``: per child pid, slices saved by kind; ``not_answering``: live children
            that did not acknowledge in time; ``not_followed``: child processes the program
            started otherwise (their command lines).
        """
        import psutil

        acks = self._acks_dir()
        try:
            children = psutil.Process().children()
        except psutil.Error:
            children = []
        own = _cmdline(psutil.Process())
        forked = [c for c in children if _cmdline(c) == own]
        others = [c for c in children if c not in forked and "dlprof.recording.finisher" not in _cmdline(c)]
        asked_at = time.time()
        for child in forked:
            try:
                os.kill(child.pid, GATHER_SIGNAL)
            except ProcessLookupError:
                continue
        waiting = {c.pid for c in forked}
        deadline = time.monotonic() + timeout_s
        while waiting and time.monotonic() < deadline:
            for pid in list(waiting):
                ack = acks / f"{pid}.json"
                if not psutil.pid_exists(pid) or (ack.exists() and ack.stat().st_mtime >= asked_at):
                    waiting.discard(pid)
            time.sleep(0.02)
        saved = {}
        for ack in sorted(acks.glob("*.json")) if acks.is_dir() else []:
            try:
                saved[ack.stem] = json.loads(ack.read_text())["kinds"]
            except (OSError, ValueError, KeyError):
                continue
            ack.unlink(missing_ok=True)
        try:
            acks.rmdir()
        except OSError:  # not there (no child saved), or a late acknowledgement in it
            pass
        return {
            "children": saved,
            "not_answering": sorted(waiting),
            "not_followed": [" ".join(_cmdline(c))[:200] for c in others],
        }


def _cmdline(process: Any) -> list[str]:
    try:
        return list(process.cmdline())
    except Exception:  # noqa: BLE001  a process gone or not ours to read: it has no command line here
        return []


def _record_exit_code(follower: ForkFollower) -> None:
    """Keep, in a child, the code it exits with, for the exit that skips the destructors."""
    exit_now = sys.exit
    excepthook = sys.excepthook

    def exit_with(code: str | int | None = None) -> NoReturn:
        follower.exit_code = code if isinstance(code, int) else (0 if code is None else 1)
        exit_now(code)

    def failed(kind: type[BaseException], value: BaseException, traceback: Any) -> None:
        follower.exit_code = 1
        excepthook(kind, value, traceback)

    sys.exit = exit_with
    sys.excepthook = failed


def _before_fork() -> None:
    if _active is not None and not _active.in_child:
        _active.forks += 1


def _after_fork_in_child() -> None:
    global _active
    follower = _active
    if follower is None or follower.in_child:
        _active = None  # a grandchild is not followed: its parent is no rank's main process
        return
    try:
        follower._start_child()
    except Exception as failure:  # noqa: BLE001  Python would print it as a traceback in the program's child
        follower.in_child = True  # whatever the child recorded is not the parent's
        follower.stop_on_failure(failure)
