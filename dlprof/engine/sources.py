"""Where each table of a run lies, as the engines read it: Parquet files, or rows in memory.

A rank's saves made final are ``part-*.parquet`` files that an engine scans itself, reading only
the columns and row groups a query needs. Chunks no part holds yet (a run killed before its last
saves were made final, a DataLoader worker that saved late) are read and nested in memory on the
way in (``dlprof.store.nesting``); ``dlprof.store.layout`` says which files are which. Either way a table's view has every column of the current schema
(missing ones null, as for a run written before a column existed), a ``rank`` column from the
partition directories, and each remote rank's times moved onto rank 0's clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dlprof.keys import StoreTable
from dlprof.store.layout import rank_files

if TYPE_CHECKING:
    import pyarrow as pa

# Each table's columns as the engines see them: (name, SQL type) in the schema's order.
# dlprof.store.schema is the source of truth (a test checks they agree); this copy lets a
# query run without importing Arrow.
STORE_COLUMNS: dict[StoreTable, tuple[tuple[str, str], ...]] = {
    StoreTable.SLICES: (
        ("id", "BIGINT"), ("pid", "BIGINT"), ("tid", "BIGINT"), ("device", "STRING"),
        ("kind", "STRING"), ("category", "STRING"), ("name", "STRING"), ("start_ns", "BIGINT"),
        ("dur_ns", "BIGINT"), ("depth", "SMALLINT"), ("parent_id", "BIGINT"), ("self_ns", "BIGINT"),
        ("correlation_id", "BIGINT"), ("external_id", "BIGINT"), ("sequence_nr", "BIGINT"),
        ("input_shapes", "STRING"), ("input_dtypes", "STRING"), ("flops", "BIGINT"),
        ("bytes", "BIGINT"), ("grid", "STRING"), ("block", "STRING"), ("registers", "INT"),
        ("shared_memory", "BIGINT"), ("blocks_per_sm", "FLOAT"), ("warps_per_sm", "FLOAT"),
        ("occupancy", "FLOAT"), ("stream", "BIGINT"), ("op_type", "STRING"), ("scope", "STRING"),
        ("args", "STRING"), ("pause_ns", "BIGINT"),
    ),
    StoreTable.COUNTERS: (
        ("pid", "BIGINT"), ("device", "STRING"), ("track", "STRING"), ("ts_ns", "BIGINT"),
        ("value", "DOUBLE"), ("unit", "STRING"),
    ),
    StoreTable.METRICS: (
        ("slice_id", "BIGINT"), ("metric", "STRING"), ("value", "DOUBLE"), ("scope", "STRING"),
        ("method", "STRING"),
    ),
    StoreTable.MEMORY: (
        ("pid", "BIGINT"), ("tid", "BIGINT"), ("device", "STRING"), ("ts_ns", "BIGINT"),
        ("bytes", "BIGINT"), ("total_allocated", "BIGINT"), ("total_reserved", "BIGINT"),
        ("addr", "BIGINT"), ("slice_id", "BIGINT"), ("category", "STRING"),
    ),
    StoreTable.SERIES: (
        ("pid", "BIGINT"), ("ts_ns", "BIGINT"), ("step", "BIGINT"), ("epoch", "DOUBLE"),
        ("samples", "BIGINT"), ("split", "STRING"), ("metric", "STRING"), ("value", "DOUBLE"),
        ("source", "STRING"),
    ),
}

# Columns holding epoch times, shifted by a rank's clock offset.
TIME_COLUMNS = ("start_ns", "ts_ns")


@dataclass(frozen=True)
class TableSource:
    """One table of one run, as files and in-memory pieces."""

    table: StoreTable
    directory: Path  # RUN/slices: the hive-partitioned dataset's root
    files: tuple[Path, ...]  # the ranks' part files
    loose: tuple[tuple[int, pa.Table], ...]  # (rank, rows) of chunks no part holds
    columns: tuple[tuple[str, str], ...]  # (name, SQL type) of the current schema, in order
    clock_offsets: dict[int, int] = field(default_factory=dict)  # rank -> ns to subtract

    def rank_shift(self, rank_column: str = "rank") -> str:
        """SQL for the nanoseconds to subtract from a row's times (0 on rank 0's clock)."""
        offsets = {r: o for r, o in sorted(self.clock_offsets.items()) if o}
        if not offsets:
            return "0"
        cases = " ".join(f"WHEN {rank} THEN {offset}" for rank, offset in offsets.items())
        return f"(CASE {rank_column} {cases} ELSE 0 END)"

    def select_list(self, present: set[str]) -> str:
        """The view's columns over a scan holding the ``present`` ones and ``rank``."""
        shift = self.rank_shift()
        parts = []
        for name, sql_type in self.columns:
            if name not in present:
                parts.append(f"CAST(NULL AS {sql_type}) AS {name}")
            elif name in TIME_COLUMNS and shift != "0":
                parts.append(f"{name} - {shift} AS {name}")
            else:
                parts.append(name)
        parts.append("CAST(rank AS INT) AS rank")
        return ", ".join(parts)

    def empty_view(self) -> str:
        """A query of no rows with the view's columns, for a table no rank wrote."""
        columns = [f"CAST(NULL AS {t}) AS {n}" for n, t in self.columns]
        return f"SELECT {', '.join(columns)}, CAST(NULL AS INT) AS rank WHERE 1 = 0"


def sql_type(arrow_type: pa.DataType) -> str:
    """The SQL type both engines name an Arrow type of the store by."""
    import pyarrow as pa

    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    for test, name in ((pa.types.is_int64, "BIGINT"), (pa.types.is_int32, "INT"),
                       (pa.types.is_int16, "SMALLINT"), (pa.types.is_float32, "FLOAT"),
                       (pa.types.is_float64, "DOUBLE"), (pa.types.is_string, "STRING")):
        if test(arrow_type):
            return name
    raise ValueError(f"no SQL type for the store's {arrow_type}")


def rank_dirs(run_dir: Path, table: StoreTable) -> Iterator[tuple[int, Path]]:
    """A table's partition directories (``rank=N``), by rank."""
    table_dir = run_dir / str(table)
    if not table_dir.is_dir():
        return
    found = []
    for directory in table_dir.iterdir():
        key, _, value = directory.name.partition("=")
        if directory.is_dir() and key == "rank" and value.isdigit():
            found.append((int(value), directory))
    yield from sorted(found)


def table_source(run_dir: Path, table: StoreTable, clock_offsets: dict[int, int]) -> TableSource:
    """Find a table's files, reading (and nesting) the chunks no part holds.

    Raises:
        pyarrow.ArrowInvalid, OSError: a chunk cannot be read (the reader words it for a person).
    """
    files: list[Path] = []
    loose: list[tuple[int, pa.Table]] = []
    for rank, directory in rank_dirs(run_dir, table):
        found = rank_files(directory)
        files.extend(found.parts)
        if found.loose_chunks:
            loose.append((rank, _read_loose(found.loose_chunks, table)))
    return TableSource(table, run_dir / str(table), tuple(files), tuple(loose), STORE_COLUMNS[table],
                       clock_offsets)


def _read_loose(chunks: list[Path], table: StoreTable) -> pa.Table:
    """Chunks no part holds, read and (slices) nested."""
    from dlprof.store.nesting import nest_slices
    from dlprof.store.schema import SCHEMAS
    from dlprof.store.writer import read_chunks

    data = read_chunks(chunks, SCHEMAS[table])
    if table is StoreTable.SLICES:
        data, _ = nest_slices(data)
    return data
