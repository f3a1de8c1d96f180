"""Fixed-shape columnar buffers for the slices dlprof times itself (steps, regions, modules).

The hot path appends integers to ``array.array`` columns under one lock: no dicts, no strings
built per event. Names are interned once. :meth:`SliceBuffer.drain` turns what was recorded
into an Arrow table for the sink.

Throttling, as TAU throttles its timers (``TAU_THROTTLE_NUMCALLS``, ``TAU_THROTTLE_PERCALL``): a
name recorded more than 100,000 times at under 10 µs a call on average is no longer traced call
by call; its later calls are counted, and their time summed, per name (:meth:`throttled_names`), and
the time they took is left to the slices around them. The run's manifest lists what was
throttled. A slice a save found open is always recorded (its id is already in use).
"""

from __future__ import annotations

import threading
from array import array

import numpy as np
import pyarrow as pa

from dlprof.keys import THROTTLE_CALLS, THROTTLE_PER_CALL_NS
from dlprof.store.ids import SLOT_SESSION, id_base


class SliceBuffer:
    """Slices recorded in this process, with ids from the session's slot."""

    def __init__(self, rank: int, pid: int, to_epoch_ns: int) -> None:
        """Args:
        rank: the rank the ids are numbered under.
        pid: the process the slices belong to.
        to_epoch_ns: added to ``perf_counter_ns`` readings to give epoch nanoseconds.
        """
        self.rank = rank
        self.pid = pid
        self.to_epoch_ns = to_epoch_ns
        self._next_id = id_base(rank, SLOT_SESSION)
        self._lock = threading.Lock()
        self.closed = False  # nothing more is recorded (a forked child whose parent stopped)
        self.refused = 0  # slices not recorded since it closed
        # Per name code: calls and nanoseconds recorded; and, for names throttled, the calls
        # and nanoseconds since (name code -> [calls, ns]).
        self._calls: list[int] = []
        self._total_ns: list[int] = []
        self._throttled: dict[int, list[int]] = {}
        self._names: dict[str, int] = {}
        self._kinds: dict[str, int] = {}
        self._new_columns()

    def _new_columns(self) -> None:
        self._id = array("q")
        self._name = array("i")
        self._kind = array("b")
        self._tid = array("q")
        self._start = array("q")
        self._end = array("q")
        self._bytes = array("q")

    def restart_in_fork(self, pid: int, slot: int) -> None:
        """In a forked child: drop the parent's unsaved slices, number new ones from ``slot``.

        Everyone holding this buffer (regions, collectors) records into the child's from then on.
        """
        self.pid = pid
        self._next_id = id_base(self.rank, slot)
        self._lock = threading.Lock()  # the parent's may have been held by a thread that is gone
        self._new_columns()

    def epoch_ns(self, perf_ns: int) -> int:
        """A ``perf_counter_ns`` reading as epoch nanoseconds."""
        return perf_ns + self.to_epoch_ns

    def kind_of(self, code: int) -> str:
        """The kind a kind code stands for."""
        return next(kind for kind, value in self._kinds.items() if value == code)

    def name_of(self, code: int) -> str:
        """The name an interned code stands for."""
        return next(name for name, value in self._names.items() if value == code)

    def intern(self, name: str) -> int:
        """The integer code of a name; call once per distinct name, off the hot path if you can."""
        code = self._code(self._names, name)
        with self._lock:
            while len(self._calls) <= code:
                self._calls.append(0)
                self._total_ns.append(0)
        return code

    def is_throttled(self, name_code: int) -> bool:
        """Whether calls of this name are no longer traced one by one."""
        return name_code in self._throttled

    def count_untimed(self, name_code: int) -> None:
        """One more call of a throttled name, which its recorder did not even time (a layer)."""
        with self._lock:
            self._throttled[name_code][0] += 1

    def throttled_names(self) -> dict[str, dict[str, int]]:
        """What was throttled: per name, the calls and nanoseconds not traced one by one."""
        names = {code: name for name, code in self._names.items()}
        return {names[code]: {"calls": calls, "ns": ns} for code, (calls, ns) in self._throttled.items()}

    def kind_code(self, kind: str) -> int:
        """The integer code of a kind of slice."""
        return self._code(self._kinds, kind)

    def _code(self, codes: dict[str, int], key: str) -> int:
        code = codes.get(key)
        if code is None:
            with self._lock:
                code = codes.setdefault(key, len(codes))
        return code

    def reserve_id(self) -> int:
        """An id for a slice that has begun and not ended (one a save finds open), which its
        row takes when it is recorded (``record(..., slice_id=...)``)."""
        with self._lock:
            slice_id = self._next_id
            self._next_id += 1
        return slice_id

    def record(
        self, kind_code: int, name_code: int, tid: int, start: int, end: int, nbytes: int = -1,
        slice_id: int = -1,
    ) -> int:
        """Append one slice timed with ``perf_counter_ns``; returns its id.

        ``nbytes`` of -1 means "not measured"; ``slice_id`` of -1 gives it the next id.
        """
        if self.closed:
            self.refused += 1
            return -1
        with self._lock:
            if slice_id < 0:
                calls = self._calls[name_code] = self._calls[name_code] + 1
                spent = self._total_ns[name_code] = self._total_ns[name_code] + end - start
                if calls > THROTTLE_CALLS and spent < calls * THROTTLE_PER_CALL_NS:
                    aggregate = self._throttled.setdefault(name_code, [0, 0])
                    aggregate[0] += 1
                    aggregate[1] += end - start
                    return -1
                slice_id = self._next_id
                self._next_id += 1
            self._id.append(slice_id)
            self._name.append(name_code)
            self._kind.append(kind_code)
            self._tid.append(tid)
            self._start.append(start)
            self._end.append(end)
            self._bytes.append(nbytes)
        return slice_id

    def __len__(self) -> int:
        return len(self._id)

    def drain(self) -> pa.Table:
        """Everything recorded since the last drain, as slices with epoch timestamps."""
        with self._lock:
            ids, names, kinds, tids = self._id, self._name, self._kind, self._tid
            starts, ends, nbytes = self._start, self._end, self._bytes
            self._new_columns()
            name_values = list(self._names)
            kind_values = list(self._kinds)
        start = np.frombuffer(starts, dtype=np.int64) + self.to_epoch_ns
        dur = np.frombuffer(ends, dtype=np.int64) - np.frombuffer(starts, dtype=np.int64)
        byte_values = np.frombuffer(nbytes, dtype=np.int64)
        dict_type = pa.dictionary(pa.int32(), pa.string())
        return pa.table(
            {
                "id": pa.array(np.frombuffer(ids, dtype=np.int64)),
                "pid": pa.array(np.full(len(ids), self.pid, dtype=np.int64)),
                "tid": pa.array(np.frombuffer(tids, dtype=np.int64)),
                "device": pa.DictionaryArray.from_arrays(
                    pa.array(np.zeros(len(ids), dtype=np.int32)), pa.array(["cpu"])
                ).cast(dict_type),
                "kind": pa.DictionaryArray.from_arrays(
                    pa.array(np.frombuffer(kinds, dtype=np.int8).astype(np.int32)),
                    pa.array(kind_values, pa.string()),
                ),
                "category": pa.DictionaryArray.from_arrays(
                    pa.array(np.frombuffer(kinds, dtype=np.int8).astype(np.int32)),
                    pa.array([f"dlprof_{k}" for k in kind_values], pa.string()),
                ),
                "name": pa.DictionaryArray.from_arrays(
                    pa.array(np.frombuffer(names, dtype=np.int32)),
                    pa.array(name_values, pa.string()),
                ),
                "start_ns": pa.array(start),
                "dur_ns": pa.array(dur),
                "bytes": pa.array(byte_values, mask=byte_values < 0),
            }
        )
