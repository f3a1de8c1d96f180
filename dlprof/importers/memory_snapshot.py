"""PyTorch's CUDA memory snapshots (``torch.cuda.memory._dump_snapshot``) into the memory table.

A snapshot is a pickled dict: ``segments`` (the caching allocator's memory at the moment it was
taken, each segment's ``blocks`` with their ``size``, ``address`` and ``state``) and, when
``torch.cuda.memory._record_memory_history()`` was on, ``device_traces``: per device the
allocator's recent actions, each with ``action``, ``addr``, ``size``, ``stream``, ``frames`` and
(torch 2.1 and later) ``time_us``::

    rows, counts = convert_snapshot(read_snapshot(Path("snapshot.pickle")))

What becomes a memory row: ``alloc`` (+size) and ``free_completed`` (-size, when the block can
be reused: a ``free_requested`` on another stream's memory waits for it); ``segment_alloc`` and
``segment_free`` move the reserved total. ``total_allocated`` starts from what was allocated
before the trace's first action: the active blocks of the snapshot's segments less the trace's
net allocation, so blocks the trace never saw allocated (older than the history, or dropped from
its ring buffer) count, as they do in the allocator's own total. Entries with a ``category``
(``torch.profiler``'s ``_memory_profile`` writes them) keep it. Frames are not kept.

Unpickling runs code a file names; :class:`SnapshotUnpickler` refuses every global, so a file
can only hold the built-in containers and scalars a snapshot is made of.
"""

from __future__ import annotations

import io
import pickle
from collections import Counter
from typing import Any, TypeGuard

import numpy as np
import pyarrow as pa

SNAPSHOT_SUFFIXES = (".pickle", ".pkl")
PICKLE_OPCODE = b"\x80"  # PROTO: every pickle of protocol 2 or later starts with it
_ALLOCATED = {"alloc": 1, "free_completed": -1}
_RESERVED = {"segment_alloc": 1, "segment_free": -1}
_ACTIVE = "active_allocated"


class SnapshotError(ValueError):
    """Not a memory snapshot, or one that cannot be read safely; the message is one line."""


