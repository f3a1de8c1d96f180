"""The face every query engine shows the analyses: SQL in, a small result out.

    engine = run.engine                       # DuckDB unless --engine spark or DLPROF_ENGINE=spark
    engine.rows("SELECT kind, count(*) AS n FROM slices GROUP BY kind")   # plain Python values
    engine.frame("SELECT ...")                # a pandas DataFrame
    for batch in engine.batches("SELECT * FROM slices", 65_536): ...      # Arrow, bounded memory

The run's tables are views named ``slices``, ``counters``, ``metrics`` and ``memory``, each with
a ``rank`` column (see :mod:`dlprof.engine.sources`). Queries are written in the SQL both engines
parse, asking :attr:`Engine.dialect` where they differ.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from dlprof.engine.dialect import Dialect
from dlprof.engine.rows import Rows
from dlprof.keys import EngineKind, StoreTable

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

    from dlprof.engine.sources import TableSource


class EngineError(Exception):
    """A query failed on the engine; the message is one line a person can act on."""


def out_of_range(detail: str) -> EngineError:
    """The one line every engine gives for a value past its column's range: values each within
    range that add up past int64 (durations of centuries, edited in), a huge integer.

    Args:
        detail: the engine's own words for it, one line.
    """
    return EngineError(f"a value past the range of its column ({detail}): the run's times or counts are damaged")


class Engine(ABC):
    """A run's tables as views of one engine session."""

    kind: ClassVar[EngineKind]
    dialect: ClassVar[Dialect]

    def __init__(self, sources: Mapping[StoreTable, TableSource]) -> None:
        self.sources = dict(sources)

    @abstractmethod
    def rows(self, sql: str) -> Rows:
        """Run a query whose result is small; its rows as Python values."""

    @abstractmethod
    def arrow(self, sql: str) -> pa.Table:
        """Run a query; its result as one Arrow table."""

    @abstractmethod
    def batches(self, sql: str, rows_per_batch: int = 65_536) -> Iterator[pa.RecordBatch]:
        """Run a query; its result as Arrow record batches, a bounded number held at a time."""

    @abstractmethod
    def keep(self, name: str, sql: str) -> None:
        """Compute a query once and keep its result as a table named ``name`` (until
        :meth:`forget`), for an analysis that reads an intermediate result several times."""

    @abstractmethod
    def forget(self, name: str) -> None:
        """Drop a table :meth:`keep` made."""

    @abstractmethod
    def relation(self, sql: str) -> Any:
        """A query as the engine's own lazy object (a DuckDB relation, a Spark DataFrame)."""

    def close(self) -> None:
        """Release the engine's session (a no-op where there is nothing to release)."""

    def frame(self, sql: str) -> pd.DataFrame:
        """Run a query; its result as a pandas DataFrame (nullable integers, plain strings)."""
        return arrow_to_pandas(self.arrow(sql))

    def scalar(self, sql: str) -> Any:
        """The one value of a one-row, one-column query (None for no row)."""
        result = self.rows(sql)
        return result.rows[0][0] if result.rows else None


_INTEGER_TYPES = ("int64", "int32", "int16", "int8")


def arrow_to_pandas(table: pa.Table) -> pd.DataFrame:
    """Arrow to pandas with nullable integers (ids exceed a float's precision) and plain strings."""
    import pandas as pd
    import pyarrow as pa

    columns = []
    for column in table.itercolumns():
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        if pa.types.is_large_string(column.type) or pa.types.is_string_view(column.type):
            column = column.cast(pa.string())
        if pa.types.is_decimal(column.type):
            column = column.cast(pa.float64())
        columns.append(column)
    plain = pa.Table.from_arrays(columns, names=table.column_names)
    mapping = {getattr(pa, name)(): pd.api.types.pandas_dtype(name.capitalize()) for name in _INTEGER_TYPES}
    return plain.to_pandas(types_mapper=mapping.get)
