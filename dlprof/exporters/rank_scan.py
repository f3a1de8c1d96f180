"""What the timeline exporters learn of a rank before they write it, and its rows batch by batch.

The Chrome and Perfetto exporters write each rank's slices in the order the store keeps them
(track order), streamed a row group at a time (:mod:`dlprof.store.scan`). Before that, one scan
of a few columns (:meth:`RankIndex.of`) finds what must be known first: the rank's tracks, its
launch flows (which slices start and which end one) and the thread of each slice that allocated
memory. Memory follows the rank's flows and tracks (a few numbers per correlated slice), never
its rows::

    index = RankIndex.of(run, rank=0)
    for batch in rank_batches(run, StoreTable.SLICES, 0, SLICE_COLUMNS):
        sources, targets = index.flows.marks(batch["id"])
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dlprof.exporters.base import BATCH_ROWS
from dlprof.exporters.slice_walks import python_values
from dlprof.keys import StoreTable
from dlprof.store import scan
from dlprof.store.reader import Run

_INDEX_COLUMNS = ["id", "pid", "device", "tid", "correlation_id", "start_ns"]


@dataclass(frozen=True)
class Flows:
    """Which slices start and which end a launch flow (runtime call → device work)."""

    sources: np.ndarray  # sorted ids of CPU-side slices (runtime calls) that start a flow
    targets: np.ndarray  # sorted ids of device slices (kernel, memcpy, memset) that end one

    def marks(self, ids: list[int]) -> tuple[list[bool], list[bool]]:
        """For each id, whether its slice starts a flow and whether it ends one."""
        values = np.asarray(ids, dtype=np.int64)
        return _member(values, self.sources).tolist(), _member(values, self.targets).tolist()


@dataclass
class RankIndex:
    """A rank's tracks, flows, first instant and allocating threads, from one narrow scan."""

    tracks: list[tuple[int, str, int]] = field(default_factory=list)  # (pid, device, tid), sorted
    flows: Flows = field(default_factory=lambda: Flows(np.zeros(0, np.int64), np.zeros(0, np.int64)))
    first_start_ns: int | None = None
    owner_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # sorted
    owner_tids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @classmethod
    def of(cls, run: Run, rank: int) -> RankIndex:
        """Scan the rank's slices once (a few columns) and its memory's owners."""
        owners = [np.asarray(b.column(0).fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)
                  for b in scan.scan(run, StoreTable.MEMORY, rank, ["slice_id"])]
        wanted = np.unique(np.concatenate(owners)) if owners else np.zeros(0, np.int64)
        tracks: set[tuple[int, str, int]] = set()
        correlated: list[tuple[np.ndarray, ...]] = []
        owned: list[tuple[np.ndarray, np.ndarray]] = []
        first: int | None = None
        for batch in scan.scan(run, StoreTable.SLICES, rank, _INDEX_COLUMNS):
            device = _plain(batch.column(2)).fill_null("cpu")
            keys = pa.table({"pid": batch.column(1), "device": device, "tid": batch.column(3)})
            tracks.update(tuple(row.values()) for row in keys.group_by(["pid", "device", "tid"])
                          .aggregate([]).to_pylist())
            ids = np.asarray(batch.column(0).to_numpy(zero_copy_only=False), dtype=np.int64)
            start = np.asarray(batch.column(5).to_numpy(zero_copy_only=False), dtype=np.int64)
            if len(start):
                least = int(start.min())
                first = least if first is None else min(first, least)
            has = np.asarray(pc.is_valid(batch.column(4)).to_numpy(zero_copy_only=False), dtype=bool)
            if has.any():
                on_cpu = np.asarray(pc.equal(device, "cpu").to_numpy(zero_copy_only=False), dtype=bool)
                correlation = np.asarray(batch.column(4).fill_null(0).to_numpy(zero_copy_only=False), np.int64)
                correlated.append((correlation[has], start[has], ids[has], on_cpu[has]))
            mine = _member(ids, wanted)
            if mine.any():
                tids = np.asarray(batch.column(3).to_numpy(zero_copy_only=False), dtype=np.int64)
                owned.append((ids[mine], tids[mine]))
        owner_ids, owner_tids = (np.concatenate(parts) for parts in zip(*owned, strict=True)) if owned else (
            np.zeros(0, np.int64), np.zeros(0, np.int64))
        order = np.argsort(owner_ids)
        return cls(sorted(tracks), _flows(correlated), first, owner_ids[order], owner_tids[order])

    def owner_tid(self, slice_ids: list[int | None], default: list[int]) -> list[int]:
        """The thread of each memory row's slice; ``default`` where it has none."""
        owners = np.asarray([-1 if s is None else s for s in slice_ids], dtype=np.int64)
        if len(self.owner_ids) == 0:
            return list(default)
        at = np.minimum(np.searchsorted(self.owner_ids, owners), len(self.owner_ids) - 1)
        found = self.owner_ids[at] == owners
        return np.where(found, self.owner_tids[at], np.asarray(default, dtype=np.int64)).tolist()  # type: ignore[no-any-return]


