"""A session's saves: what each one holds, and making them final while the program runs.

At every save the session hands over what it recorded since the last one; the :class:`Saver`
writes it as chunks at once (so a run killed a moment later keeps it), gathers the chunks every
source wrote since the last save and the profiler cycles handed to it, and gives them to the
finisher (:mod:`dlprof.recording.finisher`) as one job, with the slices still open at that
moment. When the session ends, :meth:`Saver.close` waits for the last jobs, takes the time of
each open slice's children in earlier saves off its self time, makes the chunks no save held
final (forked DataLoader workers write their own), and says what the run holds::

    saver = Saver(writer, sink)
    saver.save(slices.drain(), open_slices, metrics)   # at every save
    counts, normalised = saver.close()                 # when the session ends
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

from dlprof.recording.finisher import BackgroundFinisher, Result
from dlprof.store.save_jobs import Cycle, OpenSlice, PendingSaves, SaveJob
from dlprof.store.sink import Sink
from dlprof.store.writer import RankWriter


class Saver:
    """Saves of one rank: chunks now, final parts through the finisher."""

    def __init__(self, writer: RankWriter, sink: Sink, on_cycle: Callable[[str, Result], None]) -> None:
        """Args:
        writer: the rank's writer (every chunk of this process goes through it).
        sink: the sink on that writer.
        on_cycle: told (collector name, result) for each profiler cycle converted.
        """
        self._writer = writer
        self._sink = sink
        self._on_cycle = on_cycle
        self._finisher = BackgroundFinisher(PendingSaves(writer.run_dir, writer.rank), self._finished)
        self._lock = threading.Lock()
        self._cycles: list[Cycle] = []
        self._number = 0
        # Ids of slices handed over as open, and per save the ones among them that ended in it.
        self._opened: set[int] = set()
        self._ended_in: dict[int, list[int]] = {}
        # Per save, each slice open at it: its children's time there; and per slice, the
        # earliest start nesting moved it to, and the first save that moved it.
        self._children_in: dict[int, dict[int, int]] = {}
        self._pauses_in: dict[int, dict[int, int]] = {}  # per save, dlprof's pauses inside each open slice
        self._starts_ns: dict[int, int] = {}
        self._moved_in: dict[int, int] = {}
        # Per save, each open slice's (pid, tid, start), depth and parent (another open slice)
        # in it: what its descendants there counted their depth from.
        self._open_at: dict[int, dict[int, tuple[int, int, int]]] = {}
        self._open_depths: dict[int, dict[int, int]] = {}
        self._open_parents: dict[int, dict[int, int]] = {}
        self._normalised: dict[str, int] = {}
        self.saves = 0

    def convert(self, cycle: Cycle) -> None:
        """A profiler cycle saved to a file: converted with the next save."""
        with self._lock:
            self._cycles.append(cycle)

    def waiting_trace_bytes(self) -> int:
        """Bytes of the profiler traces handed over since the last save (how many events the
        save about to be made holds, before they are counted)."""
        with self._lock:
            return sum(path.stat().st_size for cycle in self._cycles for path in cycle.job.files()
                       if path.exists())

    def save(self, slices: pa.Table, open_slices: list[OpenSlice], metrics: pa.Table | None = None) -> None:
        """Write what the session recorded since the last save, and hand the save over.

        Args:
            slices: the session's slices since the last save (steps, regions, layers).
            open_slices: slices still open now; their ids are those their rows will have.
            metrics: counter deltas of those slices.
        """
        self._sink.append_slices(slices, "session")
        if metrics is not None:
            self._sink.append_metrics(metrics, "session")
        number = self._number
        self._number += 1
        if self._opened and slices.num_rows:
            ended = pc.is_in(slices.column("id"), pa.array(list(self._opened), pa.int64()))
            self._ended_in[number] = slices.column("id").filter(ended).to_pylist()
        still_open = [s.id for s in open_slices if s.id in self._opened]
        self._opened.update(s.id for s in open_slices)
        self._open_at[number] = {s.id: (s.pid, s.tid, s.start_ns) for s in open_slices}
        with self._lock:
            cycles, self._cycles = self._cycles, []
        self._finisher.submit(SaveJob(
            run_dir=self._writer.run_dir, rank=self._writer.rank, number=number,
            metadata=self._writer.metadata, chunks=self._writer.take_written(), cycles=cycles,
            open_slices=open_slices, open_before=[*self._ended_in.get(number, []), *still_open],
        ))
        self.saves += 1

    def close(self) -> tuple[dict[str, int], dict[str, int]]:
        """Finish every save, then the chunks no save held.

        Returns:
            Rows per table in the rank's parts, and what nesting changed, per kind of change.
        """
        self._finisher.close()
        dropped = self._stretched_back_over_parents()
        children_ns: dict[int, int] = {}
        pause_ns: dict[int, int] = {}
        for number, times in self._pauses_in.items():
            for slice_id, time_ns in times.items():
                if (number, slice_id) not in dropped:  # it left that save's chain: the pause is its parent's
                    pause_ns[slice_id] = pause_ns.get(slice_id, 0) + time_ns
        for number, times in self._children_in.items():
            for slice_id, time_ns in times.items():
                # What a slice dropped out of a save's chain held there is its parent's there.
                owner = self._open_parents[number].get(slice_id, slice_id) if (number, slice_id) in dropped \
                    else slice_id
                children_ns[owner] = children_ns.get(owner, 0) + time_ns
        # A slice whose start moves back is longer by that much: its parent's children too.
        for number, ended in self._ended_in.items():
            moved = {slice_id for slice_id in ended if slice_id in self._starts_ns}
            for slice_id, (parent, start) in self._writer.parents_of(number, moved).items():
                if parent is not None:
                    children_ns[parent] = children_ns.get(parent, 0) + start - self._starts_ns[slice_id]
        final_depths: dict[int, int] = {}
        for number, ended in self._ended_in.items():
            self._writer.amend_open_slices(
                number,
                {slice_id: children_ns[slice_id] for slice_id in ended if slice_id in children_ns},
                {slice_id: self._starts_ns[slice_id] for slice_id in ended if slice_id in self._starts_ns},
                {slice_id: pause_ns[slice_id] for slice_id in ended if slice_id in pause_ns},
            )
            final_depths.update(self._writer.depths_of(number, set(ended)))
        for number in self._open_depths:
            shifts = self._depth_shifts(number, final_depths, dropped)
            parents = {slice_id: self._open_parents[number].get(slice_id) for n, slice_id in dropped if n == number}
            self._writer.shift_depths(number, shifts, parents)
        counts, report = self._writer.compact()
        for what, count in report.as_counts().items():
            self._normalised[what] = self._normalised.get(what, 0) + count
        return counts, dict(self._normalised)

    def _stretched_back_over_parents(self) -> set[tuple[int, int]]:
        """(save, slice) for each slice open at a save that a later save stretched back over the
        slice it began in (a region begun inside a first step that outlived it, both open at a
        save inside that step): at the earlier save it lay inside that parent with children of
        its own, which now lie inside the parent only, so it leaves that save's chain."""
        return {(number, slice_id) for slice_id, moved_in in self._moved_in.items()
                for number, depths in self._open_depths.items()
                if number < moved_in and slice_id in depths and slice_id in self._open_parents[number]}

    def _depth_shifts(self, number: int, final_depths: dict[int, int],
                      dropped: set[tuple[int, int]]) -> list[tuple[int, int, int, int, int]]:
        """How the depth of what save ``number`` nested under each slice then open moves (see
        :meth:`RankWriter.shift_depths`): by that slice's own change of depth, or, for one that
        left the chain, one level less than its parent's change."""
        depths, parents = self._open_depths[number], self._open_parents[number]
        shifts: dict[int, int] = {}

        def shift(slice_id: int) -> int | None:
            if slice_id not in shifts:
                if (number, slice_id) in dropped:
                    outer = parents.get(slice_id)
                    shifts[slice_id] = ((shift(outer) or 0) if outer is not None else -depths[slice_id]) - 1
                elif slice_id in final_depths:
                    shifts[slice_id] = final_depths[slice_id] - depths[slice_id]
                else:
                    return None
            return shifts[slice_id]

        return [(*self._open_at[number][slice_id], depth, by) for slice_id, depth in depths.items()
                if (by := shift(slice_id)) is not None and (by or (number, slice_id) in dropped)]

    @property
    def failures(self) -> list[str]:
        """Saves that could not be made final, in words; they wait on disk for ``dlprof finish``."""
        return self._finisher.failures

    @property
    def child_failures(self) -> int:
        """Jobs the finisher's child process could not finish (done in this process instead)."""
        return self._finisher.child_failures

    def forget(self) -> None:
        """In a forked child: the saves are the parent's."""
        self._finisher.forget()

    def _finished(self, result: Result) -> None:
        with self._lock:  # the finisher's thread and the closing session both report here
            number = int(result["number"])
            self._children_in[number] = {int(k): int(v) for k, v in result["open_children_ns"].items()}
            self._pauses_in[number] = {int(k): int(v) for k, v in result.get("open_pause_ns", {}).items()}
            for slice_id, start_ns in result["open_starts_ns"].items():
                key = int(slice_id)
                self._starts_ns[key] = min(self._starts_ns.get(key, start_ns), int(start_ns))
                self._moved_in[key] = min(self._moved_in.get(key, number), number)
            self._open_depths[number] = {int(k): int(v) for k, v in result["open_depths"].items()}
            self._open_parents[number] = {int(k): int(v) for k, v in result.get("open_parents", {}).items()}
            for slice_id, start_ns in result["open_starts_ns"].items():  # its descendants there begin there
                pid, tid, _ = self._open_at[number][int(slice_id)]
                self._open_at[number][int(slice_id)] = (pid, tid, int(start_ns))
            for what, count in result["nesting"].items():
                self._normalised[what] = self._normalised.get(what, 0) + int(count)
        for cycle in result["cycles"]:
            self._on_cycle(cycle["collector"], cycle)
