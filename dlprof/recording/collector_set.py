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

A collector that fails is loud: one asked for by name that cannot run here, one whose start
raises (a framework collector's, inside the program's import of the framework it then cannot
record), one whose save or step raises or whose own hook fails inside the program's call
(``Collector.hook_failed``: it is stopped there, and says so in one line), one that fails while
stopping and one that says it stopped recording (``Collector.degraded``) each add a line to the
manifest's ``degraded``, and the run then reads as degraded, not complete. Nothing a collector
raises reaches the program. Under ``strict`` what is known before the program starts (a collector asked
for that cannot run here, a start that fails) is a :class:`CollectorError` instead.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import threading
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from dlprof.collectors.base import Collector, CollectorContext
from dlprof.collectors.registry import collector_class, cupti_owner, default_collectors, in_start_order
from dlprof.config import ProfileConfig
from dlprof.recording.failures import disk_full, failure_words, say_stopped, source_stopped_reason
from dlprof.schedule import Action
from dlprof.store.manifest import CollectorInfo
from dlprof.support.import_watch import ImportWatch, when_imported
from dlprof.text import printable

# The names of dlprof's own threads (samplers, the save watchdog).
OWN_THREADS = "dlprof"


class CollectorError(Exception):
    """Under ``strict``: a collector cannot record (the message says which and why, on one line)."""


class DegradedRun(Exception):
    """Under ``strict``: the session ended with a recording that is not whole (the message says
    why, on one line; the run is saved, as ``degraded``)."""


