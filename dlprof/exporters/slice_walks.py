"""Walks over a run's slices that several exporters share: sorted batches, unique rows, flow ids.

Rows are turned into Python values a batch at a time (see :data:`dlprof.exporters.base.BATCH_ROWS`),
so a run of millions of slices never sits in memory as Python objects all at once.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from dlprof.exporters.base import BATCH_ROWS
from dlprof.keys import StoreTable
from dlprof.store.reader import Run

# Correlation ids are CUPTI's 32-bit activity ids; the rank goes above them so that one number
# names a (rank, correlation) pair across a whole job.
_CORRELATION_BITS = 40


def slices_of(run: Run) -> pa.Table:
    """The slices table as the exporters read it.

    Args:
        run: the run to export.

    Returns:
        Its slices with a ``rank`` column, ``device`` as plain strings, and a slice recorded
        without a device counted as on the CPU (the column is nullable in the schema).
    """
    slices = run.arrow(StoreTable.SLICES)
    device = slices.column("device").cast(pa.string()).fill_null("cpu")
    return slices.set_column(slices.schema.get_field_index("device"), "device", device)


@functools.cache  # a run names a handful of devices, its rows name them millions of times
def device_index(device: str) -> int:
    """The index of a device.

    Args:
        device: a store device name, ``cpu``, ``cuda:1``, ``mps``.

    Returns:
        The number after the colon, 0 for a device named without one, -1 for ``cpu``.
    """
    if device == "cpu":
        return -1
    _, _, index = device.partition(":")
    return int(index) if index.isdigit() else 0


def sorted_slice_batches(
    slices: pa.Table, columns: list[str], batch_rows: int = BATCH_ROWS
) -> Iterator[dict[str, list[Any]]]:
    """Slices in track order, as Python lists per column, a batch at a time.

    Track order is (rank, pid, device, tid), then start, then depth: a parent before the
    children that start with it, so each track's slices come as a depth-first walk.

    Args:
        slices: the slices table (with its ``rank`` column).
        columns: the columns wanted in each batch.
        batch_rows: rows per batch.

    Returns:
        An iterator of ``{column: values}``; dictionary columns come as plain strings.
    """
    keys = pa.table(
        {
            "rank": slices.column("rank"),
            "pid": slices.column("pid"),
            "device": _decoded(slices.column("device")),
            "tid": slices.column("tid"),
            "start_ns": slices.column("start_ns"),
            "depth": slices.column("depth"),
        }
    )
    order = pc.sort_indices(keys, sort_keys=[(name, "ascending") for name in keys.column_names])
    # One chunk: a take from a table of many chunks pays for every chunk, batch after batch.
    wanted = slices.select(columns).combine_chunks()
    for offset in range(0, len(order), batch_rows):
        batch = wanted.take(order[offset : offset + batch_rows])
        yield {name: python_values(batch.column(name)) for name in columns}


def unique_rows(table: pa.Table, columns: list[str]) -> list[dict[str, Any]]:
    """The distinct values of some columns, sorted, dictionary columns as plain strings.

    Args:
        table: any table of the run.
        columns: the columns that make a row distinct.

    Returns:
        One ``{column: value}`` per distinct row.
    """
    plain = pa.table({c: _decoded(table.column(c)) for c in columns})
    distinct = plain.group_by(columns).aggregate([])
    return distinct.sort_by([(c, "ascending") for c in columns]).to_pylist()  # type: ignore[no-any-return]


def _decoded(column: pa.ChunkedArray) -> pa.ChunkedArray:
    return column.cast(pa.string()) if pa.types.is_dictionary(column.type) else column


def table_batches(table: pa.Table, batch_rows: int = BATCH_ROWS) -> Iterator[dict[str, list[Any]]]:
    """A table in its stored order (counters and memory: by time), a batch at a time.

    Returns:
        An iterator of ``{column: values}``, as :func:`python_values` makes them.
    """
    for offset in range(0, table.num_rows, batch_rows):
        rows = table.slice(offset, batch_rows)
        yield {name: python_values(rows.column(name)) for name in rows.column_names}


def python_values(column: pa.ChunkedArray) -> list[Any]:
    """A column as a Python list, None for nulls, dictionary columns as plain strings.

    A dictionary column's strings are made once per distinct value, not once per row: names
    and shapes repeat thousands of times, and this is most of the cost of a batch.
    """
    if pa.types.is_dictionary(column.type):
        values: list[Any] = []
        for chunk in column.chunks:
            words = [*chunk.dictionary.to_pylist(), None]
            codes = chunk.indices.fill_null(len(words) - 1).to_numpy(zero_copy_only=False)
            values += [words[code] for code in codes.tolist()]
        return values
    if pa.types.is_float32(column.type):
        # float32 values widened to float64 print as 0.10000000149011612; through their
        # shortest decimal text they print as 0.1 and read back as the same float32.
        column = column.cast(pa.string()).cast(pa.float64())
    return column.to_pylist()  # type: ignore[no-any-return]


def flow_key(rank: int, correlation: int) -> int:
    """One number for a (rank, correlation id) pair, unique across the ranks of a run.

    Args:
        rank: the rank the correlation id was recorded on.
        correlation: the CUPTI correlation id (its low 40 bits are used).

    Returns:
        The rank above bit 40, the correlation id below it.
    """
    return (rank << _CORRELATION_BITS) | (correlation & ((1 << _CORRELATION_BITS) - 1))