class SnapshotUnpickler(pickle.Unpickler):
    """An unpickler that builds only dicts, lists, tuples, sets, strings, bytes and numbers."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: a memory snapshot holds no objects")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refusing a persistent reference: a memory snapshot holds none")


def read_snapshot(data: bytes) -> dict[str, Any]:
    """A snapshot's dict from its pickled bytes (decompressed).

    Raises:
        SnapshotError: the bytes are not a pickle of a snapshot's plain shape, or name any class.
    """
    try:
        value = SnapshotUnpickler(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError,
            AttributeError, MemoryError, RecursionError) as error:
        raise SnapshotError(f"not a readable memory snapshot ({error})") from None
    if not isinstance(value, dict) or not isinstance(value.get("segments", []), list) \
            or not isinstance(value.get("device_traces", []), list) \
            or not ("segments" in value or "device_traces" in value):
        raise SnapshotError("a pickle, but not a PyTorch memory snapshot (no 'segments' or 'device_traces' list)")
    return value


def convert_snapshot(snapshot: dict[str, Any], pid: int = 0) -> tuple[pa.Table, Counter[str]]:
    """The trace entries of every device as memory-table rows.

    Args:
        snapshot: what :func:`read_snapshot` returns.
        pid: the process to file the rows under (a snapshot does not say).

    Returns:
        The rows (device ``cuda:N``, times in epoch nanoseconds, or the entries' order from 0
        where the snapshot records no times), and counts of what was not turned into rows, by
        reason (``snapshot``, ``oom``, ``free_requested`` and malformed entries).

    Raises:
        SnapshotError: the snapshot records no allocator actions (taken without
            ``_record_memory_history``): there is nothing over time to import.
    """
    traces = snapshot.get("device_traces", [])
    skipped: Counter[str] = Counter()
    tables = [_device_rows(index, entries, snapshot.get("segments", []), pid, skipped)
              for index, entries in enumerate(traces) if isinstance(entries, list) and entries]
    tables = [table for table in tables if table.num_rows]
    if not tables:
        raise SnapshotError("a memory snapshot without allocator history (no 'alloc' or 'free_completed' "
                            "entries); record one with torch.cuda.memory._record_memory_history()")
    return pa.concat_tables(tables), skipped


def _device_rows(device: int, entries: list[Any], segments: list[Any], pid: int,
                 skipped: Counter[str]) -> pa.Table:
    times, sizes, addrs, categories, reserving = [], [], [], [], []
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("action"), str):
            skipped["malformed entries"] += 1
            continue
        action = entry["action"]
        sign = _ALLOCATED.get(action, 0) or _RESERVED.get(action, 0)
        size, addr = entry.get("size"), entry.get("addr")
        if not sign:
            skipped[action] += 1
            continue
        if not _is_int(size) or not _is_int(addr):
            skipped["malformed entries"] += 1
            continue
        time_us = entry.get("time_us")
        times.append(int(time_us) if _is_int(time_us) else None)
        sizes.append(sign * size)
        addrs.append(addr)
        category = entry.get("category")
        categories.append(category if isinstance(category, str) else None)
        reserving.append(action in _RESERVED)
    if not sizes:
        return pa.table({})
    size = np.asarray(sizes, dtype=np.int64)
    is_reserve = np.asarray(reserving, dtype=bool)
    allocated_steps = np.where(is_reserve, 0, size)
    reserved_steps = np.where(is_reserve, size, 0)
    held, reserved = _segment_state(segments, device)
    # What the trace does not explain was there before its first entry.
    allocated = max(held - int(allocated_steps.sum()), 0) + np.cumsum(allocated_steps)
    reserved_total = max(reserved - int(reserved_steps.sum()), 0) + np.cumsum(reserved_steps)
    keep = ~is_reserve
    n = int(keep.sum())
    return pa.table({
        "pid": pa.array(np.full(n, pid, dtype=np.int64)),
        "device": pa.array([f"cuda:{device}"] * n, pa.string()).dictionary_encode(),
        "ts_ns": pa.array(_times_ns(times)[keep]),
        "bytes": pa.array(size[keep]),
        "total_allocated": pa.array(allocated[keep]),
        "total_reserved": pa.array(reserved_total[keep]),
        "addr": pa.array(np.asarray(addrs, dtype=np.int64)[keep]),
        "category": pa.array([c for c, k in zip(categories, keep, strict=True) if k], pa.string()).dictionary_encode(),
    })


def _times_ns(times: list[int | None]) -> np.ndarray:
    """Epoch nanoseconds, strictly increasing: entries of one microsecond keep their order as
    nanoseconds within it (so a free and a reuse of its address in that microsecond stay in
    order); without times, the entries' order."""
    if any(t is None for t in times):
        return np.arange(len(times), dtype=np.int64)
    ns = np.asarray(times, dtype=np.int64) * 1000
    order = np.arange(len(ns))
    # Position within its run of equal microseconds (the trace is in time order).
    starts = np.r_[0, np.flatnonzero(np.diff(ns)) + 1]
    runs = np.repeat(starts, np.diff(np.r_[starts, len(ns)]))
    ordered: np.ndarray = ns + np.minimum(order - runs, 999)
    return ordered


def _segment_state(segments: list[Any], device: int) -> tuple[int, int]:
    """Bytes of active blocks and of segments on ``device`` when the snapshot was taken."""
    held = reserved = 0
    for segment in segments:
        if not isinstance(segment, dict) or segment.get("device", 0) != device:
            continue
        total = segment.get("total_size")
        reserved += total if _is_int(total) else 0
        for block in segment.get("blocks", []) if isinstance(segment.get("blocks"), list) else []:
            if isinstance(block, dict) and block.get("state") == _ACTIVE and _is_int(block.get("size")):
                held += block["size"]
    return held, reserved


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)
