"""A profiling session: starts and stops collectors, owns the sink, counts steps, records regions.

    with Session(ProfileConfig(name="train")) as session:
        for batch in data:
            train_step(batch)
            session.step()

Whatever ends the program (normal end, an exception, Ctrl-C, SIGTERM), the session writes what
it has, marks the run ``complete``, ``failed`` or ``interrupted``, and lets the exception go on.
A run whose recording is not whole (a collector that could not start or stopped recording: the
manifest's ``degraded`` says why) is ``degraded`` where it would have been complete; with
``strict`` that is an error: :class:`CollectorError` at start where the failure is known then,
:class:`DegradedRun` when the session ends otherwise. dlprof's own failures never reach the
program: a save that fails (a full disk) stops the recording with one line on stderr and a reason
in the manifest (:mod:`dlprof.recording.failures`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from dlprof.clock import sample_clocks
from dlprof.collectors.base import CollectorContext, StepSource
from dlprof.config import RUNS_DIR, ProfileConfig
from dlprof.distributed import shared_run_dir
from dlprof.keys import Kind, RunStatus, SeriesSource
from dlprof.recording.collector_set import (
    CollectorError,
    CollectorSet,
    DegradedRun,
    asked_for,
    resolve_names,
)
from dlprof.recording.failures import degraded_reason, disk_full, failure_words, stops_recording_on_failure
from dlprof.recording.finisher import Result
from dlprof.recording.forks import ForkFollower
from dlprof.recording.pauses import PauseCause, Pauses
from dlprof.recording.save_policy import TRACE_BYTES_PER_EVENT, MidStepSaves, SaveClock, SaveLimits
from dlprof.recording.saves import Saver
from dlprof.recording.sigterm import SigtermGuard, status_for
from dlprof.schedule import Action
from dlprof.store.counter_deltas import CounterDeltas
from dlprof.store.manifest import ClockDomain, HostInfo, Manifest, degraded_line
from dlprof.store.safe_files import os_error_text
from dlprof.store.save_jobs import OpenSlice
from dlprof.store.series_buffer import SeriesBuffer
from dlprof.store.sink import Sink
from dlprof.store.slice_buffer import SliceBuffer
from dlprof.store.writer import RankWriter
from dlprof.store.writer_lock import WriterLock
from dlprof.text import printable

STEP_NAME = "ProfilerStep#{}"

_active: Session | None = None


def active_session() -> Session | None:
    """The session that is recording in this process, if any."""
    return _active


def new_run_dir(name: str, parent: Path = RUNS_DIR) -> Path:
    """A fresh ``<parent>/<YYYYmmdd-HHMMSS>-<name>`` directory (suffixed if taken)."""
    stem = f"{time.strftime('%Y%m%d-%H%M%S')}-{name}"
    candidate = parent / stem
    number = 2
    while candidate.exists():
        candidate = parent / f"{stem}-{number}"
        number += 1
    return candidate


class Session:
    """One profiling session in this process, writing one rank of one run."""

    def __init__(self, config: ProfileConfig) -> None:
        self.config = config
        self.run_dir = config.out or (
            shared_run_dir(config.name, RUNS_DIR) if config.world_size > 1 else new_run_dir(config.name)
        )
        self.schedule = config.effective_schedule
        self.step_number = 0
        self._steps_ended_by_source = False  # an optimizer or a Keras fit ended a step by itself
        self.action = self.schedule.action(0)
        self._clock = sample_clocks()
        self._writer = RankWriter(self.run_dir, config.rank, {
            "dlprof.rank": str(config.rank),
            "dlprof.world_size": str(config.world_size),
            "dlprof.host": socket.gethostname(),
        })
        self.sink = Sink(self._writer)
        self._saver = Saver(self._writer, self.sink, on_cycle=self._cycle_converted)
        # Regions under way in any thread, by id(region): a save hands them over as open.
        self.open_regions: dict[int, Any] = {}
        self.slices = SliceBuffer(config.rank, os.getpid(), self._clock.offset_ns)
        self.series = SeriesBuffer(os.getpid(), self._clock.offset_ns)  # dlprof.log() and log pickup
        self._step_kind = self.slices.kind_code(Kind.STEP)
        self.pauses = Pauses(self.slices)  # dlprof's own pauses of the program, as slices
        self.region_kind = self.slices.kind_code(Kind.REGION)
        self._step_start = 0
        self._previous_step_start = 0
        self._step_tid = 0
        self._step_id = -1  # the current step's id, once a save inside it gave it one
        # A save due at a step boundary waits while regions that step began are open: the last
        # of them to end makes it (regions.py calls save_waited).
        self.save_waiting = False
        self._waiting_since = 0
        self._context: CollectorContext | None = None
        self._sigterm = SigtermGuard()
        self._started = False
        # One writer per rank of a run; it also keeps room on the disk for the last manifest.
        self._lock = WriterLock(self.run_dir, config.rank)
        # A save failed (a full disk): nothing more is recorded; the program goes on.
        self.recording_stopped = False
        self._stopped_by_full_disk = False  # what else the full disk fails is said by its one reason
        self._stopping = False  # stop() runs: it stops the collectors itself
        # Set by the counters collector at start; regions check it once per enter (None: no cost).
        self.counter_reader: Callable[[], tuple[int, ...]] | None = None
        self._counter_deltas: CounterDeltas | None = None
        self._step_counts: tuple[int, ...] = ()
        self.forks = ForkFollower(self.slices, self.sink, self.run_dir, on_child=self._drop_parent_state,
                                  pauses=self.pauses)
        self.manifest = Manifest(
            name=self.run_dir.name,
            command=list(config.command) or [sys.executable, *sys.argv],
            writer_pid=os.getpid(),
            host=HostInfo.this_machine(),
            ranks=[config.rank],
            world_size=config.world_size,
            schedule=str(self.schedule) if config.schedule else "",
            clocks=[
                ClockDomain(
                    name="dlprof",
                    method="perf_counter_ns + (time_ns - perf_counter_ns) sampled at start",
                    offset_ns=self._clock.offset_ns,
                    bounds_ns=(-self._clock.uncertainty_ns, self._clock.uncertainty_ns),
                )
            ],
        )
        self._save_clock = SaveClock(
            SaveLimits(config.save_seconds, config.memory_cap_bytes, config.pause_share, config.save_events),
            growth_counts_events=lambda: self._collectors.events_show_in_memory())
        self._mid_step = MidStepSaves(self._save_clock, save=lambda: self._save(within_step=True),
                                      pending_events=lambda: len(self.slices),
                                      has_steps=lambda: self.step_number > 0, quiet=self._nothing_open,
                                      would_split=self._save_would_split)
        self._collectors = CollectorSet(
            resolve_names(config), infos=self.manifest.collectors, quiet_if_absent=config.collectors is None,
            on_late_start=self._started_late, degraded=self.manifest.degraded,
            asked=asked_for(config), strict=config.strict, failed_in_fork=self.forks.collector_failed,
        )

    @property
    def recording(self) -> bool:
        """True while the current step's events are kept."""
        return self.action.records

    # --- life cycle -------------------------------------------------------------------------

    def start(self) -> Session:
        """Create the run directory, start every available collector, begin step 0.

        Raises:
            CollectorError: under ``strict``, a collector asked for by name cannot run here
                (before anything is written), or one failed to start (the run is closed as failed).
        """
        global _active
        if _active is not None:
            raise RuntimeError("a dlprof session is already active in this process")
        if self.config.strict:
            unavailable = self._collectors.unavailable_asked()
            if unavailable:
                raise CollectorError("; ".join(unavailable))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._lock.acquire()  # RunInUseError while another process writes this rank
        self.manifest.start_ns = time.time_ns()
        self._write_manifest()
        self._context = CollectorContext(
            config=self.config,
            sink=self.sink,
            slices=self.slices,
            run_dir=self.run_dir,
            step=self._source_ends_step,
            restart_step=self.restart_step,
            clocks=self.manifest.clocks,
            devices=self.manifest.devices,
            action=self.action,
            record_counts=self.record_counts,
            convert=self._saver.convert,
            save_if_full=self.forks.save_if_full,
            log=self.log,
        )
        try:
            self._collectors.start(self._context)
        except CollectorError as error:
            self.manifest.status = RunStatus.FAILED
            self.manifest.error = f"strict: {error}"
            self.manifest.end_ns = time.time_ns()
            self._write_manifest()
            raise
        self._sigterm.install()
        self._save_clock.begin_recording()  # what the collectors took to start is not profiling's growth
        self._mid_step.start()
        self.forks.follow()
        if self._context.counter_reader is not None:
            self._counter_deltas = CounterDeltas(
                self._context.counter_metrics, self._context.counter_scope
            )
            self.counter_reader = self._context.counter_reader
        _active = self
        self._started = True
        self._write_manifest()
        self._begin_step()
        return self

    def step(self) -> None:
        """Mark the end of one training step and the start of the next (the program's call:
        from then on the program ends its steps itself, and the optimizer's steps no longer do)."""
        if self._context is None:
            raise RuntimeError("step() on a session that was not started (use it in a with block)")
        taken_over = self._context.step_owner is not StepSource.PROGRAM and self._steps_ended_by_source
        self._context.step_owner = StepSource.PROGRAM
        if taken_over:
            # The optimizer ended this iteration's step a moment ago: what ran since belongs to
            # no step, and the program's steps begin now.
            self.restart_step()
            return
        self.end_step()

    def _source_ends_step(self) -> None:
        """A source that ends steps by itself (the optimizer, a Keras fit) ends one."""
        self._steps_ended_by_source = True
        self.end_step()

    @stops_recording_on_failure
    def end_step(self) -> None:
        """End the current step: the program's call, or a source that ends steps by itself."""
        if self._context is None:
            raise RuntimeError("step() on a session that was not started (use it in a with block)")
        if self.forks.in_child:
            return  # steps are the parent's
        now = time.perf_counter_ns()
        previous = self.action
        ending, start = self.step_number, self._step_start
        transition = previous is not self.schedule.action(ending + 1)
        due = (self.save_waiting or (previous is Action.RECORD_AND_SAVE and self.config.saves_by_schedule)
               or self._save_clock.at_boundary(len(self.slices), now - start) is not None)
        # A region the step began (the loop body's) ends a moment after the step: the save waits
        # until it has, so that it nests in its step as a whole run would have it. (One begun in
        # an earlier step and still open spans steps, as an epoch's does: not waited for.)
        waits = due and self._regions_begun_since(start)
        if due and not waits and self._boundary_save_would_split():
            due = False
        # Saved at once without a profiler cycle in between, the step ends where the save cuts
        # the ranges the program has open (a torch range it ends in, the optimizer's step whose
        # hook ends it, then nests in it).
        ends_at_cut = due and not waits and not transition and previous.records
        if previous.records and not ends_at_cut:
            self._record_step(start, now)
        self.step_number += 1
        self.action = self.schedule.action(self.step_number)
        self._context.action = self.action
        if transition:  # the profilers may stop or start: dlprof's time
            self._collectors.cut()
            began = time.perf_counter_ns()
            self._collectors.on_step(self.step_number, previous, self.action)
            self.pauses.record(began, PauseCause.CYCLE, inside_step=False, inside_layer=False)
            self._collectors.resume()
        if waits:
            self.save_waiting = True
            self._waiting_since = start
        elif due:
            self.save_waiting = False
            # The next step begins after the pause, before the ranges enter the next recording.
            self._save(begin_step=True,
                       on_cut=(lambda cut_ns: self._record_step(start, cut_ns, ending)) if ends_at_cut else None)
        if not transition:
            self._collectors.on_step(self.step_number, previous, self.action)
        if not due or waits:
            self._begin_step()

    def log(self, source: SeriesSource, split: str, values: Sequence[tuple[str, float | None]],
            step: int | None = None, **where: Any) -> None:
        """Record metric values (``dlprof.log``, a Keras fit's logs, MLPerf lines) in the
        ``series`` table; ``step`` defaults to the steps ended so far, ``where`` holds
        :meth:`SeriesBuffer.append`'s epoch, samples and ts_ns. A forked child logs nothing:
        its steps and its values are the parent's."""
        if not self.forks.in_child:
            self.series.append(source, split, self.step_number if step is None else step, values, **where)

    @stops_recording_on_failure
    def restart_step(self) -> None:
        """The current step starts now: the time since the last step ended belongs to no step
        (a Keras fit's validation between two epochs' batches). A step a save inside it already
        handed over as open keeps its start."""
        if self._step_id < 0 and not self.forks.in_child:
            self._begin_step()

    @stops_recording_on_failure
    def save_waited(self) -> None:
        """A region ended while a save waited for it (see step()); the save is made now, between
        two steps as any step's save is, if no other region of that step is still open."""
        if self.save_waiting and not self._regions_begun_since(self._waiting_since):
            self.save_waiting = False
            if self._boundary_save_would_split():
                self._begin_step()
            else:
                self._save(begin_step=True)

    def _boundary_save_would_split(self) -> bool:
        """Whether a save at this step boundary would cut work in two (a step ended inside a
        compiled region or an autograd node, whose C++ ranges a cut of the profiler's recording
        would corrupt): the save is then owed, made inside the next step as soon as one can be
        (MidStepSaves) or at the next boundary."""
        if not self._collectors.save_would_split():
            return False
        self._save_clock.request()
        return True

    @stops_recording_on_failure
    def _save_would_split(self) -> bool:
        """Whether a save inside the step now would cut work that nests badly across saves: a
        C++ range under way (the collectors say), or, unless memory presses, a region begun in
        the previous step still open (a loop body that the optimizer's step ended the step in:
        it is nested whole once it ends, as step boundaries' saves wait for it to)."""
        if self._collectors.save_would_split():
            return True
        crossing = any(r._tid == self._step_tid and self._previous_step_start <= r._start < self._step_start
                       for r in list(self.open_regions.values()))
        return crossing and not self._save_clock.urgent(len(self.slices))

    def _nothing_open(self) -> bool:
        """Whether no region and no layer is open: where a program without steps is saved."""
        return not self.open_regions and not any(c.open_slices() for c in self._collectors)

    def _regions_begun_since(self, since: int) -> bool:
        """Whether regions begun on the steps' thread since ``since`` are still open."""
        return any(r._tid == self._step_tid and r._start >= since for r in list(self.open_regions.values()))

    def stop(
        self,
        error: BaseException | None = None,
        exit_code: int | None = None,
        report: Callable[[str], None] | None = None,
    ) -> Manifest:
        """Stop every collector, write everything, and close the run.

        Args:
            error: what ended the profiled code, if it did not end normally.
            exit_code: the profiled program's exit code, when it is one.
            report: told, in words, which phase of saving begins (for a progress display).

        Returns:
            The final manifest.
        """
        global _active
        if not self._started:
            return self.manifest
        self._started = False
        _active = None
        if self.forks.in_child:  # a forked child saves its own slices; the run is the parent's
            self.forks.save()
            return self.manifest
        self.forks.unfollow()
        self._stopping = True
        self._mid_step.stop()
        self._sigterm.hold()
        try:
            if self.action.records:
                try:
                    self._record_step(self._step_start, time.perf_counter_ns())
                    self.manifest.partial_step = STEP_NAME.format(self.step_number)
                except Exception as failure:  # noqa: BLE001  a counter that cannot be read: noted, never raised
                    self.stop_recording(failure)
            self.counter_reader = None
            self.manifest.end_ns = time.time_ns()
            try:
                self._collectors.stop(report)
            except OSError as failure:  # a collector's last data met a full disk: the run's failure
                self.stop_recording(failure)
            children = self.forks.gather()  # their chunks join the last save's
            if report is not None:
                report("dlprof: writing the run")
            self._last_save()
            try:
                self.manifest.counts, self.manifest.normalised = self._saver.close()
            except Exception as failure:  # noqa: BLE001  the chunks stay readable: close the run anyway
                note = f"making the saves final failed ({type(failure).__name__}: {failure}); read from its chunks"
                self.manifest.notes.append(note)
                if disk_full(failure):
                    self.stop_recording(failure)  # the run's one reason, said once
                else:
                    print(f"dlprof: {printable(note)}", file=sys.stderr)
            if self._saver.failures:
                self._note_unfinished(self._saver.failures)
            self._collectors.after_conversions()
            self.manifest.saving = self._saving_summary()
            if children["children"] or children["not_followed"]:
                self.manifest.saving["forked_children"] = children
            if self._saver.child_failures:
                self.manifest.notes.append(f"{self._saver.child_failures} save(s) finished in the profiled "
                                           "process: the finisher's child process ended early")
            self.manifest.status = self.manifest.final_status(status_for(error))
            self.manifest.exit_code = exit_code
            if error is not None and self.manifest.status is not RunStatus.COMPLETE:
                self.manifest.error = f"{type(error).__name__}: {error}".strip().rstrip(":")
            self._write_last_manifest()
        finally:
            self._lock.release()
            self._sigterm.restore()
        return self.manifest

    def __enter__(self) -> Session:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        manifest = self.stop(exc)
        if self.config.strict and exc is None and manifest.status is RunStatus.DEGRADED:
            raise DegradedRun(f"{self.run_dir}: recording not whole: {degraded_line(manifest.degraded)}")

    # --- recording ----------------------------------------------------------------------

    def record_counts(self, slice_id: int, before: tuple[int, ...], after: tuple[int, ...]) -> None:
        """Keep the counter deltas ``after - before`` of one slice as metrics rows."""
        if self._counter_deltas is not None:
            self._counter_deltas.record(slice_id, before, after)

    def _record_step(self, start: int, end: int, number: int | None = None) -> None:
        code = self.slices.intern(STEP_NAME.format(self.step_number if number is None else number))
        slice_id = self.slices.record(self._step_kind, code, self._step_tid, start, end, -1, self._step_id)
        if self.counter_reader is not None:
            self.record_counts(slice_id, self._step_counts, self.counter_reader())

    def _begin_step(self) -> None:
        self._step_tid = threading.get_native_id()
        self._step_id = -1
        if self.counter_reader is not None:
            self._step_counts = self.counter_reader()
        self._previous_step_start = self._step_start
        self._step_start = time.perf_counter_ns()

    def _write_save(self, within_step: bool = False, final: bool = False, begin_step: bool = False,
                    on_cut: Callable[[int], None] | None = None) -> None:
        """Save what was recorded since the last save; ``within_step``: the step goes on;
        ``final``: the run ends (the program is no longer held, so no pause is recorded);
        ``begin_step``: a step boundary's save: the next step begins after the pause, before the
        collectors record again (so what they enter again lies in it); ``on_cut``: told the
        moment the collectors ended what the program had open (the step ends there).

        The pause it makes is recorded as a slice from after the collectors ended what the
        program had open in their recordings (cut) to before they record again (resume), so
        that nothing recorded crosses it."""
        for_memory = within_step and self._save_clock.pressing(len(self.slices))
        self._collectors.cut()
        began = time.perf_counter_ns()
        if on_cut is not None:
            on_cut(began)
        if final:  # the last save comes after the collectors stopped: no figure of the run's
            self._save_clock.ended()
        else:
            self._save_clock.begin_save(len(self.slices))
        opened: list[OpenSlice] = []
        try:
            self._collectors.save()
            metrics = self._counter_deltas.drain() if self._counter_deltas is not None else None
            slices = self.slices.drain()
            self.sink.append_series(self.series.drain(), "session")
            framework_events = self._saver.waiting_trace_bytes() // TRACE_BYTES_PER_EVENT
            opened = self._open_slices(within_step)
            self._saver.save(slices, opened, metrics)
        finally:
            paused = time.perf_counter_ns() - began
            if not final:
                cause = (PauseCause.SAVE_FOR_MEMORY if for_memory
                         else PauseCause.SAVE_INSIDE_STEP if within_step
                         else PauseCause.SAVE)
                # Step 0 holds the program's start-up (a warm-up step, left out of step statistics).
                in_a_step = within_step and self.action.records and self.step_number > 0
                paused = self.pauses.record(began, cause, inside_step=in_a_step,
                                            inside_layer=any(s.kind == Kind.MODULE for s in opened))
            if begin_step:
                self._begin_step()
            self._collectors.resume()
        if not final:
            self._save_clock.saved(framework_events, slices.num_rows, paused)

    _save = stops_recording_on_failure(_write_save)

    def _last_save(self) -> None:
        """The run's last save, after the collectors stopped. After a failure that stopped the
        recording, what was recorded before it is saved still (unless the disk is full: the room
        left is the manifest's); a save that fails again loses that, said in the run's notes."""
        if not self.recording_stopped:
            self._save(final=True)
        elif not self._stopped_by_full_disk:
            try:
                self._write_save(final=True)
            except Exception as failure:  # noqa: BLE001  the recording has stopped already: noted
                self.manifest.notes.append("what was recorded since the last save is lost: "
                                           f"{failure_words(failure)}")

    def _open_slices(self, within_step: bool) -> list[OpenSlice]:
        """The slices under way now: the step (when saving inside it), regions, layers."""
        pid = self.slices.pid
        opened = []
        # While a step boundary's save waits for a region to end, the step begun at the boundary
        # starts again once that save is made (save_waited), so a save meanwhile (one memory
        # forces: others wait, see _save_would_split) hands none over.
        if within_step and self.action.records and not self.save_waiting:
            if self._step_id < 0:
                self._step_id = self.slices.reserve_id()
            opened.append(OpenSlice(self._step_id, pid, self._step_tid, Kind.STEP,
                                    STEP_NAME.format(self.step_number), self.slices.epoch_ns(self._step_start)))
        for region in list(self.open_regions.values()):
            if region._id < 0:
                region._id = self.slices.reserve_id()
            opened.append(OpenSlice(region._id, pid, region._tid, Kind.REGION, region.name,
                                    self.slices.epoch_ns(region._start)))
        for collector in self._collectors:
            opened.extend(collector.open_slices())
        return opened

    def _drop_parent_state(self) -> None:
        """In a forked child: the collectors' threads and profilers stayed with the parent."""
        self._lock.forget()
        self._collectors.forget()
        self._saver.forget()
        self.pauses.reset()
        self.counter_reader = None
        self._counter_deltas = None

    def _cycle_converted(self, collector: str, result: Result) -> None:
        self._collectors.converted(collector, result)

    def _saving_summary(self) -> dict[str, Any]:
        clock = self._save_clock
        summary: dict[str, Any] = {
            "saves": self._saver.saves,
            "saves_within_steps": self._mid_step.saves,
            "peak_held_mib": round(clock.peak_held_bytes / 2**20, 1),
            "longest_between_saves_s": round(clock.longest_between_saves_ns / 1e9, 1),
            "memory_cap_mib": self.config.memory_cap_bytes >> 20,
            "pauses": self.pauses.summary(),
        }
        if clock.overflows:
            summary["saves_past_memory_cap"] = clock.overflows
        if clock.deferred:
            summary["saves_by_time_deferred"] = clock.deferred
        if self._mid_step.unavailable:
            summary["within_steps_unavailable"] = self._mid_step.unavailable
        throttled = self.slices.throttled_names()
        if throttled:
            summary["throttled"] = throttled
        return summary

    def _started_late(self) -> None:
        """Collectors started with their framework's import: what the import took is the
        program's, and the manifest says at once that they are active (a run killed later reads
        as having recorded them)."""
        self._save_clock.restart()
        with contextlib.suppress(OSError):  # inside the program's import: the next save meets the same disk and says so
            self._write_manifest()

    def stop_recording(self, failure: BaseException) -> None:
        """dlprof failed while the program runs (a save found the disk full): say so in one line,
        stop every collector and record nothing more; the program goes on, and the run keeps
        what was saved and says why it holds no more (``Manifest.degraded``)."""
        if self.recording_stopped:
            return
        self.recording_stopped = True
        self._stopped_by_full_disk = disk_full(failure)
        reason = degraded_reason(failure, self.step_number)
        self.manifest.degraded.append(reason)
        print(f"dlprof: {reason}; the program goes on, and {printable(self.run_dir)} keeps what was "
              "saved before", file=sys.stderr)
        self._lock.free_reserve()  # room for the manifest that says why
        if self._stopping:
            return  # stop() goes on: it has stopped the collectors and writes the manifest
        self.action = Action.NONE
        if self._context is not None:
            self._context.action = Action.NONE
        self.slices.closed = True  # regions and layers record nothing more
        self._mid_step.stop()
        with contextlib.suppress(OSError):  # the full disk again: its reason is given above
            self._collectors.stop(quiet=True)  # the profilers hold no more events in memory
        self._collectors.forget()
        with contextlib.suppress(OSError):  # written at the end, once more
            self._write_manifest()

    def _note_unfinished(self, failures: list[str]) -> None:
        """Saves that could not be made final (their chunks are read as they are)."""
        reason = (f"{len(failures)} save(s) could not be made final ({failures[0]}); their chunks are "
                  "read as they are, and `dlprof finish` tries again")
        if self._stopped_by_full_disk:  # the disk's doing: a note, as reading the run says again
            self.manifest.notes.append(reason)
            return
        self.manifest.degraded.append(reason)
        print(f"dlprof: {printable(reason)}", file=sys.stderr)

    def _write_last_manifest(self) -> None:
        """The final manifest; on a full disk, in the room the lock kept, else said in one line."""
        try:
            self._write_manifest()
            return
        except OSError:
            self._lock.free_reserve()
        try:
            self._write_manifest()
        except OSError as failure:
            print(f"dlprof: the run's manifest could not be written ({printable(os_error_text(failure))}); "
                  f"{printable(self.run_dir)} reads as killed", file=sys.stderr)

    def _write_manifest(self) -> None:
        """run.json; in a job of several ranks, this rank's own too (rank 0 also writes run.json)."""
        if self.config.world_size > 1:
            self.manifest.write(self.run_dir, rank=self.config.rank)
            if self.config.rank != 0:
                return
        self.manifest.write(self.run_dir)
