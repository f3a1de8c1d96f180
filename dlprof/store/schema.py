"""The on-disk schema of a run: one Arrow schema per table, and how each is written to Parquet.

Any Parquet reader can open a run without dlprof::

    import pyarrow.dataset as ds
    slices = ds.dataset("run/slices", partitioning="hive").to_table()

The rank is the partition directory (``slices/rank=0/``), never a column inside the files.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from dlprof.keys import StoreTable
from dlprof.store.safe_files import atomic_path
from dlprof.store.version import SCHEMA_VERSION

__all__ = ["SCHEMAS", "SCHEMA_VERSION", "conform", "write_parquet"]

_dict_str = pa.dictionary(pa.int32(), pa.string())

SLICES = pa.schema(
    [
        ("id", pa.int64()),
        ("pid", pa.int64()),
        ("tid", pa.int64()),  # a thread id, or a GPU stream on a device
        ("device", _dict_str),  # "cpu", "cuda:0"
        ("kind", _dict_str),  # dlprof.keys.Kind, or a foreign trace's own category
        ("category", _dict_str),  # the category as the source named it
        ("name", _dict_str),
        ("start_ns", pa.int64()),
        ("dur_ns", pa.int64()),
        ("depth", pa.int16()),
        ("parent_id", pa.int64()),
        ("self_ns", pa.int64()),
        ("correlation_id", pa.int64()),
        ("external_id", pa.int64()),
        ("sequence_nr", pa.int64()),
        ("input_shapes", _dict_str),
        ("input_dtypes", _dict_str),
        ("flops", pa.int64()),
        ("bytes", pa.int64()),  # memcpy/memset size; for a module, its output activations
        ("grid", _dict_str),
        ("block", _dict_str),
        ("registers", pa.int32()),
        ("shared_memory", pa.int64()),
        ("blocks_per_sm", pa.float32()),
        ("warps_per_sm", pa.float32()),
        ("occupancy", pa.float32()),
        ("stream", pa.int64()),
        # An op's logical type (MatMul for TensorFlow's _MklMatMul), tfprof's op view groups by it.
        ("op_type", _dict_str),
        # The name scope or module path the slice ran under ("sequential/dense_1").
        ("scope", _dict_str),
        ("args", pa.string()),  # JSON, only for what a foreign trace carries beyond the columns
        # dlprof's own pauses of the program inside the slice (its ``profiler`` slices, at any
        # depth; null: none): the user's time is dur_ns - pause_ns. Runs written before it read null.
        ("pause_ns", pa.int64()),
    ]
)

COUNTERS = pa.schema(
    [
        ("pid", pa.int64()),
        ("device", _dict_str),
        ("track", _dict_str),
        ("ts_ns", pa.int64()),
        ("value", pa.float64()),
        ("unit", _dict_str),
    ]
)

METRICS = pa.schema(
    [
        ("slice_id", pa.int64()),
        ("metric", _dict_str),
        ("value", pa.float64()),
        ("scope", _dict_str),  # "thread" or "process"
        ("method", _dict_str),  # "exact" or "sampled"
    ]
)

MEMORY = pa.schema(
    [
        ("pid", pa.int64()),
        ("tid", pa.int64()),  # the thread that allocated, to find the op that did
        ("device", _dict_str),
        ("ts_ns", pa.int64()),
        ("bytes", pa.int64()),  # positive for an allocation, negative for a free
        ("total_allocated", pa.int64()),
        ("total_reserved", pa.int64()),
        ("addr", pa.int64()),
        ("slice_id", pa.int64()),
        ("category", _dict_str),  # what the memory holds, where known (parameter, activation...)
    ]
)

# A metric's value over training (loss, accuracy), or a mark in its time line (eval_start): from
# dlprof.log(), a Keras fit's logs, MLPerf's ``:::MLLOG`` lines. Runs written before the table
# existed have no ``series`` directory and read it as empty (no schema version change).
SERIES = pa.schema(
    [
        ("pid", pa.int64()),
        ("ts_ns", pa.int64()),
        ("step", pa.int64()),  # the steps ended when the value was logged
        ("epoch", pa.float64()),  # the epoch it belongs to, where the source says
        ("samples", pa.int64()),  # training samples seen, where the source says
        ("split", _dict_str),  # "train", "eval", or the source's own word
        ("metric", _dict_str),
        ("value", pa.float64()),  # null for a mark (an interval's start or end)
        ("source", _dict_str),  # dlprof.keys.SeriesSource
    ]
)

SCHEMAS: dict[StoreTable, pa.Schema] = {
    StoreTable.SLICES: SLICES,
    StoreTable.COUNTERS: COUNTERS,
    StoreTable.METRICS: METRICS,
    StoreTable.MEMORY: MEMORY,
    StoreTable.SERIES: SERIES,
}

# Columns that change little from one row to the next once rows are sorted by time: delta
# encoding stores them in a few bits each.
_DELTA_COLUMNS = {"id", "start_ns", "dur_ns", "self_ns", "parent_id", "ts_ns", "slice_id"}


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Return ``table`` with exactly ``schema``'s columns, in order, missing ones as nulls."""
    columns = []
    for field in schema:
        if field.name in table.column_names:
            column = table.column(field.name)
            if column.type != field.type:
                column = column.cast(field.type)
            columns.append(column)
        else:
            columns.append(pa.nulls(table.num_rows, field.type))
    return pa.Table.from_arrays(columns, schema=schema)


def write_parquet(table: pa.Table, path: Path) -> None:
    """Write one complete Parquet file atomically: a reader never sees half of it."""
    schema = table.schema
    dictionary_columns = [f.name for f in schema if pa.types.is_dictionary(f.type)]
    encodings = {
        f.name: "DELTA_BINARY_PACKED"
        for f in schema
        if f.name in _DELTA_COLUMNS and pa.types.is_int64(f.type)
    }
    with atomic_path(path) as partial:
        pq.write_table(
            table,
            partial,
            compression="zstd",
            use_dictionary=dictionary_columns,
            column_encoding=encodings,
            # Long kernel names and shape lists must stay dictionary-encoded.
            dictionary_pagesize_limit=8 << 20,
            write_statistics=["start_ns", "ts_ns"],
        )
