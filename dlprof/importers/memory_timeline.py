"""torch.profiler's raw memory timeline (``export_memory_timeline_raw``) into the memory table.

The file is a JSON array of ``[time_ns, action, bytes, category]`` rows for one device: time -1
for memory that existed before profiling began, bytes negative when memory is released, and the
category an index into torch's own ordering of what tensors hold.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

# torch/profiler/_memory_profiler.py: _CATEGORY_TO_INDEX follows _CATEGORY_TO_COLORS' order.
CATEGORIES = (
    "parameter",
    "optimizer_state",
    "input",
    "temporary",
    "activation",
    "gradient",
    "autograd_detail",
    "unknown",
)
_PREEXISTING = -1


def is_memory_timeline(value: Any) -> bool:
    """True for a parsed raw memory timeline: a list of four-number rows."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(row, list) and len(row) == 4 for row in value[:16])
    )


def convert_memory_timeline(rows: list[list[int]], pid: int = 0, device: str = "unknown") -> pa.Table:
    """The rows as memory-table rows, with a running total of allocated bytes.

    Args:
        rows: the parsed file.
        pid: the process to file them under (the file does not say).
        device: the device the timeline was exported for (the file does not say).

    Returns:
        One memory row per timeline row, sorted by time; memory that existed before profiling
        is placed at the first recorded instant.
    """
    data = np.asarray(rows, dtype=np.int64).reshape(-1, 4)
    times, sizes, categories = data[:, 0], data[:, 2], data[:, 3]
    recorded = times[times != _PREEXISTING]
    first = int(recorded.min()) if len(recorded) else 0
    times = np.where(times == _PREEXISTING, first, times)
    order = np.argsort(times, kind="stable")
    times, sizes, categories = times[order], sizes[order], categories[order]
    names = np.asarray(CATEGORIES, dtype=object)[np.clip(categories, 0, len(CATEGORIES) - 1)]
    n = len(times)
    return pa.table(
        {
            "pid": pa.array(np.full(n, pid, dtype=np.int64)),
            "device": pa.array([device] * n).dictionary_encode(),
            "ts_ns": pa.array(times),
            "bytes": pa.array(sizes),
            "total_allocated": pa.array(np.cumsum(sizes)),
            "category": pa.array(names.tolist(), pa.string()).dictionary_encode(),
        }
    )
