"""DuckDB, embedded: the default engine. Out of core, it reads only the columns and row groups a
query needs from the run's Parquet files and materialises only the result.

One in-memory database per loaded run, its tables registered as views over ``read_parquet``
(hive partitioning gives ``rank``); ranks read in memory (never compacted) are registered Arrow
tables beside them.

DuckDB's memory is capped (``DLPROF_DUCKDB_MEMORY``, default 256MB, in DuckDB's units): a sort, a
join or a window larger than that spills to a temporary directory that DuckDB removes when the
database closes, so an analysis's memory stays bounded however large the run. A larger cap makes
the largest analyses faster (about twice, on 10 million events) at the cost of memory.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import tempfile
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import duckdb

from dlprof.engine.base import Engine, EngineError, out_of_range
from dlprof.engine.dialect import Dialect
from dlprof.engine.rows import Rows
from dlprof.keys import EngineKind, StoreTable

if TYPE_CHECKING:
    import pyarrow as pa

    from dlprof.engine.sources import TableSource

_ENGINES = itertools.count()
MEMORY_VARIABLE = "DLPROF_DUCKDB_MEMORY"
DEFAULT_MEMORY = "256MB"


class DuckDBEngine(Engine):
    """A run's tables in an in-memory DuckDB database."""

    kind = EngineKind.DUCKDB
    dialect = Dialect()

    def __init__(self, sources: Mapping[StoreTable, TableSource]) -> None:
        super().__init__(sources)
        self.connection = duckdb.connect(":memory:")
        self.connection.execute("SET enable_progress_bar = false")
        memory = os.environ.get(MEMORY_VARIABLE, "").strip() or DEFAULT_MEMORY
        try:
            self.connection.execute(f"SET memory_limit = {self.dialect.literal(memory)}")
        except duckdb.Error:
            raise EngineError(f"{MEMORY_VARIABLE}={memory}: not a memory size DuckDB reads (e.g. 512MB, 4GB)") from None
        # Spilled pages go to a directory of this engine's own under the system's temporary one
        # (DuckDB makes it when it first spills and removes it on close), never into the run or
        # the working directory (DuckDB's default for an in-memory database is ./.tmp), and never
        # shared with another process's DuckDB (the ranks of a job read their run at once).
        spill = f"{tempfile.gettempdir()}/dlprof-duckdb-{os.getpid()}-{next(_ENGINES)}"
        self.connection.execute(f"SET temp_directory = {self.dialect.literal(spill)}")
        # Results are small and ordered by their queries; insertion order costs memory on scans.
        self.connection.execute("SET preserve_insertion_order = false")
        for source in self.sources.values():
            self._register(source)

    def _register(self, source: TableSource) -> None:
        name = str(source.table)
        pieces = []
        if source.files:
            files = "[" + ", ".join(self.dialect.literal(str(f)) for f in source.files) + "]"
            scan = f"read_parquet({files}, hive_partitioning = true, union_by_name = true)"
            try:
                present = {row[0] for row in self.connection.execute(f"DESCRIBE SELECT * FROM {scan}").fetchall()}
            except duckdb.Error as error:
                raise EngineError(f"{source.directory}: damaged Parquet file ({_first_line(error)})") from None
            pieces.append(f"SELECT {source.select_list(present)} FROM {scan}")
        for rank, rows in source.loose:
            loose = f"_{name}_rank_{rank}"
            self.connection.register(loose, rows)
            present = set(rows.column_names)
            pieces.append(f"SELECT {source.select_list(present)} FROM (SELECT *, {rank} AS rank FROM {loose})")
        body = " UNION ALL ".join(pieces) if pieces else source.empty_view()
        self.connection.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS {body}")

    def _run(self, work: Callable[[], Any]) -> Any:
        """Run DuckDB work, its failures reading the run or exceeding the memory cap worded in one line."""
        try:
            return work()
        except duckdb.OutOfMemoryException:
            memory = os.environ.get(MEMORY_VARIABLE, "").strip() or DEFAULT_MEMORY
            raise EngineError(f"DuckDB needed more than its {memory} even spilling to disk; "
                              f"raise it, e.g. {MEMORY_VARIABLE}={larger_memory(memory)}") from None
        except duckdb.IOException as error:
            raise EngineError(f"damaged Parquet file ({_first_line(error)})") from None
        except duckdb.InvalidInputException as error:
            if "parquet" in str(error).lower():
                raise EngineError(f"damaged Parquet file ({_first_line(error)})") from None
            raise
        except (duckdb.ConversionException, duckdb.OutOfRangeException) as error:
            raise out_of_range(_first_line(error)) from None

    def rows(self, sql: str) -> Rows:
        def fetch() -> Rows:
            relation = self.connection.sql(sql)
            return Rows(tuple(relation.columns), relation.fetchall())

        result: Rows = self._run(fetch)
        return result

    def arrow(self, sql: str) -> pa.Table:
        return self._run(lambda: self.connection.sql(sql).to_arrow_table())

    def batches(self, sql: str, rows_per_batch: int = 65_536) -> Iterator[pa.RecordBatch]:
        reader = self._run(lambda: self.connection.sql(sql).to_arrow_reader(rows_per_batch))
        while True:
            batch = self._run(lambda: next(reader, None))
            if batch is None:
                return
            yield batch

    def keep(self, name: str, sql: str) -> None:
        self._run(lambda: self.connection.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS {sql}"))

    def forget(self, name: str) -> None:
        self.connection.execute(f"DROP TABLE IF EXISTS {name}")

    def relation(self, sql: str) -> Any:
        return self.connection.sql(sql)

    def close(self) -> None:
        self.connection.close()


# DuckDB's memory units (decimal and binary) in bytes, as ``SET memory_limit`` reads them.
_MEMORY_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
                 "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_MEMORY_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
RAISE_FACTOR = 4  # a cap that failed is raised well past it: a query that spilled needs more than a little


def larger_memory(memory: str) -> str:
    """A memory cap for DuckDB :data:`RAISE_FACTOR` times ``memory`` (``256MB`` -> ``1GB``,
    ``1GB`` -> ``4GB``), never the value that just failed; a size it cannot read (a percentage)
    gives a fixed larger one.
    """
    found = _MEMORY_SIZE.match(memory)
    unit = found.group(2).lower() if found else ""
    if found is None or (unit or "b") not in _MEMORY_UNITS:
        return "4GB"
    wanted = float(found.group(1)) * _MEMORY_UNITS[unit or "b"] * RAISE_FACTOR
    # Rounded to a size a person would type; a factor of 4 leaves any rounding above the cap.
    if wanted >= 10**9:
        return f"{max(round(wanted / 10**9), 1)}GB"
    return f"{max(math.ceil(wanted / 10**6), 1)}MB"


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
