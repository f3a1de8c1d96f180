"""The collector contract: ``available()``, ``start(context)``, ``stop()``, optional step hooks.

A collector that cannot work here says why once, from ``available()``, and the run goes on
without it. One that stops recording while the program runs (another profiler took its place)
says why in ``degraded``: the run is then not complete. A collector's hooks run inside the
program's own calls (a module's forward, the optimizer's step, a DataLoader's fetch): each
catches its own failures, never the program's, and hands them to :attr:`Collector.hook_failed`,
which stops the collector there::

    def _pre_forward(self, module, args):
        try:
            ...                                   # dlprof's work only
        except Exception as failure:              # never the program's: it is not called here
            self.hook_failed("its forward pre-hook", failure)
 Collectors write only through the sink in their context. What a collector is (its
name, the framework it waits for, whether it is in the default set, when it starts) are class
attributes, which :mod:`dlprof.collectors.registry` and the session read.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar

from dlprof.config import ProfileConfig
from dlprof.schedule import Action
from dlprof.store.manifest import ClockDomain
from dlprof.store.save_jobs import Cycle, OpenSlice
from dlprof.store.sink import Sink
from dlprof.store.slice_buffer import SliceBuffer


def _ignore_counts(slice_id: int, before: tuple[int, ...], after: tuple[int, ...]) -> None:
    """No counters, or no session to keep their deltas."""


def _nothing_to_save() -> None:
    """Not in a forked child: the session saves the slice buffer itself."""


def _no_session_steps() -> None:
    """No session whose steps could start again."""


def _no_series(*args: Any, **kwargs: Any) -> None:
    pass


def _no_conversions(cycle: Cycle) -> None:
    raise RuntimeError("no session to convert a profiler cycle")


class StepSource(Enum):
    """What ends training steps by itself under ``dlprof run`` (``auto_steps``)."""

    OPTIMIZER = "optimizer.step()"
    KERAS_FIT = "Keras Model.fit"
    PROGRAM = "the program's dlprof.step()"  # a program that ends its steps itself owns them


@dataclass
class CollectorContext:
    """What the session hands every collector at start."""

    config: ProfileConfig
    sink: Sink
    slices: SliceBuffer  # for slices timed in this process (modules, regions)
    run_dir: Path
    step: Callable[[], None]  # ends the current step, as prof.step() does
    # Starts the current step again now, leaving the time before it out of every step.
    restart_step: Callable[[], None] = _no_session_steps
    clocks: list[ClockDomain] = field(default_factory=list)  # collectors add their mappings
    devices: list[dict[str, Any]] = field(default_factory=list)  # accelerators, as sources describe them
    action: Action = Action.NONE  # the current step's action, kept up to date by the session
    # Set by the counters collector: read at step and region boundaries, deltas become metrics
    # rows named counter_metrics[i] (empty reading: nothing to count from this thread).
    counter_reader: Callable[[], tuple[int, ...]] | None = None
    counter_metrics: tuple[str, ...] = ()
    counter_scope: str = "thread"
    # Set by the session: keeps the deltas ``after - before`` of two counter_reader readings as
    # metrics rows of slice ``slice_id`` (a collector's own slices: layers).
    record_counts: Callable[[int, tuple[int, ...], tuple[int, ...]], None] = _ignore_counts
    # In a forked child (a DataLoader worker), saves ``slices`` once it holds many; a collector
    # recording there calls it now and then (see dlprof.recording.forks).
    save_if_full: Callable[[], None] = _nothing_to_save
    # While set, only this source ends steps by itself: a Keras fit owns them while it runs, so
    # a torch optimizer stepped inside one (a callback training a torch model) ends none.
    step_owner: StepSource | None = None
    # The collector the session lets subscribe to CUPTI (see Collector.cupti_priority).
    cupti_owner: str | None = None
    # Hands the session a profiler cycle saved to a file: it is converted with the next save
    # (dlprof.recording.finisher), and the result goes to the collector's converted().
    convert: Callable[[Cycle], None] = _no_conversions
    # Records metric values in the series table, as Session.log (a Keras fit's logs).
    log: Callable[..., None] = _no_series


class Collector(ABC):
    """One live source of events."""

    name: ClassVar[str]
    description: ClassVar[str]
    # The package it is built on: its import name, and the dlprof extra that installs it ("" for
    # a package dlprof itself depends on).
    requires: ClassVar[tuple[str, str] | None] = None
    # The installed distribution's name, where it differs from the import name (pynvml is
    # installed as nvidia-ml-py): what version() asks for.
    distribution: ClassVar[str | None] = None
    # The module whose import starts it: a framework the program may never use (torch in a
    # Keras program) is never imported by dlprof. None: it starts with the session.
    framework: ClassVar[str | None] = None
    # In the set used when no collectors are named.
    default: ClassVar[bool] = False
    # Added by the session or by `dlprof run` (step sources, the rank clock), not named by users.
    internal: ClassVar[bool] = False
    # Collectors start in this order (then as named) and stop in reverse.
    start_order: ClassVar[int] = 100
    # Set on collectors that subscribe to CUPTI, which takes one subscriber per process: the
    # session lets the available one with the lowest number subscribe (context.cupti_owner).
    cupti_priority: ClassVar[int | None] = None
    # Whether the memory the process gains while it records is mostly its events (so that the
    # session may count them by it before any save; see dlprof.recording.save_policy).
    events_show_in_memory: ClassVar[bool] = False

    def __init__(self) -> None:
        self.notes: list[str] = []  # what it could not do here, for the manifest
        self.active = True  # False when it started but chose not to collect (it says why in notes)
        # Why what it recorded is not the whole run, a line each (it stopped recording at step 12
        # because...): the session's manifest lists them, and the run reads as degraded.
        self.degraded: list[str] = []
        # Told by its hooks when they fail inside the program's call (what failed, "its forward
        # pre-hook", and the exception): the session's collector set stops it there and says why.
        self.hook_failed: Callable[[str, BaseException], None] = self._failed_alone

    def _failed_alone(self, where: str, failure: BaseException) -> None:
        """A hook failed with no session to stop this collector (one started on its own): the
        failure is kept in ``degraded`` once, and never raised into the program."""
        line = f"failed in {where}: {type(failure).__name__}: {failure}"
        if line not in self.degraded:
            self.degraded.append(line)

    @classmethod
    def available(cls) -> tuple[bool, str]:
        """Whether it can run here, and if not, why (one line)."""
        if cls.requires is not None and importlib.util.find_spec(cls.requires[0]) is None:
            package, extra = cls.requires
            install = f"dlprof[{extra}]" if extra else package
            return False, f"{package} is not installed (pip install '{install}')"
        return True, ""

    @classmethod
    def version(cls) -> str:
        """The version of the package it is built on."""
        name = cls.distribution or (cls.requires[0] if cls.requires is not None else None)
        if name is None:
            return ""
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return ""

    @abstractmethod
    def start(self, context: CollectorContext) -> None:
        """Begin collecting; the current step's action is ``context.action``.

        A collector with a ``framework`` starts once the program has imported it, which may be
        many steps into the session, from inside the program's import statement.
        """

    @abstractmethod
    def stop(self) -> None:
        """Stop collecting and write everything still buffered."""

    def on_step(self, step: int, previous: Action, action: Action) -> None:
        """A step boundary: ``step`` begins with ``action``; the step before had ``previous``."""

    def cut(self) -> None:
        """A save (or a profiler cycle's stop) is about to hold the program: end now what the
        program has open in this collector's recording that must not span dlprof's pause (torch's
        ``record_function`` ranges), to enter it again at :meth:`resume`."""

    def save(self) -> None:
        """The session saves: write what was buffered, hand over the cycle under way (a profiler
        stopped here starts again at :meth:`resume`)."""

    def resume(self) -> None:
        """dlprof's pause of the program is over: record again (what :meth:`cut` ended is entered
        again here, after the pause, so that it never holds dlprof's time)."""

    def save_would_split(self) -> bool:
        """Whether a save now, inside a step, would cut work this collector times as one piece
        from work another source times inside it (a layer's backward from the autograd ops it
        runs): the save then waits for a better moment."""
        return False

    def open_slices(self) -> list[OpenSlice]:
        """Slices of this collector's still open when the session saves (a layer's forward
        under way): the save's slices nest under them. Each gets an id now, which its row
        keeps when it ends."""
        return []

    def converted(self, result: dict[str, Any]) -> None:
        """The result of converting one of this collector's cycles (any thread may call it)."""

    def after_conversions(self) -> None:
        """Every cycle has been converted (after stop): sum up what the results said."""
