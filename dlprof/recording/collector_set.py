"""The collectors of one session: which ones, in what order, when each starts, who owns CUPTI.

    collectors = CollectorSet(resolve_names(config), infos=manifest.collectors)
    collectors.start(context)      # now, or once the program imports each one's framework
    collectors.cut(); collectors.save(); collectors.resume()   # at every save of the session
    collectors.stop(report)        # in reverse start order; a failure is noted, never raised

A collector whose ``framework`` the program has not imported yet waits for it: one import watch
per framework starts every collector waiting for it, in start order, from inside the program's
own import statement (a Keras program never imports torch, so it never starts torch.profiler).
A collector that cannot run here says why once; in the default set, one whose framework is not
installed says nothing (the manifest notes it).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from dlprof.collectors.base import Collector, CollectorContext
from dlprof.collectors.registry import collector_class, cupti_owner, default_collectors, in_start_order
from dlprof.config import ProfileConfig
from dlprof.schedule import Action
from dlprof.store.manifest import CollectorInfo
from dlprof.support.import_watch import ImportWatch, when_imported


def resolve_names(config: ProfileConfig) -> tuple[str, ...]:
    """The collectors a session runs, in start order: those configured (the default set when
    none are), ``counters`` when counters are named, the step sources under ``dlprof run``
    (``auto_steps``), and the rank clock in a job of several ranks."""
    names = list(config.collectors if config.collectors is not None else default_collectors())
    if config.counters:
        names.append("counters")
    if config.auto_steps:
        names += ["optimizer_steps", "keras_steps"]
    if config.world_size > 1:
        names.append("rank_clock")
    return in_start_order(names)


class CollectorSet:
    """Starts, steps, saves and stops the collectors of one session."""

    def __init__(self, names: tuple[str, ...], infos: list[CollectorInfo], quiet_if_absent: bool,
                 on_late_start: Callable[[], None] | None = None) -> None:
        """Args:
        names: the collectors, in start order (see :func:`resolve_names`).
        infos: the manifest's collector list, filled in as collectors start and stop.
        quiet_if_absent: say nothing about a collector whose framework is not installed (the
            default set: a program cannot use a framework that is not there).
        on_late_start: told when collectors started with their framework's import (what the
            import took is the program's, not profiling's).
        """
        self._names = names
        self._infos = infos
        self._quiet_if_absent = quiet_if_absent
        self._running: list[Collector] = []
        self._waiting: dict[str, list[type[Collector]]] = {}
        self._watches: list[ImportWatch] = []
        self._context: CollectorContext | None = None
        self._on_late_start = on_late_start

    def __iter__(self) -> Iterator[Collector]:
        return iter(list(self._running))

    def start(self, context: CollectorContext) -> None:
        """Start every available collector, or wait for its framework's import."""
        self._context = context
        context.cupti_owner = cupti_owner(self._names)
        for name in self._names:
            cls = collector_class(name)
            ok, reason = cls.available()
            info = CollectorInfo(name=name, version=cls.version(), active=ok)
            self._infos.append(info)
            if not ok:
                info.notes.append(reason)
                if not (self._quiet_if_absent and _package_missing(cls)):
                    print(f"dlprof: collector {name} unavailable: {reason}", file=sys.stderr)
                continue
            if cls.framework is not None and cls.framework not in sys.modules:
                info.active = False
                self._waiting.setdefault(cls.framework, []).append(cls)
                continue
            self._start(cls, context)
        for framework in self._waiting:
            self._watches.append(when_imported(framework, self._framework_imported))

    def events_show_in_memory(self) -> bool:
        """Whether a running collector's events are most of what the process gains."""
        return any(collector.events_show_in_memory for collector in self._running)

    def on_step(self, step: int, previous: Action, action: Action) -> None:
        for collector in self._running:
            collector.on_step(step, previous, action)

    def save_would_split(self) -> bool:
        return any(collector.save_would_split() for collector in self._running)

    def cut(self) -> None:
        for collector in self._running:
            collector.cut()

    def save(self) -> None:
        for collector in self._running:
            collector.save()

    def resume(self) -> None:
        for collector in self._running:
            collector.resume()

    def stop(self, report: Callable[[str], None] | None = None) -> None:
        """Stop the running collectors in reverse start order; note those that never started."""
        for watch in self._watches:
            watch.cancel()
        for framework, waiting in self._waiting.items():
            for cls in waiting:
                self._info(cls.name).notes.append(f"the program did not import {framework}: nothing recorded")
        self._waiting.clear()
        for collector in reversed(self._running):
            if report is not None:
                report(f"dlprof: saving {collector.name} data")
            try:
                collector.stop()
            except Exception as failure:  # noqa: BLE001  one collector's failure must not lose the others' data
                self._note_failure(collector.name, "failed while stopping", failure)

    def converted(self, name: str, result: dict[str, Any]) -> None:
        """One of a collector's cycles was converted (from the finisher's thread, or at stop)."""
        for collector in self._running:
            if collector.name == name:
                collector.converted(result)

    def after_conversions(self) -> None:
        """Every cycle is converted: each collector sums up its results."""
        for collector in self._running:
            try:
                collector.after_conversions()
            except Exception as failure:  # noqa: BLE001  the run is saved; only a summary is missing
                self._note_failure(collector.name, "failed summing up its conversions", failure)

    def forget(self) -> None:
        """In a forked child: the collectors' threads and profilers stayed with the parent."""
        for watch in self._watches:
            watch.cancel()
        self._running = []
        self._waiting.clear()

    def _framework_imported(self, module: ModuleType) -> None:
        """Start the collectors waiting for ``module``; this runs inside the program's import."""
        waiting = self._waiting.pop(module.__name__, [])
        if self._context is None:
            return
        for cls in waiting:
            try:
                self._start(cls, self._context)
            except Exception as failure:  # noqa: BLE001  raising would fail the program's own import
                self._note_failure(cls.name, "could not start", failure)
        # Start order holds across frameworks too: a later start joins in its place.
        order = {name: index for index, name in enumerate(self._names)}
        self._running.sort(key=lambda collector: order[collector.name])
        if self._on_late_start is not None:
            self._on_late_start()

    def _start(self, cls: type[Collector], context: CollectorContext) -> None:
        collector = cls()
        collector.start(context)
        info = self._info(cls.name)
        info.notes.extend(note for note in collector.notes if note not in info.notes)
        collector.notes = info.notes  # notes added later land in the manifest too
        info.active = collector.active
        self._running.append(collector)

    def _note_failure(self, name: str, what: str, failure: Exception) -> None:
        note = f"{what}: {type(failure).__name__}: {failure}"
        self._info(name).notes.append(note)
        print(f"dlprof: collector {name} {note}", file=sys.stderr)

    def _info(self, name: str) -> CollectorInfo:
        return next(info for info in self._infos if info.name == name)


def _package_missing(cls: type[Collector]) -> bool:
    return cls.requires is not None and importlib.util.find_spec(cls.requires[0]) is None
