"""Backward layers placed on the autograd nodes they ran, before a window is nested.

The layers collector times a layer's backward from Python hooks of autograd's nodes: it starts
in a pre-hook of the node that made the layer's output, and ends in a pre-hook of the node that
made its input (the next layer's first node), or, for a layer whose input needs no gradient, in
a post-hook of its own node. Autograd runs every hook inside the node's
``autograd::engine::evaluate_function: ...`` range, which the profiler records as an op: the
pre-hooks before the node's own op (``MmBackward0``), the post-hooks after it. So each boundary
lies a few microseconds inside a node's range, and the layer crosses two ranges it should hold
or follow whole: nested as recorded, a layer ended up inside its own node's range, or the next
layer's first node was moved to start after it, and a layer that begins with the node where its
outer layer ends sat inside that outer layer (``features.5 backward`` inside
``classifier backward``).

:func:`align_backward_layers` moves each such boundary to the edge of the node's range it lies in:
to the range's start when it lies before the node's op (a pre-hook: the layer begins with this
node, or ends as the next begins), to its end when it lies after the node's op ended (a post-hook:
the layer ends with its own node). A boundary inside the node's op, or in a range with no op
in it, is left where it is. Each layer's backward then holds whole the nodes autograd ran for it
and no other, and nesting has nothing to repair.

    table, aligned = align_backward_layers(table)   # before nest_window's passes
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dlprof.keys import Kind

NODE_PREFIX = "autograd::engine::evaluate_function:"
BACKWARD_SUFFIX = " backward"


def _strings(table: pa.Table, name: str) -> pa.Array:
    values = table.column(name).combine_chunks()
    return values.dictionary_decode() if isinstance(values, pa.DictionaryArray) else values


def align_backward_layers(table: pa.Table) -> tuple[pa.Table, int]:
    """Move backward layers' boundaries that lie inside an autograd node's range to its edges.

    Args:
        table: slices of one window, in any order (``pid``, ``tid``, ``device``, ``kind``,
            ``name``, ``start_ns``, ``dur_ns``).

    Returns:
        The table with the layers' ``start_ns`` and ``dur_ns`` aligned (rows in the same order),
        and how many layers had a boundary moved.
    """
    if table.num_rows == 0:
        return table, 0
    kind = _strings(table, "kind").fill_null("")
    name = _strings(table, "name").fill_null("")
    on_cpu = pc.equal(_strings(table, "device").fill_null("cpu"), "cpu")
    is_op = pc.and_(pc.equal(kind, str(Kind.OP)), on_cpu)
    is_node = pc.and_(is_op, pc.starts_with(name, NODE_PREFIX)).to_numpy(zero_copy_only=False)
    is_layer = pc.and_(pc.and_(pc.equal(kind, str(Kind.MODULE)), on_cpu), pc.ends_with(name, BACKWARD_SUFFIX))
    layers = np.flatnonzero(is_layer.to_numpy(zero_copy_only=False))
    if len(layers) == 0 or not is_node.any():
        return table, 0
    ops = is_op.to_numpy(zero_copy_only=False)
    pid = table.column("pid").to_numpy(zero_copy_only=False)
    tid = table.column("tid").to_numpy(zero_copy_only=False)
    start = table.column("start_ns").to_numpy(zero_copy_only=False).astype(np.int64)
    end = start + table.column("dur_ns").to_numpy(zero_copy_only=False).astype(np.int64)
    new_start, new_end = start.copy(), end.copy()
    for thread in {(int(pid[i]), int(tid[i])) for i in layers}:
        here = (pid == thread[0]) & (tid == thread[1])
        mine = layers[here[layers]]
        nodes = np.flatnonzero(here & is_node)
        if len(nodes) == 0:
            continue
        nodes = nodes[np.argsort(start[nodes], kind="stable")]
        head, tail = _node_op_bounds(start, end, nodes, np.flatnonzero(here & ops & ~is_node))
        new_start[mine] = _aligned(start[mine], start[nodes], end[nodes], head, tail)
        new_end[mine] = _aligned(end[mine], start[nodes], end[nodes], head, tail)
    moved = (new_start[layers] != start[layers]) | (new_end[layers] != end[layers])
    if not moved.any():
        return table, 0
    table = table.set_column(table.schema.get_field_index("start_ns"), "start_ns",
                             pa.array(new_start).cast(table.schema.field("start_ns").type))
    table = table.set_column(table.schema.get_field_index("dur_ns"), "dur_ns",
                             pa.array(new_end - new_start).cast(table.schema.field("dur_ns").type))
    return table, int(moved.sum())


def _node_op_bounds(start: np.ndarray, end: np.ndarray, nodes: np.ndarray,
                    others: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each node range (in start order), where its first op inside begins and ends: the
    node's own op (``MmBackward0``). A range with none gets its midpoint for both."""
    first_op_start = (start[nodes] + end[nodes]) // 2
    first_op_end = first_op_start.copy()
    if len(others):
        others = others[np.argsort(start[others], kind="stable")]
        other_starts = start[others]
        after = np.searchsorted(other_starts, start[nodes], side="right")
        found = after < len(others)
        candidate = others[np.minimum(after, len(others) - 1)]
        inside = found & (start[candidate] < end[nodes])
        first_op_start[inside] = start[candidate][inside]
        first_op_end[inside] = end[candidate][inside]
    return first_op_start, first_op_end


def _aligned(times: np.ndarray, node_start: np.ndarray, node_end: np.ndarray, head: np.ndarray,
             tail: np.ndarray) -> np.ndarray:
    """Each time moved to the edge of the node range it lies strictly inside (the last one to
    start before it), if it lies before that node's op (to the start) or after it (to the end)."""
    at = np.searchsorted(node_start, times, side="left") - 1
    safe = np.maximum(at, 0)
    inside = (at >= 0) & (node_start[safe] < times) & (times < node_end[safe])
    aligned = times.copy()
    early = inside & (times <= head[safe])
    late = inside & (times >= tail[safe]) & ~early
    aligned[early] = node_start[safe][early]
    aligned[late] = node_end[safe][late]
    return aligned
