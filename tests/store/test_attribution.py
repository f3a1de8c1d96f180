"""Allocations tied to the op that made them when a rank is compacted."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

import dlprof
from dlprof.keys import StoreTable
from dlprof.store.manifest import Manifest
from dlprof.store.writer import RankWriter


def test_allocations_go_to_the_innermost_op_on_their_thread(tmp_path: Path) -> None:
    Manifest(name="t", command=["t"]).write(tmp_path)
    writer = RankWriter(tmp_path, 0)
    writer.write_chunk(StoreTable.SLICES, pa.table({
        "id": [1, 2, 3, 4], "pid": [9, 9, 9, 9], "tid": [1, 1, 2, 7],
        "device": pa.array(["cpu", "cpu", "cpu", "cuda:0"]).dictionary_encode(),
        "kind": pa.array(["op", "op", "op", "memcpy"]).dictionary_encode(),
        "name": pa.array(["outer", "inner", "other-thread", "copy"]).dictionary_encode(),
        "start_ns": [0, 10, 0, 0], "dur_ns": [100, 20, 100, 50], "bytes": [None, None, None, 4096],
    }), "test")
    # Written in a later chunk, as Kineto writes its memory events after the ops.
    writer.write_chunk(StoreTable.MEMORY, pa.table({
        "pid": [9, 9, 9, 9, 9], "tid": [1, 1, 1, 2, 1], "ts_ns": [15, 50, 15, 5, 500],
        "bytes": [64, 32, -64, 8, 16], "device": pa.array(["cpu"] * 5).dictionary_encode(),
    }), "test")
    writer.compact()
    run = dlprof.load(tmp_path)
    memory = run.memory.sort_values(["ts_ns", "bytes"])
    assert memory["slice_id"].tolist()[:4] == [3, 2, 2, 1]
    assert pd_isna(memory["slice_id"].iloc[-1]), "an allocation outside every op stays unowned"
    slices = run.slices.set_index("name")
    assert slices.loc["inner", "bytes"] == 64, "frees do not count; only its own allocations"
    assert slices.loc["outer", "bytes"] == 32
    assert slices.loc["copy", "bytes"] == 4096, "a size the source gave is kept"


def pd_isna(value: object) -> bool:
    import pandas as pd

    return bool(pd.isna(value))


def test_allocations_on_a_thread_without_ops_stay_unowned(tmp_path: Path) -> None:
    # TensorFlow's allocator records some allocations on threads that run no op.
    Manifest(name="t", command=["t"]).write(tmp_path)
    writer = RankWriter(tmp_path, 0)
    writer.write_chunk(StoreTable.SLICES, pa.table({
        "id": [1], "pid": [9], "tid": [1], "device": pa.array(["cpu"]).dictionary_encode(),
        "kind": pa.array(["op"]).dictionary_encode(), "name": pa.array(["op"]).dictionary_encode(),
        "start_ns": [0], "dur_ns": [100],
    }), "test")
    writer.write_chunk(StoreTable.MEMORY, pa.table({
        "pid": [9, 9], "tid": [1, 5], "ts_ns": [50, 50], "bytes": [64, 32],
        "device": pa.array(["cpu"] * 2).dictionary_encode(),
    }), "test")
    writer.compact()
    memory = dlprof.load(tmp_path).memory.sort_values("tid")
    assert memory["slice_id"].iloc[0] == 1 and pd_isna(memory["slice_id"].iloc[1])
