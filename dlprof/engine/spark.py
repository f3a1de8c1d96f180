"""Apache Spark: the same analyses for runs too large for one machine (thousands of ranks on a
shared filesystem or an object store), from the ``spark`` extra (PySpark; Java 17).

Spark's master comes from its usual configuration, never from dlprof: ``spark-defaults.conf`` in
``$SPARK_CONF_DIR``, ``PYSPARK_SUBMIT_ARGS="--master spark://host:7077 pyspark-shell"``, or local
mode on this machine when nothing says otherwise::

    DLPROF_ENGINE=spark dlprof top RUN
    PYSPARK_SUBMIT_ARGS="--master local[4] pyspark-shell" dlprof gpu RUN --engine spark

One Spark application per process; each loaded run gets a session of its own in it, so its views
(``slices``, ``counters``, ``metrics``, ``memory``) never meet another run's.

A query that fails is one line, as on DuckDB: a value past its column's range (Spark's data
exceptions, SQLSTATE class 22: a sum past int64, a cast that overflows) in DuckDB's words, any
other failure as Spark's first line. Spark's own logging of a failed task (its log4j ERROR lines
and PySpark's query-context logger, each with the Java stack trace) is silenced: the exception
says it once.
"""

from __future__ import annotations

import logging
import re
import threading
import warnings
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from dlprof.engine.base import Engine, EngineError, out_of_range
from dlprof.engine.dialect import SparkDialect
from dlprof.engine.rows import Rows
from dlprof.keys import EngineKind, StoreTable

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from dlprof.engine.sources import TableSource

_APPLICATION_LOCK = threading.Lock()
_application: SparkSession | None = None

# Settings dlprof needs whatever the cluster: UTC (times are epoch nanoseconds, never zoned), Arrow
# for results, and no web UI listening on every interface of the machine.
_SETTINGS = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
}
# PySpark's loggers that print a failed query's Java stack trace on stderr (PySpark 4).
_QUERY_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")
# SQLSTATE class 22, "data exception": numeric value out of range (22003), a cast's invalid input
# (22018), a datetime overflow (22008)...
_DATA_EXCEPTION = "22"


def application() -> SparkSession:
    """The process's Spark application, started on first use."""
    global _application
    with _APPLICATION_LOCK:
        if _application is None:
            try:
                from pyspark.sql import SparkSession
            except ImportError:
                raise EngineError("--engine spark needs PySpark: pip install 'dlprof[spark]' "
                                  "(and Java 17 or later)") from None
            # dlprof hands Spark Arrow, never pandas; PySpark's warning about pandas' version is noise.
            warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas",
                                    category=FutureWarning)
            builder = SparkSession.builder.appName("dlprof")
            for key, value in _SETTINGS.items():
                builder = builder.config(key, value)
            try:
                _application = builder.getOrCreate()
            except Exception as error:  # noqa: BLE001 - a JVM that cannot start raises many kinds
                raise EngineError(f"Spark did not start: {_first_line(error)}") from None
            # A failed task's ERROR lines carry the Java stack trace; the exception says it in one line.
            _application.sparkContext.setLogLevel("OFF")
            _silence_query_loggers()
        return _application


def _silence_query_loggers() -> None:
    try:
        from pyspark.logger import PySparkLogger
    except ImportError:  # PySpark before 4 logs no query context
        return
    for name in _QUERY_LOGGERS:
        PySparkLogger.getLogger(name).setLevel(logging.CRITICAL + 1)


