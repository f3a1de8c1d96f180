"""A rank's table read a batch at a time, in the order the store keeps it, never whole.

The store's contract (:mod:`dlprof.store.layout`): per rank, final parts ``part-NNNNN.parquet``,
one per window, each sorted in track order for slices (pid, device, tid, start, outer before
inner) and by ``ts_ns`` for counters and memory. A slice still open when a save was made (a step
saved inside, the regions and layers around it) is written with a later window, though it began
in an earlier one; a scan of slices hands it out with the window its start falls in, so that
each track's slices come in start order across windows (a Perfetto track's begin and end
events need it). A scan reads the parts in name order, row group by row group, only the columns
asked for, with the rank's clock offset applied (as :class:`dlprof.store.reader.Run` applies it),
so memory follows the batch; a part that takes such slices back is read whole (one save's rows).
Loose chunks (rows no part holds: a run killed, a worker that saved late) come last, read whole,
nested and sorted: the one case that is not bounded::

    for batch in scan(run, StoreTable.SLICES, rank=0, columns=["name", "dur_ns"]):
        ...   # pyarrow.RecordBatch

:func:`ranks`, :func:`rows` and :func:`column_min` answer from the files' footers where they
can, without reading rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dlprof.keys import StoreTable
from dlprof.store.layout import rank_files
from dlprof.store.nesting import nest_slices, track_order
from dlprof.store.reader import Run, RunError
from dlprof.store.schema import SCHEMAS, conform
from dlprof.store.writer import read_chunks

BATCH_ROWS = 65_536
_TIME_COLUMNS = ("start_ns", "ts_ns")


def ranks(run: Run, table: StoreTable) -> list[int]:
    """The ranks that hold rows of ``table``, ascending."""
    return [rank for rank, files in _rank_files(run.path, table) if _row_count(files) > 0]


def rows(run: Run, table: StoreTable, rank: int | None = None) -> int:
    """How many rows ``table`` holds (in one rank, or in all), from the files' footers."""
    return sum(_row_count(files) for r, files in _rank_files(run.path, table) if rank in (None, r))


def column_min(run: Run, table: StoreTable, column: str) -> int | None:
    """The smallest value of a time column over every rank (offsets applied), or None if empty.

    From the part files' row-group statistics where they have them; otherwise the column is read.
    """
    offsets = run.clock_offsets()
    found: list[int] = []
    for rank, (parts, chunks) in _rank_files(run.path, table):
        for path in [*parts, *chunks]:
            least = _statistics_min(path, column)
            if least is None:
                values = pq.read_table(path, columns=[column]).column(column)
                least = pc.min(values).as_py()
            if least is not None:
                found.append(least - offsets.get(rank, 0))
    return min(found) if found else None


