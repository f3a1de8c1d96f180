"""Following the processes a profiled program forks: DataLoader workers, above all.

A forked child inherits the session, so regions and the dataloader collector's slices recorded
there land in the child's copy of the slice buffer. :class:`ForkFollower` restarts that copy
with the child's pid and an id slot of its own, and saves it as chunks of the same rank when the
child exits, so a worker's slices sit beside the step that waited for them::

    follower = ForkFollower(session.slices, session.sink, on_child=forget_parent_collectors)
    follower.follow()      # at start
    follower.unfollow()    # at stop

Only forked children are followed: workers started with ``spawn`` or ``forkserver`` begin a new
interpreter without the session. A child's slices are saved when it exits (a multiprocessing
child through multiprocessing's finalizers, a bare ``os.fork`` child at interpreter exit) and
whenever it has buffered many; a child killed with SIGKILL loses what it had not saved.
"""

from __future__ import annotations

import atexit
import multiprocessing.util
import os
from collections.abc import Callable

from dlprof.store.ids import forked_slot
from dlprof.store.sink import Sink
from dlprof.store.slice_buffer import SliceBuffer

# A child saves its buffer once it holds this many slices, not only at exit.
SAVE_EVERY = 20_000

_active: ForkFollower | None = None
_registered = False


class ForkFollower:
    """Keeps the slices a forked child records, under the parent's rank."""

    def __init__(self, slices: SliceBuffer, sink: Sink, on_child: Callable[[], None]) -> None:
        self.slices = slices
        self.sink = sink
        self.on_child = on_child  # the session forgets what belongs to the parent
        self.forks = 0
        self.in_child = False

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

    def save(self) -> None:
        """Write what this child recorded since the last save (nothing in the parent)."""
        if self.in_child and len(self.slices):
            self.sink.append_slices(self.slices.drain(), f"fork{os.getpid()}")

    def save_if_full(self) -> None:
        if self.in_child and len(self.slices) >= SAVE_EVERY:
            self.save()

    def _start_child(self) -> None:
        self.in_child = True
        self.slices.restart_in_fork(os.getpid(), forked_slot(self.forks))
        self.on_child()
        atexit.register(self.save)

    def _save_at_exit(self) -> None:
        if self.in_child:
            multiprocessing.util.Finalize(None, self.save, exitpriority=100)


def _before_fork() -> None:
    if _active is not None and not _active.in_child:
        _active.forks += 1


def _after_fork_in_child() -> None:
    global _active
    follower = _active
    if follower is None or follower.in_child:
        _active = None  # a grandchild is not followed: its parent is no rank's main process
        return
    follower._start_child()