class SparkEngine(Engine):
    """A run's tables as temporary views of a Spark session."""

    kind = EngineKind.SPARK
    dialect = SparkDialect()

    def __init__(self, sources: Mapping[StoreTable, TableSource]) -> None:
        super().__init__(sources)
        self.session = application().newSession()
        for source in self.sources.values():
            self._register(source)

    def _register(self, source: TableSource) -> None:
        name = str(source.table)
        pieces = []
        if source.files:
            files = [str(f) for f in source.files]
            try:
                frame = (self.session.read.option("mergeSchema", "true")
                         .option("basePath", str(source.directory)).parquet(*files))
            except Exception as error:  # noqa: BLE001 - Spark wraps every JVM error alike
                raise EngineError(f"{source.directory}: damaged Parquet file ({_first_line(error)})") from None
            scan = f"_{name}_files"
            frame.createOrReplaceTempView(scan)
            pieces.append(f"SELECT {source.select_list(set(frame.columns))} FROM {scan}")
        for rank, rows in source.loose:
            loose = f"_{name}_rank_{rank}"
            self.session.createDataFrame(_plain(rows)).createOrReplaceTempView(loose)
            present = set(rows.column_names)
            pieces.append(f"SELECT {source.select_list(present)} FROM (SELECT *, {rank} AS rank FROM {loose})")
        body = " UNION ALL ".join(pieces) if pieces else source.empty_view()
        self.session.sql(f"CREATE OR REPLACE TEMP VIEW {name} AS {body}")

    def _frame(self, sql: str) -> DataFrame:
        try:
            return self.session.sql(sql)
        except Exception as error:  # noqa: BLE001 - analysis errors come as several JVM types
            raise query_error(error) from None

    def rows(self, sql: str) -> Rows:
        frame = self._frame(sql)
        try:
            collected = frame.collect()
        except Exception as error:  # noqa: BLE001
            raise query_error(error) from None
        return Rows(tuple(frame.columns), [tuple(row) for row in collected])

    def arrow(self, sql: str) -> pa.Table:
        frame = self._frame(sql)
        try:
            return frame.toArrow()
        except Exception as error:  # noqa: BLE001
            raise query_error(error) from None

    def batches(self, sql: str, rows_per_batch: int = 65_536) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        frame = self._frame(sql)
        schema = self.arrow(f"SELECT * FROM ({sql}) LIMIT 0").schema
        pending: list[tuple[Any, ...]] = []
        # Partition by partition, so the driver holds one partition and one batch at a time.
        rows = iter(frame.toLocalIterator(prefetchPartitions=False))
        while True:
            try:
                row = next(rows)
            except StopIteration:
                break
            except Exception as error:  # noqa: BLE001 - a partition's task failed
                raise query_error(error) from None
            pending.append(tuple(row))
            if len(pending) == rows_per_batch:
                yield pa.RecordBatch.from_arrays(_columns(pending, schema), schema=schema)
                pending = []
        if pending:
            yield pa.RecordBatch.from_arrays(_columns(pending, schema), schema=schema)

    def keep(self, name: str, sql: str) -> None:
        self._frame(sql).cache().createOrReplaceTempView(name)

    def forget(self, name: str) -> None:
        self.session.catalog.dropTempView(name)

    def relation(self, sql: str) -> Any:
        return self._frame(sql)


def _columns(rows: list[tuple[Any, ...]], schema: pa.Schema) -> list[pa.Array]:
    import pyarrow as pa

    return [pa.array([row[i] for row in rows], type=field.type) for i, field in enumerate(schema)]


def _plain(table: pa.Table) -> pa.Table:
    """Dictionary columns decoded: Spark takes plain strings."""
    import pyarrow as pa

    columns = [c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c for c in table.itercolumns()]
    return pa.Table.from_arrays(columns, names=table.column_names)


def query_error(error: BaseException) -> EngineError:
    """A failed query in one line: a value past its column's range in the words DuckDB's gets
    (:func:`dlprof.engine.base.out_of_range`), anything else as Spark's first line."""
    state = getattr(error, "getSqlState", None)
    try:
        sql_state = str(state() or "") if callable(state) else ""
    except Exception:  # noqa: BLE001 - an error from the JVM's side that has no state to give
        sql_state = ""
    if sql_state.startswith(_DATA_EXCEPTION):
        return out_of_range(_condition(error))
    return EngineError(f"Spark: {_first_line(error)}")


def _condition(error: BaseException) -> str:
    """Spark's error class and its first sentence (``[ARITHMETIC_OVERFLOW] overflow``), without the
    advice on Spark's settings that follows."""
    line = _first_line(error)
    found = re.match(r"\[[A-Z0-9_.]+\][^.]*", line)
    return found.group(0).strip() if found else line


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
