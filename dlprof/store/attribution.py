"""Which op made each allocation: memory rows tied to the innermost op on their thread.

Sources record allocations as instants on a thread (Kineto writes all of them after the ops), so
the tie is made once, when a rank's tables are compacted, after nesting: each allocation without
a slice gets the innermost op running on its thread at that instant, and each op without a byte
count gets the sum of the bytes it allocated itself (torch's "self CPU memory").
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dlprof.keys import Kind
from dlprof.store.nesting import innermost_containing

_ALLOCATING_KINDS = [str(Kind.OP), str(Kind.COMM)]


def attribute_memory(slices: pa.Table, memory: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Fill ``memory.slice_id`` and ops' ``bytes`` where the sources left them empty.

    Args:
        slices: one rank's slices.
        memory: the same rank's allocations and frees, with ``pid`` and ``tid``.

    Returns:
        The slices with allocated bytes on the ops that allocated, and the memory rows with the
        ids of those ops.
    """
    if memory.num_rows == 0 or slices.num_rows == 0:
        return slices, memory
    kinds = pc.cast(slices.column("kind"), pa.string())
    is_op = pc.is_in(kinds, pa.array(_ALLOCATING_KINDS)).to_numpy(zero_copy_only=False)
    slice_pid = slices.column("pid").to_numpy(zero_copy_only=False)
    slice_tid = slices.column("tid").to_numpy(zero_copy_only=False)
    start = slices.column("start_ns").to_numpy(zero_copy_only=False)
    end = start + slices.column("dur_ns").to_numpy(zero_copy_only=False)
    ids = slices.column("id").to_numpy(zero_copy_only=False)

    owner = memory.column("slice_id").to_numpy(zero_copy_only=False).astype(np.float64)
    unowned = np.isnan(owner) & memory.column("tid").is_valid().to_numpy(zero_copy_only=False)
    memory_pid = memory.column("pid").to_numpy(zero_copy_only=False)
    memory_tid = memory.column("tid").fill_null(-1).to_numpy(zero_copy_only=False)
    ts = memory.column("ts_ns").to_numpy(zero_copy_only=False)
    found = np.full(memory.num_rows, -1, dtype=np.int64)  # position in slices
    for pid, tid in set(zip(memory_pid[unowned].tolist(), memory_tid[unowned].tolist(), strict=True)):
        candidates = np.flatnonzero(is_op & (slice_pid == pid) & (slice_tid == tid))
        if len(candidates) == 0:
            continue  # a thread that allocated but ran no op (an allocator's own thread)
        points = np.flatnonzero(unowned & (memory_pid == pid) & (memory_tid == tid))
        inner = innermost_containing(start[candidates], end[candidates], ts[points])
        found[points] = np.where(inner >= 0, candidates[np.maximum(inner, 0)], -1)

    attributed = found >= 0
    slice_id = memory.column("slice_id").to_numpy(zero_copy_only=False).astype(np.float64)
    new_ids = np.where(attributed, ids[np.maximum(found, 0)], np.nan_to_num(slice_id).astype(np.int64))
    keep_null = ~attributed & np.isnan(slice_id)
    memory = memory.set_column(
        memory.schema.get_field_index("slice_id"),
        "slice_id",
        pa.array(new_ids.astype(np.int64), mask=keep_null),
    )
    allocated = memory.column("bytes").fill_null(0).to_numpy(zero_copy_only=False)
    owned = attributed & (allocated > 0)
    op_bytes = np.zeros(slices.num_rows, dtype=np.int64)
    np.add.at(op_bytes, found[owned], allocated[owned])
    measured = pa.array(op_bytes, mask=op_bytes <= 0)
    # A size the source gave (a memcpy's) stays; ops get what they allocated.
    merged = pc.coalesce(slices.column("bytes"), measured)
    slices = slices.set_column(slices.schema.get_field_index("bytes"), "bytes", merged)
    return slices, memory
