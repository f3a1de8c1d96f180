"""Writing a rank's tables: raw chunks as soon as they are saved, final parts one save at a time.

A chunk is a whole Parquet file written under a temporary name and renamed, so a run killed at
any moment keeps every chunk saved before. Each save of a session is then made final as a
*window* (:meth:`RankWriter.finish_window`): its chunks and the rows converted from its
profiler cycles are nested together (under the slices still open at the save, see
:func:`dlprof.store.nesting.nest_window`), allocations are tied to their ops, and the result is
written as one ``part-NNNNN.parquet`` per table, after which the chunks are removed. A run is
therefore never read back whole to be written: each window is bounded by what one save holds.

:meth:`RankWriter.compact` makes whatever chunks are left final as one more window (the chunks
of forked DataLoader workers, a run imported from files), then shares the rank's PM samples
among its kernels (:func:`dlprof.store.pm_samples.attribute_rank`). A part's footer names the
chunks it replaced, so a reader that finds both (a process killed between writing a part and removing its
chunks) counts each row once (:mod:`dlprof.store.layout`).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dlprof.keys import StoreTable
from dlprof.store.attribution import attribute_memory
from dlprof.store.layout import CHUNK_GLOB, SOURCES_KEY, part_name, rank_dir, rank_files
from dlprof.store.nesting import NestingReport, OpenSliceTimes, nest_window
from dlprof.store.pm_samples import attribute_rank
from dlprof.store.schema import SCHEMAS, conform, write_parquet

__all__ = ["CHUNK_GLOB", "RankWriter", "WindowReport", "rank_dir", "read_chunks"]


@dataclass
class WindowReport:
    """What making one window final did."""

    rows: dict[str, int] = field(default_factory=dict)  # per table
    nesting: NestingReport = field(default_factory=NestingReport)
    # Of the slices still open at the save: their children's time here, and moved starts.
    open_slices: OpenSliceTimes = field(default_factory=OpenSliceTimes)


class RankWriter:
    """Writes the chunks and the final parts of one rank of one run."""

    def __init__(self, run_dir: Path, rank: int, metadata: dict[str, str] | None = None) -> None:
        """Args:
        run_dir: the run directory.
        rank: the partition this writer owns.
        metadata: key-value pairs for the part files' footers (rank, world size, host), so a
            reader of the Parquet files alone knows where each partition came from.
        """
        self.run_dir = run_dir
        self.rank = rank
        self.metadata = metadata or {}
        self._sequence = itertools.count()
        self._lock = threading.Lock()
        self._written: dict[StoreTable, list[Path]] = {}

    def write_chunk(self, table: StoreTable, data: pa.Table, source: str) -> Path | None:
        """Write ``data`` as one complete chunk of ``table``; nothing for an empty table.

        Args:
            table: which table the rows belong to.
            data: rows with any subset of the table's columns.
            source: a short word naming the writer (``session``, ``kineto``), part of the name.
        """
        if data.num_rows == 0:
            return None
        with self._lock:
            number = next(self._sequence)
        path = rank_dir(self.run_dir, table, self.rank) / f"chunk-{source}-{number:06d}.parquet"
        write_parquet(conform(data, SCHEMAS[table]), path)
        with self._lock:
            self._written.setdefault(table, []).append(path)
        return path

    def take_written(self) -> dict[StoreTable, list[Path]]:
        """The chunks this writer wrote since the last call (what one save holds)."""
        with self._lock:
            written, self._written = self._written, {}
        return written

    def finish_window(
        self,
        number: int,
        chunks: Mapping[StoreTable, list[Path]],
        rows: Mapping[StoreTable, list[pa.Table]] | None = None,
        anchors: pa.Table | None = None,
        open_before: frozenset[int] = frozenset(),
    ) -> WindowReport:
        """Make one save final: ``part-<number>`` of each table, then remove its chunks.

        Args:
            number: the window's number, unique in this rank (a save's number).
            chunks: the chunk files the save wrote, per table.
            rows: rows converted from the save's profiler cycles, per table, beside the chunks.
            anchors: the slices still open at the save (see :func:`nest_window`).
            open_before: ids of this save's slices (ended or still open) that were open at
                earlier saves.

        Returns:
            Rows written per table, what nesting changed, and the time of the open slices'
            children in this window.
        """
        report = WindowReport()
        merged: dict[StoreTable, pa.Table] = {}
        for table in StoreTable:
            pieces = [conform(piece, SCHEMAS[table]) for piece in (rows or {}).get(table, []) if piece.num_rows]
            paths = list(chunks.get(table, []))
            if paths:
                pieces.append(read_chunks(paths, SCHEMAS[table]))
            if pieces:
                merged[table] = pa.concat_tables(pieces, promote_options="permissive").unify_dictionaries().combine_chunks()
        if StoreTable.SLICES in merged:
            merged[StoreTable.SLICES], report.nesting, report.open_slices = nest_window(
                merged[StoreTable.SLICES], anchors, open_before
            )
            if StoreTable.MEMORY in merged:
                merged[StoreTable.SLICES], merged[StoreTable.MEMORY] = attribute_memory(
                    merged[StoreTable.SLICES], merged[StoreTable.MEMORY]
                )
        for table, data in merged.items():
            if "ts_ns" in data.column_names:
                data = data.sort_by("ts_ns")
            replaced = ",".join(path.name for path in chunks.get(table, []))
            footer = {**self.metadata, SOURCES_KEY: replaced} if replaced else self.metadata
            write_parquet(data.replace_schema_metadata(footer or None),
                          rank_dir(self.run_dir, table, self.rank) / part_name(number))
            report.rows[str(table)] = data.num_rows
        for paths in chunks.values():
            for path in paths:
                path.unlink(missing_ok=True)
        return report

    def compact(self) -> tuple[dict[str, int], NestingReport]:
        """Make every chunk left in this rank final, as one more window.

        Returns:
            Rows per table in all of this rank's parts, and what nesting changed in the chunks
            made final here.
        """
        loose: dict[StoreTable, list[Path]] = {}
        numbers = [-1]
        for table in StoreTable:
            files = rank_files(rank_dir(self.run_dir, table, self.rank))
            if files.loose_chunks:
                loose[table] = files.loose_chunks
            numbers += [part_number(path) for path in files.parts]
            for chunk in files.replaced_chunks:  # a part already holds them
                chunk.unlink(missing_ok=True)
        report = NestingReport()
        if loose:
            report = self.finish_window(max(numbers) + 1, loose).nesting
        self.take_written()
        # Every save of the rank is final: PM samples are shared among its kernels now, whichever
        # collector recorded them and in whatever save.
        attribute_rank(self.run_dir, self.rank, self.metadata)
        return self.counts(), report

    def counts(self) -> dict[str, int]:
        """Rows per table in this rank's parts, from their footers."""
        counts = {}
        for table in StoreTable:
            parts = rank_files(rank_dir(self.run_dir, table, self.rank)).parts
            counts[str(table)] = sum(pq.read_metadata(part).num_rows for part in parts)
        return counts

    def amend_open_slices(self, number: int, children_ns: Mapping[int, int],
                          starts_ns: Mapping[int, int], pause_ns: Mapping[int, int] | None = None) -> None:
        """Make whole the slices of window ``number`` that were still open at earlier saves:
        take their children's time in those windows off their self time, start them where
        nesting moved their start to there, and add dlprof's pauses inside them there to their
        ``pause_ns``."""
        path = rank_dir(self.run_dir, StoreTable.SLICES, self.rank) / part_name(number)
        if not (children_ns or starts_ns or pause_ns) or not path.exists():
            return
        data = pq.read_table(path)
        ids = data.column("id").to_numpy(zero_copy_only=False)
        start = data.column("start_ns").to_numpy(zero_copy_only=False)
        moved_to = _lookup(ids, starts_ns, default=start)
        earlier = start - moved_to  # how much longer a slice moved back becomes
        self_ns = data.column("self_ns").fill_null(0).to_numpy(zero_copy_only=False)
        adjusted = {
            "start_ns": moved_to,
            "dur_ns": data.column("dur_ns").to_numpy(zero_copy_only=False) + earlier,
            "self_ns": np.maximum(self_ns + earlier - _lookup(ids, children_ns, default=np.zeros_like(ids)), 0),
        }
        for name, values in adjusted.items():
            data = data.set_column(data.schema.get_field_index(name), name, pa.array(values, pa.int64()))
        if pause_ns:
            paused = data.column("pause_ns").fill_null(0).to_numpy(zero_copy_only=False) \
                + _lookup(ids, pause_ns, default=np.zeros_like(ids))
            data = data.set_column(data.schema.get_field_index("pause_ns"), "pause_ns",
                                   pa.array(paused, pa.int64(), mask=paused == 0))
        write_parquet(data.replace_schema_metadata(data.schema.metadata), path)


    def shift_depths(self, number: int, shifts: list[tuple[int, int, int, int, int]],
                     parents: Mapping[int, int | None] | None = None) -> None:
        """Move the depth of what window ``number`` nested under slices then open whose depth
        changed later (a slice that began inside it ended and nesting put it below), and give
        the children of open slices that left that window's chain their new parent.

        Args:
            number: the window.
            shifts: (pid, tid, start_ns, depth, by): on that thread, every slice from that start
                on that is deeper than that depth (everything under the open slice) moves by
                ``by``, the innermost open slice's shift applying to what lies under several.
            parents: per open slice that left the chain, the parent its children take instead
                (None: they have none).
        """
        path = rank_dir(self.run_dir, StoreTable.SLICES, self.rank) / part_name(number)
        if not (shifts or parents) or not path.exists():
            return
        data = pq.read_table(path)
        pid = data.column("pid").to_numpy(zero_copy_only=False)
        tid = data.column("tid").to_numpy(zero_copy_only=False)
        start = data.column("start_ns").to_numpy(zero_copy_only=False)
        depth = data.column("depth").fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        moved = depth.copy()
        # A slice under several open slices counts from the innermost: deeper ones go last.
        for on_pid, on_tid, since, above, by in sorted(shifts, key=lambda shift: shift[3]):
            under = (pid == on_pid) & (tid == on_tid) & (start >= since) & (depth > above)
            moved[under] = depth[under] + by
        data = data.set_column(data.schema.get_field_index("depth"), "depth", pa.array(moved, pa.int16()))
        if parents:
            parent = data.column("parent_id").to_numpy(zero_copy_only=False)  # floats, NaN for none
            for left, instead in parents.items():
                parent = np.where(parent == left, np.nan if instead is None else instead, parent)
            data = data.set_column(data.schema.get_field_index("parent_id"), "parent_id",
                                   pa.array(parent, pa.float64(), from_pandas=True).cast(pa.int64()))
        write_parquet(data.replace_schema_metadata(data.schema.metadata), path)

    def parents_of(self, number: int, ids: set[int]) -> dict[int, tuple[int | None, int]]:
        """The parent and start of some slices of window ``number``, by id."""
        path = rank_dir(self.run_dir, StoreTable.SLICES, self.rank) / part_name(number)
        if not ids or not path.exists():
            return {}
        data = pq.read_table(path, columns=["id", "parent_id", "start_ns"])
        return {i: (p, s) for i, p, s in zip(data.column("id").to_pylist(), data.column("parent_id").to_pylist(),
                                             data.column("start_ns").to_pylist(), strict=True) if i in ids}

    def depths_of(self, number: int, ids: set[int]) -> dict[int, int]:
        """The depth of some slices of window ``number``, by id."""
        path = rank_dir(self.run_dir, StoreTable.SLICES, self.rank) / part_name(number)
        if not ids or not path.exists():
            return {}
        data = pq.read_table(path, columns=["id", "depth"])
        return {i: d for i, d in zip(data.column("id").to_pylist(), data.column("depth").to_pylist(), strict=True)
                if i in ids}


def part_number(path: Path) -> int:
    """The window number of ``part-NNNNN.parquet``."""
    return int(path.stem.partition("-")[2])


def _lookup(ids: np.ndarray, values: Mapping[int, int], default: np.ndarray) -> np.ndarray:
    """``values[id]`` for each id (``default`` where it has none), without a loop over the ids."""
    if not values:
        return default
    keys = np.fromiter(values.keys(), dtype=np.int64, count=len(values))
    amounts = np.fromiter(values.values(), dtype=np.int64, count=len(values))
    order = np.argsort(keys)
    keys, amounts = keys[order], amounts[order]
    at = np.clip(np.searchsorted(keys, ids), 0, len(keys) - 1)
    return np.where(keys[at] == ids, amounts[at], default)


def read_chunks(paths: list[Path], schema: pa.Schema) -> pa.Table:
    """Read and concatenate chunk files, unifying their dictionaries."""
    tables = [conform(pq.read_table(p), schema) for p in paths]
    if not tables:
        return schema.empty_table()
    return pa.concat_tables(tables).unify_dictionaries().combine_chunks()
