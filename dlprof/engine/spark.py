"""Apache Spark: the same analyses for runs too large for one machine (thousands of ranks on a
shared filesystem or an object store), from the ``spark`` extra (PySpark; Java 17).

Spark's master comes from its usual configuration, never from dlprof: ``spark-defaults.conf`` in
``$SPARK_CONF_DIR``, ``PYSPARK_SUBMIT_ARGS="--master spark://host:7077 pyspark-shell"``, or local
mode on this machine when nothing says otherwise::

    DLPROF_ENGINE=spark dlprof top RUN
    PYSPARK_SUBMIT_ARGS="--master local[4] pyspark-shell" dlprof gpu RUN --engine spark

One Spark application per process; each loaded run gets a session of its own in it, so its views
(``slices``, ``counters``, ``metrics``, ``memory``) never meet another run's.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from dlprof.engine.base import Engine, EngineError
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
            _application.sparkContext.setLogLevel("ERROR")
        return _application


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
            raise EngineError(f"Spark: {_first_line(error)}") from None

    def rows(self, sql: str) -> Rows:
        frame = self._frame(sql)
        try:
            collected = frame.collect()
        except Exception as error:  # noqa: BLE001
            raise EngineError(f"Spark: {_first_line(error)}") from None
        return Rows(tuple(frame.columns), [tuple(row) for row in collected])

    def arrow(self, sql: str) -> pa.Table:
        frame = self._frame(sql)
        try:
            return frame.toArrow()
        except Exception as error:  # noqa: BLE001
            raise EngineError(f"Spark: {_first_line(error)}") from None

    def batches(self, sql: str, rows_per_batch: int = 65_536) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        frame = self._frame(sql)
        schema = self.arrow(f"SELECT * FROM ({sql}) LIMIT 0").schema
        pending: list[tuple[Any, ...]] = []
        # Partition by partition, so the driver holds one partition and one batch at a time.
        for row in frame.toLocalIterator(prefetchPartitions=False):
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


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