def rank_batches(run: Run, table: StoreTable, rank: int, columns: list[str],
                 batch_rows: int = BATCH_ROWS) -> Iterator[dict[str, list[Any]]]:
    """A rank's rows in stored order, as Python lists per column, a batch at a time.

    Dictionary columns come as plain strings; a slice's missing device reads as ``cpu``.
    """
    for batch in scan.scan(run, table, rank, columns, batch_rows):
        values = {name: python_values(pa.chunked_array([batch.column(name)])) for name in columns}
        if "device" in values and table is StoreTable.SLICES:
            values["device"] = [d or "cpu" for d in values["device"]]
        yield values


def distinct(run: Run, table: StoreTable, rank: int, columns: list[str]) -> list[dict[str, Any]]:
    """The distinct values of some columns in one rank, sorted; strings decoded."""
    found: set[tuple[Any, ...]] = set()
    for batch in scan.scan(run, table, rank, columns):
        plain = pa.table({c: _plain(batch.column(c)) for c in columns})
        found.update(tuple(row.values()) for row in plain.group_by(columns).aggregate([]).to_pylist())
    rows = sorted(found, key=lambda row: tuple((v is None, v) for v in row))
    return [dict(zip(columns, row, strict=True)) for row in rows]


def _plain(column: pa.Array) -> pa.Array:
    return column.cast(pa.string()) if pa.types.is_dictionary(column.type) else column


def _member(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    if len(sorted_set) == 0:
        return np.zeros(len(values), dtype=bool)
    at = np.minimum(np.searchsorted(sorted_set, values), len(sorted_set) - 1)
    return np.asarray(sorted_set[at] == values)


def _flows(correlated: list[tuple[np.ndarray, ...]]) -> Flows:
    """Pair each device slice with the CPU slice that launched it, by correlation id.

    A flow is drawn only where both ends exist; where several slices of one side share a
    correlation id (a retried launch, a driver call under a runtime call), the earliest is used.
    """
    empty = np.zeros(0, np.int64)
    if not correlated:
        return Flows(empty, empty)
    correlation, start, ids, on_cpu = (np.concatenate(parts) for parts in zip(*correlated, strict=True))
    keys = correlation  # one rank: the correlation id alone pairs the two ends
    source_keys, source_ids = _earliest(keys[on_cpu], start[on_cpu], ids[on_cpu])
    target_keys, target_ids = _earliest(keys[~on_cpu], start[~on_cpu], ids[~on_cpu])
    both = np.intersect1d(source_keys, target_keys)
    return Flows(np.sort(source_ids[np.isin(source_keys, both)]), np.sort(target_ids[np.isin(target_keys, both)]))


def _earliest(keys: np.ndarray, start: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique keys, and the id of the earliest slice holding each."""
    order = np.lexsort((start, keys))
    unique_keys, first = np.unique(keys[order], return_index=True)
    return unique_keys, ids[order][first]
