"""Backward layers aligned to the autograd nodes their hooks ran in, on hand-built rows laid out
as autograd runs them: each node's ``evaluate_function`` range holding its op, pre-hooks before
the op and post-hooks after it."""

from __future__ import annotations

import pytest

from dlprof.store import nesting
from dlprof.store.backward_layers import align_backward_layers
from dlprof.store.nesting import nest_slices
from tests.builders import slice_table

NODE = "autograd::engine::evaluate_function: "


def row(i: int, name: str, start: int, end: int, kind: str = "op", tid: int = 2) -> tuple[int, int, str, str, int, int]:
    return (i, tid, kind, name, start, end - start)


# Two nodes, then the first layer's parameter gradient; a layer whose input needs no gradient
# ends in its node's post-hook; a boundary inside a node's op stays where it is.
ROWS = [
    row(1, f"{NODE}AddmmBackward0", 100, 200), row(2, "AddmmBackward0", 110, 180),
    row(3, f"{NODE}torch::autograd::AccumulateGrad", 205, 220),
    row(4, f"{NODE}ReluBackward0", 230, 300), row(5, "ReluBackward0", 240, 280),
    row(6, f"{NODE}ConvolutionBackward0", 310, 400), row(7, "ConvolutionBackward0", 320, 380),
    row(10, "fc (Linear) backward", 104, 236, kind="module"),  # pre-hooks of its node and the next
    row(11, "relu (ReLU) backward", 234, 314, kind="module"),
    row(12, "conv (Conv2d) backward", 313, 390, kind="module"),  # ends in its node's post-hook
    row(13, "net (Net) backward", 103, 391, kind="module"),
    row(14, "odd (Odd) backward", 250, 260, kind="module"),  # inside ReluBackward0's op: left alone
    row(15, "other (Linear) backward", 104, 236, kind="module", tid=3),  # no nodes on its thread
]


def test_boundaries_move_to_the_edges_of_the_nodes_they_fell_in() -> None:
    aligned, moved = align_backward_layers(slice_table(ROWS))
    spans = {i: (s, s + d) for i, s, d in zip(aligned.column("id").to_pylist(), aligned.column("start_ns").to_pylist(),
                                                aligned.column("dur_ns").to_pylist(), strict=True)}
    assert spans[10] == (100, 230) and spans[11] == (230, 310) and spans[12] == (310, 400)
    assert spans[13] == (100, 400)
    assert spans[14] == (250, 260) and spans[15] == (104, 236)
    assert spans[1] == (100, 200) and spans[4] == (230, 300)  # the ops are as recorded
    assert moved == 4


def test_aligned_layers_nest_with_nothing_moved(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [r for r in ROWS if r[0] not in (14, 15)]
    nested, report = nest_slices(slice_table(rows))
    parents = dict(zip(nested.column("id").to_pylist(), nested.column("parent_id").to_pylist(), strict=True))
    assert parents[10] == parents[11] == parents[12] == 13
    assert parents[1] == parents[3] == 10 and parents[4] == 11 and parents[6] == 12
    assert report.as_counts() == {"aligned_to_autograd": 4}
    # As the hooks timed them, nesting moved ops and put layers inside the nodes they ran.
    monkeypatch.setattr(nesting, "align_backward_layers", lambda table: (table, 0))
    nested, report = nest_slices(slice_table(rows))
    parents = dict(zip(nested.column("id").to_pylist(), nested.column("parent_id").to_pylist(), strict=True))
    assert report.moved_past_parent + report.extended_over_parent + report.clipped_to_parent > 0
    assert parents[12] == 6  # the first layer's backward inside its own node