def asked_for(config: ProfileConfig) -> frozenset[str]:
    """The collectors the user asked for by name: those configured, and ``counters`` when
    counters are named (not the default set, nor those the session adds itself)."""
    return frozenset(config.collectors or ()) | ({"counters"} if config.counters else set())


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
                 on_late_start: Callable[[], None] | None = None, *, degraded: list[str] | None = None,
                 asked: frozenset[str] = frozenset(), strict: bool = False,
                 failed_in_fork: Callable[[BaseException], None] | None = None) -> None:
        """Args:
        names: the collectors, in start order (see :func:`resolve_names`).
        infos: the manifest's collector list, filled in as collectors start and stop.
        quiet_if_absent: say nothing about a collector whose framework is not installed (the
            default set: a program cannot use a framework that is not there).
        on_late_start: told when collectors started with their framework's import (what the
            import took is the program's, not profiling's).
        degraded: the manifest's ``degraded`` list: a line is added for each collector that fails.
        asked: the collectors asked for by name (:func:`asked_for`): one of them that cannot run
            here makes the run degraded.
        strict: raise :class:`CollectorError` from :meth:`start` for a failure known there.
        failed_in_fork: told when a collector's hook fails in a forked child (after
            :meth:`forget`), whose recording is its own.
        """
        self._names = names
        self._infos = infos
        self._quiet_if_absent = quiet_if_absent
        self._degraded = degraded if degraded is not None else []
        self._asked = asked
        self._strict = strict
        self._running: list[Collector] = []
        self._dropped: list[Collector] = []  # stopped after a save or a step failed
        self._waiting: dict[str, list[type[Collector]]] = {}
        self._watches: list[ImportWatch] = []
        self._context: CollectorContext | None = None
        self._on_late_start = on_late_start
        self._failed_in_fork = failed_in_fork
        self._forgotten = False  # in a forked child: the collectors are the parent's
        self._step = 0  # the steps begun, for the reasons failures give
        # Hooks fail on any thread (autograd's, a DataLoader's): one of them stops the collector.
        self._failures = threading.Lock()
        self._failed_on_own_thread: list[Collector] = []

    def __iter__(self) -> Iterator[Collector]:
        return iter(list(self._running))

    def unavailable_asked(self) -> list[str]:
        """The collectors asked for by name that cannot run here, a line each (before any starts)."""
        lines = []
        for name in self._names:
            if name in self._asked:
                ok, reason = collector_class(name).available()
                if not ok:
                    lines.append(f"collector {name} unavailable: {reason}")
        return lines

    def start(self, context: CollectorContext) -> None:
        """Start every available collector, or wait for its framework's import.

        Raises:
            CollectorError: under ``strict``, a collector asked for cannot run here, or one
                failed to start (those started are stopped first).
        """
        self._context = context
        context.cupti_owner = cupti_owner(self._names)
        for name in self._names:
            cls = collector_class(name)
            ok, reason = cls.available()
            info = CollectorInfo(name=name, version=cls.version(), active=ok)
            self._infos.append(info)
            if not ok:
                info.notes.append(reason)
                if name in self._asked:
                    self._degraded.append(f"{name} collector unavailable: {reason}")
                if not (self._quiet_if_absent and _package_missing(cls)):
                    print(f"dlprof: collector {name} unavailable: {reason}", file=sys.stderr)
                if self._strict and name in self._asked:
                    self.stop()
                    raise CollectorError(f"collector {name} unavailable: {reason}")
                continue
            if cls.framework is not None and cls.framework not in sys.modules:
                info.active = False
                self._waiting.setdefault(cls.framework, []).append(cls)
                continue
            try:
                self._start(cls, context)
            except Exception as failure:  # the program goes on without it, said loudly
                self._failed(cls.name, "could not start", failure)
                if self._strict:
                    self.stop()
                    raise CollectorError(f"collector {cls.name} could not start: "
                                         f"{type(failure).__name__}: {failure}") from failure
        for framework in self._waiting:
            self._watches.append(when_imported(framework, self._framework_imported, self._import_failed))

    def events_show_in_memory(self) -> bool:
        """Whether a running collector's events are most of what the process gains."""
        return any(collector.events_show_in_memory for collector in self._running)

    def on_step(self, step: int, previous: Action, action: Action) -> None:
        self._step = step
        self._each_running(lambda collector: collector.on_step(step, previous, action), f"the start of step {step}")

    def save_would_split(self) -> bool:
        return any(collector.save_would_split() for collector in self._running)

    def cut(self) -> None:
        self._each_running(lambda collector: collector.cut(), "its cut before a save")

    def save(self) -> None:
        self._each_running(lambda collector: collector.save(), "its save")

    def resume(self) -> None:
        self._each_running(lambda collector: collector.resume(), "its resume after a save")

    def _each_running(self, call: Callable[[Collector], None], where: str) -> None:
        """``call`` each running collector; one that fails there records no more (a full disk
        is the run's failure, not that collector's: raised, and the session stops the recording)."""
        for collector in list(self._running):
            try:
                call(collector)
            except Exception as failure:  # never the program's error
                if disk_full(failure):
                    raise
                self._drop(collector, where, failure)

    def stop(self, report: Callable[[str], None] | None = None, quiet: bool = False) -> None:
        """Stop the running collectors in reverse start order; note those that never started.

        Args:
            report: told which collector's data is being saved (a progress display).
            quiet: note a collector's failure in the manifest only (the recording stopped, and
                that was said once already).

        Raises:
            OSError: a collector's last data found the disk full: the run's failure, not that
                collector's, raised once every collector has stopped.
        """
        for watch in self._watches:
            watch.cancel()
        for framework, waiting in self._waiting.items():
            for cls in waiting:
                self._info(cls.name).notes.append(f"the program did not import {framework}: nothing recorded")
        self._waiting.clear()
        full: Exception | None = None  # the first full disk met
        for collector in reversed(self._running):
            if report is not None:
                report(f"dlprof: saving {collector.name} data")
            try:
                collector.stop()
            except Exception as failure:  # noqa: BLE001  one collector's failure must not lose the others' data
                if disk_full(failure):
                    full = full or failure
                    self._info(collector.name).notes.append("its last data met the full disk")
                else:
                    self._failed(collector.name, "failed while stopping", failure, say=not quiet)
        for collector in [*self._running, *self._dropped]:
            self._degraded.extend(f"{collector.name} collector {line}" for line in collector.degraded
                                  if f"{collector.name} collector {line}" not in self._degraded)
        if full is not None:
            raise full

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
        self._forgotten = True

    def _framework_imported(self, module: ModuleType) -> None:
        """Start the collectors waiting for ``module``; this runs inside the program's import."""
        waiting = self._waiting.pop(module.__name__, [])
        if self._context is None:
            return
        for cls in waiting:
            try:
                self._start(cls, self._context)
            except Exception as failure:  # noqa: BLE001  raising would fail the program's own import
                # The program uses the framework (it imports it now) and this collector cannot record it.
                self._failed(cls.name, "could not start", failure)
        # Start order holds across frameworks too: a later start joins in its place.
        order = {name: index for index, name in enumerate(self._names)}
        self._running.sort(key=lambda collector: order[collector.name])
        if self._on_late_start is not None:
            self._on_late_start()

    def _import_failed(self, framework: str, failure: BaseException) -> None:
        """Starting what waited for ``framework`` failed past the collectors' own starts (each
        of those is caught and said on its own): said once, and the run is degraded."""
        say_stopped(f"{failure_words(failure)} when the program imported {framework}", self._degraded)

    def _start(self, cls: type[Collector], context: CollectorContext) -> None:
        collector = cls()
        collector.hook_failed = functools.partial(self._hook_failed, collector)
        collector.start(context)
        info = self._info(cls.name)
        info.notes.extend(note for note in collector.notes if note not in info.notes)
        collector.notes = info.notes  # notes added later land in the manifest too
        info.active = collector.active
        self._running.append(collector)

    def _note_failure(self, name: str, what: str, failure: Exception, say: bool = True) -> None:
        note = f"{what}: {type(failure).__name__}: {failure}"
        self._info(name).notes.append(note)
        if say:
            print(f"dlprof: collector {name} {printable(note)}", file=sys.stderr)

    def _failed(self, name: str, what: str, failure: Exception, say: bool = True) -> None:
        """A collector failed: noted, said (unless ``say`` is off), and the run is degraded."""
        self._note_failure(name, what, failure, say=say)
        self._info(name).active = False
        self._degraded.append(f"{name} collector {what}: {type(failure).__name__}: {failure}")

    def _hook_failed(self, collector: Collector, where: str, failure: BaseException) -> None:
        """One of a collector's hooks raised inside the program's call: the collector is stopped
        (once, whichever thread finds it failing first); in a forked child the child's recording
        stops instead."""
        if self._forgotten:
            if self._failed_in_fork is not None:
                self._failed_in_fork(failure)
            return
        self._drop(collector, where, failure)

    def _drop(self, collector: Collector, where: str, failure: BaseException) -> None:
        """A collector whose save, step or hook failed records no more: stopped now, as well as
        it can be, with one line on stderr and a reason in ``degraded``. One that failed on a
        thread of its own (a sampler's, whose loop has ended) is stopped with the others
        instead, so that what it took before is saved as theirs is."""
        on_own_thread = threading.current_thread().name.startswith(OWN_THREADS)
        with self._failures:
            if collector not in self._running or collector in self._failed_on_own_thread:
                return  # stopped already: its hooks may still fail once more on another thread
            if on_own_thread:
                self._failed_on_own_thread.append(collector)
            else:
                self._running.remove(collector)
                self._dropped.append(collector)
        reason = source_stopped_reason(f"{collector.name} collector", where, failure, self._step)
        info = self._info(collector.name)
        info.notes.append(reason)
        info.active = False
        say_stopped(reason, self._degraded)
        if on_own_thread:
            return
        try:
            collector.stop()
        except Exception as second:  # noqa: BLE001  already failed: only noted
            info.notes.append(f"then failed while stopping: {type(second).__name__}: {second}")

    def _info(self, name: str) -> CollectorInfo:
        return next(info for info in self._infos if info.name == name)


def _package_missing(cls: type[Collector]) -> bool:
    return cls.requires is not None and importlib.util.find_spec(cls.requires[0]) is None