def scan(run: Run, table: StoreTable, rank: int, columns: list[str] | None = None,
         batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """One rank's rows of ``table`` in stored order, a batch at a time.

    Args:
        run: the run.
        table: which table.
        rank: which rank.
        columns: the columns wanted (all of the schema's by default); dictionary columns stay
            dictionary-encoded, each batch with its own dictionary.
        batch_rows: rows per batch at most.

    Yields:
        Record batches with exactly ``columns``, times on rank 0's clock.

    Raises:
        RunError: a file is damaged.
    """
    schema = SCHEMAS[table]
    wanted = columns or schema.names
    offset = run.clock_offsets().get(rank, 0)
    for files in (f for r, f in _rank_files(run.path, table) if r == rank):
        parts, chunks = files
        try:
            batches = (_slice_batches_in_order(parts, wanted, batch_rows) if table is StoreTable.SLICES
                       else _part_batches(parts, wanted, batch_rows))
            for batch in batches:
                yield _shifted(batch, offset)
            if chunks:
                for batch in _chunk_batches(table, chunks, wanted, batch_rows):
                    yield _shifted(batch, offset)
        except (pa.ArrowInvalid, OSError) as error:
            detail = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise RunError(f"{(parts or chunks)[0].parent}: damaged Parquet file ({detail})") from None


def _rank_files(run_dir: Path, table: StoreTable) -> list[tuple[int, tuple[list[Path], list[Path]]]]:
    """Per rank, ascending: its parts in name order, and its loose chunks."""
    table_dir = run_dir / str(table)
    if not table_dir.is_dir():
        return []
    found = []
    for directory in table_dir.iterdir():
        key, _, value = directory.name.partition("=")
        if directory.is_dir() and key == "rank" and value.isdigit():
            files = rank_files(directory)
            found.append((int(value), (files.parts, files.loose_chunks)))
    return sorted(found)


def _row_count(files: tuple[list[Path], list[Path]]) -> int:
    return sum(pq.read_metadata(path).num_rows for path in [*files[0], *files[1]])


def _statistics_min(path: Path, column: str) -> int | None:
    """The column's least value from a file's row-group statistics; None where they lack it."""
    metadata = pq.read_metadata(path)
    names = metadata.schema.to_arrow_schema().names
    if column not in names:
        return None
    index = names.index(column)
    least: int | None = None
    for group in range(metadata.num_row_groups):
        chunk = metadata.row_group(group).column(index)
        stats = chunk.statistics
        if metadata.row_group(group).num_rows == 0:
            continue
        if stats is None or not stats.has_min_max:
            return None
        least = stats.min if least is None else min(least, stats.min)
    return least


def _part_batches(parts: list[Path], columns: list[str], batch_rows: int) -> Iterator[pa.RecordBatch]:
    for path in parts:
        file = pq.ParquetFile(path)
        present = set(file.schema_arrow.names)
        # A run written before a column existed reads with it null (as the reader does).
        for batch in file.iter_batches(batch_size=batch_rows, columns=[c for c in columns if c in present]):
            yield _with_columns(batch, columns)


# What putting slices in track order reads besides the columns asked for.
_ORDER_COLUMNS = ("pid", "device", "tid", "start_ns", "dur_ns", "kind")


@dataclass
class _Window:
    """One part of the slices: the time its own rows reach, and what it hands back or takes."""

    path: Path
    after_ns: int | None = None  # its rows start after this (the window before reached it)
    reach_ns: int | None = None  # ... and at or before this
    # Its rows starting before this began in an earlier window (open at a save): they go back
    # to the window their start falls in. None: it has none.
    own_from_ns: int | None = None
    # Later parts holding rows that began in this window, each with its own_from_ns.
    taken_from: list[tuple[Path, int]] = field(default_factory=list)


def _windows(parts: list[Path]) -> list[_Window]:
    """Which part hands which slices back: one pass over each part's start column."""
    windows: list[_Window] = []
    for path in parts:
        starts = pq.read_table(path, columns=["start_ns"]).column(0).to_numpy(zero_copy_only=False)
        before = windows[-1].reach_ns if windows else None
        window = _Window(path, after_ns=before)
        own = starts if before is None else starts[starts >= before]
        if before is not None and len(own) < len(starts):
            window.own_from_ns = before
            # Each early row goes to the first window whose rows reach its start: every window
            # before it ended before that start, every one after began after it.
            reaches = np.asarray([w.reach_ns for w in windows])
            for target in np.unique(np.searchsorted(reaches, starts[starts < before], side="left")):
                windows[int(target)].taken_from.append((path, before))
        reach = [int(own.max())] if len(own) else []
        window.reach_ns = max([*reach, *([before] if before is not None else [])], default=None)
        windows.append(window)
    return windows


def _slice_batches_in_order(parts: list[Path], columns: list[str], batch_rows: int) -> Iterator[pa.RecordBatch]:
    """The parts' slices with each slice in the window its start falls in (see the module)."""
    windows = _windows(parts) if len(parts) > 1 else []
    if not any(w.own_from_ns is not None for w in windows):
        yield from _part_batches(parts, columns, batch_rows)
        return
    read = [*columns, *(c for c in _ORDER_COLUMNS if c not in columns)]
    for window in windows:
        if not window.taken_from and window.own_from_ns is None:
            yield from _part_batches([window.path], columns, batch_rows)
            continue
        pieces = [_read(window.path, read, window.own_from_ns, None)]
        for later, before in window.taken_from:
            low = window.after_ns if window.after_ns is not None else None
            high = min(before - 1, window.reach_ns) if window.reach_ns is not None else before - 1
            pieces.append(_read(later, read, low, high, above=True))
        merged = pa.concat_tables(pieces).unify_dictionaries().combine_chunks()
        yield from merged.take(track_order(merged)).select(columns).to_batches(max_chunksize=batch_rows)


def _read(path: Path, columns: list[str], low: int | None, high: int | None, above: bool = False) -> pa.Table:
    """A part's rows with exactly ``columns``, starting at or after ``low`` (after it, with
    ``above``) and at or before ``high``."""
    present = set(pq.read_schema(path).names)
    table = pq.read_table(path, columns=[c for c in columns if c in present])
    start = table.column("start_ns")
    if low is not None:
        table = table.filter(pc.greater(start, low) if above else pc.greater_equal(start, low))
    if high is not None:
        table = table.filter(pc.less_equal(table.column("start_ns"), high))
    return conform(table, pa.schema([_schema_field(table.schema, c) for c in columns]))


def _schema_field(schema: pa.Schema, column: str) -> pa.Field:
    if column in schema.names:
        return schema.field(column)
    for table_schema in SCHEMAS.values():
        if column in table_schema.names:
            return table_schema.field(column)
    raise KeyError(column)


def _chunk_batches(table: StoreTable, chunks: list[Path], columns: list[str],
                   batch_rows: int) -> Iterator[pa.RecordBatch]:
    """Rows no part holds: the chunks read whole, nested (slices) or sorted by time."""
    data = read_chunks(chunks, SCHEMAS[table])
    if table is StoreTable.SLICES:
        data, _ = nest_slices(data)
    elif "ts_ns" in data.column_names:
        data = data.sort_by("ts_ns")
    yield from data.select(columns).to_batches(max_chunksize=batch_rows)


def _with_columns(batch: pa.RecordBatch, columns: list[str]) -> pa.RecordBatch:
    if batch.schema.names == columns:
        return batch
    table = conform(pa.Table.from_batches([batch]), pa.schema([_field(batch, c) for c in columns]))
    return table.combine_chunks().to_batches()[0] if table.num_rows else pa.RecordBatch.from_pylist(
        [], schema=table.schema)


def _field(batch: pa.RecordBatch, column: str) -> pa.Field:
    return _schema_field(batch.schema, column)


def _shifted(batch: pa.RecordBatch, offset_ns: int) -> pa.RecordBatch:
    """Move a rank's times onto rank 0's clock."""
    if not offset_ns:
        return batch
    arrays = list(batch.columns)
    for index, name in enumerate(batch.schema.names):
        if name in _TIME_COLUMNS:
            arrays[index] = pc.subtract(arrays[index], pa.scalar(offset_ns, pa.int64()))
    return pa.RecordBatch.from_arrays(arrays, schema=batch.schema)
