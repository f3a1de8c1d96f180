"""Growing columns for the rows an XPlane becomes, and the Keras layer slices derived from them.

Events of one XPlane event metadata share their kind, name, types and scope: the columns hold
one small integer per event for all of those (an :class:`EventClass` code), and the strings are
looked up once per class when the Arrow table is built. The few columns only some events have
(a kernel's launch configuration, a correlation id) are kept sparse, by row.

Layer slices: on each host thread, consecutive ops under the same Keras name scopes form one
``module`` slice per scope level, from the first op's start to the last op's end; a run never
crosses the end of the event enclosing its ops, so layers nest inside executor ranges.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa

from dlprof.importers.damage import MAX_TIME_NS, Damage
from dlprof.importers.data_wait import is_tf_data_wait
from dlprof.importers.tf_ops import module_scope
from dlprof.keys import SCOPE_LAYER_CATEGORY, Kind


def event_damage(start_ps: int, duration_ps: int) -> str | None:
    """Why an XPlane event with a duration cannot be a slice (the reasons as Kineto imports count
    them), or None: a negative duration, or a start past :data:`MAX_TIME_NS` (an int64 of
    picoseconds is always a duration short of it)."""
    if duration_ps < 0:
        return str(Damage.DUR_NEGATIVE)
    if not abs(start_ps) // 1000 <= MAX_TIME_NS:
        return str(Damage.TS_RANGE)
    return None


@dataclass(frozen=True)
class EventClass:
    """What every event of one kind of event shares."""

    kind: str
    name: str
    category: str
    op_type: str | None = None
    scope: str | None = None
    layers: tuple[str, ...] = ()  # module names enclosing it (ops on host threads)
    args: str | None = None  # JSON, for what no column holds (an HLO op's instruction)


@dataclass(frozen=True)
class Track:
    """One XPlane line: a host thread or a device stream."""

    device: str  # "cpu", "cuda:0"
    tid: int
    host: bool  # a CPU thread, where layer slices are derived


class SliceRows:
    """The slices of one XPlane, one value per event per column."""

    SPARSE = ("correlation_id", "bytes", "grid", "block", "registers", "shared_memory", "stream")

    def __init__(self) -> None:
        self._classes: dict[EventClass, int] = {}
        self.classes: list[EventClass] = []
        self.tracks: list[Track] = []
        self.cls = array("i")
        self.track = array("i")
        self.start = array("q")
        self.dur = array("q")
        self.sparse: dict[str, dict[int, Any]] = {name: {} for name in self.SPARSE}

    def __len__(self) -> int:
        return len(self.cls)

    def code(self, event_class: EventClass) -> int:
        """The integer code of a class of events."""
        if is_tf_data_wait(event_class.name, event_class.op_type):
            event_class = replace(event_class, kind=Kind.DATA_WAIT)
        code = self._classes.get(event_class)
        if code is None:
            code = self._classes[event_class] = len(self.classes)
            self.classes.append(event_class)
        return code

    def add_track(self, track: Track) -> int:
        self.tracks.append(track)
        return len(self.tracks) - 1

    def table(self, keep: np.ndarray, id_base: int, pid: int, shift_ns: int,
              marker_tid: tuple[int, int] | None) -> pa.Table:
        """The kept rows, their layer slices appended, as a slices table.

        Args:
            keep: one flag per row.
            id_base: the first id.
            pid: the process every row belongs to.
            shift_ns: subtracted from every start (onto the run's clock).
            marker_tid: (tid as recorded, tid to give it): the thread that timed the clock marker.
        """
        kept = np.flatnonzero(keep)
        cls = np.frombuffer(self.cls, dtype=np.int32)[kept]
        track = np.frombuffer(self.track, dtype=np.int32)[kept]
        start = np.frombuffer(self.start, dtype=np.int64)[kept] - shift_ns
        dur = np.frombuffer(self.dur, dtype=np.int64)[kept]
        layer_cls, layer_track, layer_start, layer_dur = self._layers(cls, track, start, dur)
        cls = np.concatenate([cls, layer_cls])
        track = np.concatenate([track, layer_track])
        start = np.concatenate([start, layer_start])
        dur = np.concatenate([dur, layer_dur])
        n = len(cls)
        tids = np.array([t.tid for t in self.tracks] or [0], dtype=np.int64)[track]
        if marker_tid is not None:
            tids[tids == marker_tid[0]] = marker_tid[1]
        row_of_kept = np.full(len(self), -1, dtype=np.int64)
        row_of_kept[kept] = np.arange(len(kept))
        columns: dict[str, Any] = {
            "id": pa.array(np.arange(n, dtype=np.int64) + id_base),
            "pid": pa.array(np.full(n, pid, dtype=np.int64)),
            "tid": pa.array(tids),
            "device": _lookup([t.device for t in self.tracks], track),
            "start_ns": pa.array(start),
            "dur_ns": pa.array(dur),
        }
        for field in ("kind", "name", "category", "op_type", "scope"):
            columns[field] = _lookup([getattr(c, field) for c in self.classes], cls)
        args = [c.args for c in self.classes]
        columns["args"] = pa.array([args[c] for c in cls] if any(args) else [None] * n, pa.string())
        for name, values in self.sparse.items():
            column: list[Any] = [None] * n
            for row, value in values.items():
                if row_of_kept[row] >= 0:
                    column[row_of_kept[row]] = value
            columns[name] = pa.array(column, _SPARSE_TYPES[name])
        return pa.table(columns)

    def _layers(self, cls: np.ndarray, track: np.ndarray, start: np.ndarray,
                dur: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Layer slices over the kept rows: (class, track, start, duration) per slice."""
        out_cls: list[int] = []
        out_track: list[int] = []
        out_start: list[int] = []
        out_end: list[int] = []
        events = list(self.classes)
        layers = [tuple(self.code(EventClass(Kind.MODULE, name, SCOPE_LAYER_CATEGORY, scope=module_scope(name)))
                        for name in c.layers) for c in events]
        is_op = [c.kind in (Kind.OP, Kind.COMM) for c in events]
        cls_list = cls.tolist()
        for track_code, info in enumerate(self.tracks):
            rows = np.flatnonzero(track == track_code) if info.host else ()
            if len(rows) == 0:
                continue
            rows = rows[np.lexsort((-dur[rows], start[rows]))]
            opened: list[list[int]] = []  # [layer class, start, end] from outermost in
            enclosing: list[tuple[int, int]] = []  # (end, row) of the events open at this point
            container = -2
            for row, begin, end in zip(rows.tolist(), start[rows].tolist(),
                                       (start[rows] + dur[rows]).tolist(), strict=True):
                while enclosing and enclosing[-1][0] <= begin:
                    enclosing.pop()
                code = cls_list[row]
                parent = enclosing[-1][1] if enclosing else -1
                enclosing.append((end, row))
                if not is_op[code]:
                    continue  # other events only bound the runs (through `enclosing`)
                if parent != container:
                    self._close(opened, 0, track_code, out_cls, out_track, out_start, out_end)
                    container = parent
                codes = layers[code]
                same = 0
                while same < min(len(opened), len(codes)) and opened[same][0] == codes[same]:
                    same += 1
                self._close(opened, same, track_code, out_cls, out_track, out_start, out_end)
                opened.extend([code, begin, end] for code in codes[same:])
                for layer in opened:
                    layer[2] = max(layer[2], end)
            self._close(opened, 0, track_code, out_cls, out_track, out_start, out_end)
        ends = np.asarray(out_end, dtype=np.int64)
        starts = np.asarray(out_start, dtype=np.int64)
        return (np.asarray(out_cls, dtype=np.int32), np.asarray(out_track, dtype=np.int32),
                starts, ends - starts)

    @staticmethod
    def _close(opened: list[list[int]], keep: int, track: int, out_cls: list[int],
               out_track: list[int], out_start: list[int], out_end: list[int]) -> None:
        for code, begin, end in opened[keep:]:
            out_cls.append(code)
            out_track.append(track)
            out_start.append(begin)
            out_end.append(end)
        del opened[keep:]


_SPARSE_TYPES = {
    "correlation_id": pa.int64(),
    "bytes": pa.int64(),
    "grid": pa.string(),
    "block": pa.string(),
    "registers": pa.int32(),
    "shared_memory": pa.int64(),
    "stream": pa.int64(),
}


class MemoryRows:
    """Allocator events: one row per allocation (positive bytes) or free (negative)."""

    COLUMNS = ("tid", "ts", "bytes", "total_allocated", "total_reserved", "addr")

    def __init__(self) -> None:
        self.values: dict[str, array[int]] = {name: array("q") for name in self.COLUMNS}
        self.device: list[str] = []

    def add(self, device: str, **values: int) -> None:
        self.device.append(device)
        for name in self.COLUMNS:
            self.values[name].append(values[name])

    def table(self, keep_from_ns: int | None, pid: int, shift_ns: int,
              marker_tid: tuple[int, int] | None) -> pa.Table:
        """The kept rows as a memory table (arguments as :meth:`SliceRows.table`'s)."""
        columns = {name: np.frombuffer(values, dtype=np.int64).copy() for name, values in self.values.items()}
        columns["ts"] -= shift_ns
        if marker_tid is not None:
            columns["tid"][columns["tid"] == marker_tid[0]] = marker_tid[1]
        keep = columns["ts"] >= keep_from_ns if keep_from_ns is not None else np.ones(len(self.device), bool)
        devices = np.asarray(self.device, dtype=object)[keep]
        return pa.table(
            {
                "pid": pa.array(np.full(int(keep.sum()), pid, dtype=np.int64)),
                "tid": pa.array(columns["tid"][keep]),
                "device": pa.array(devices.tolist(), pa.string()).dictionary_encode(),
                "ts_ns": pa.array(columns["ts"][keep]),
                "bytes": pa.array(columns["bytes"][keep]),
                "total_allocated": pa.array(columns["total_allocated"][keep]),
                "total_reserved": pa.array(columns["total_reserved"][keep]),
                "addr": pa.array(columns["addr"][keep]),
                # The op that allocated is found when the run is compacted (dlprof.store.attribution).
                "slice_id": pa.nulls(int(keep.sum()), pa.int64()),
            }
        )


def _lookup(values: list[str | None], codes: np.ndarray) -> pa.DictionaryArray:
    """A dictionary column: ``values[code]`` for each code, None as null."""
    dictionary: dict[str, int] = {}
    index = [-1 if v is None else dictionary.setdefault(v, len(dictionary)) for v in values]
    indices = np.asarray(index or [-1], dtype=np.int32)[codes] if len(codes) else np.zeros(0, np.int32)
    return pa.DictionaryArray.from_arrays(
        pa.array(indices, mask=indices < 0), pa.array(list(dictionary), pa.string())
    )
