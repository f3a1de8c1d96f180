"""Reading a run directory: its manifest at once, its tables through a query engine when asked.

    run = dlprof.load("dlprof-runs/20261122-101500-train")
    run.sql("SELECT name, sum(dur_ns) AS ns FROM slices GROUP BY name ORDER BY ns DESC LIMIT 5")
    run.slices.groupby("name").dur_ns.sum()          # the whole table as pandas, on first use

Loading reads only the manifests, so it imports neither Arrow, pandas nor an engine. Queries run
on the run's engine (DuckDB by default, Spark when asked: :mod:`dlprof.engine`), which reads only
what each query needs. Rows saved but never made final (a run killed, a worker that saved late)
are read from their chunks and nested on the way in.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlprof.keys import EngineKind, RunStatus, StoreTable
from dlprof.store.job import combine, rank_status
from dlprof.store.layout import rank_files
from dlprof.store.manifest import MANIFEST_NAME, RANK0_CLOCK, Manifest, read_rank_manifests
from dlprof.store.processes import alive
from dlprof.store.safe_files import not_a_file
from dlprof.store.version import SCHEMA_VERSION

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

    from dlprof.engine.base import Engine


# How often a table's files are listed again when one listed is gone before it is read (a run
# being written makes its chunks final meanwhile).
_RELISTS = 3


class RunError(Exception):
    """A run cannot be read; the message is one line a person can act on."""


@dataclass
class Run:
    """A loaded run: its manifest, and its tables through a query engine."""

    path: Path
    # The run's manifest; for several ranks, combined from theirs (see dlprof.store.job).
    manifest: Manifest
    # Each rank's own manifest, in a run of several ranks (empty otherwise).
    rank_manifests: dict[int, Manifest] = field(default_factory=dict)
    # The engine that runs this run's queries; None: the process's default (dlprof.engine).
    engine_kind: EngineKind | None = None
    _arrow: dict[StoreTable, pa.Table] = field(default_factory=dict, repr=False)
    _checked: bool = field(default=False, repr=False)

    @property
    def status(self) -> RunStatus:
        """The manifest's status, or ``killed`` if it says running and its writer is gone."""
        return rank_status(self.manifest, _writer_alive)

    @cached_property
    def engine(self) -> Engine:
        """The query engine over this run's tables (views ``slices``, ``counters``, ``metrics``,
        ``memory``, each with a ``rank`` column), opened on first use.

        Raises:
            RunError: a table's files cannot be read, or the engine cannot start.
        """
        from dlprof.engine import default_engine, open_engine
        from dlprof.engine.base import EngineError

        try:
            kind = self.engine_kind or default_engine()
        except ValueError as error:
            raise RunError(str(error)) from None
        self.check_tables()
        offsets = self.clock_offsets()
        try:
            sources = {table: self._source(table, offsets) for table in StoreTable}
            return open_engine(kind, sources)
        except EngineError as error:
            raise RunError(f"{self.path}: {error}") from None

    def check_tables(self) -> None:
        """Check partition names and Parquet footers of every table, once (no row is read).

        Raises:
            RunError: one line naming the first damaged file or partition.
        """
        if self._checked:
            return
        from dlprof.store.integrity import run_problem

        problem = run_problem(self.path)
        if problem is not None:
            raise RunError(f"{self.path}: {problem}")
        self._checked = True

    def _source(self, table: StoreTable, offsets: dict[int, int]) -> Any:
        from dlprof.engine.sources import table_source

        for _ in range(_RELISTS):
            try:
                return table_source(self.path, table, offsets)
            except FileNotFoundError:
                continue  # a chunk made final and removed since it was listed: list again
            except (ValueError, OSError) as error:  # Arrow's ArrowInvalid is a ValueError
                detail = str(error).splitlines()[0] if str(error) else type(error).__name__
                raise RunError(f"{self.path / str(table)}: damaged Parquet file ({detail})") from None
        raise RunError(f"{self.path / str(table)}: its files kept changing while being read; try again")

    def query(self, sql: str) -> Any:
        """Run SQL on the engine; its result as :class:`dlprof.engine.rows.Rows` (plain values).

        Raises:
            RunError: the engine failed reading the run (a damaged file).
        """
        return self._guarded(lambda: self.engine.rows(sql))

    def sql(self, sql: str) -> pd.DataFrame:
        """Run SQL on the engine over this run's tables; the result as a pandas DataFrame.

        Args:
            sql: a query over ``slices``, ``counters``, ``metrics`` and ``memory`` (each with a
                ``rank`` column), in the SQL the run's engine speaks.
        """
        return self._guarded(lambda: self.engine.frame(sql))

    @contextmanager
    def kept(self, name: str, sql: str) -> Iterator[str]:
        """Within the block, the result of ``sql`` is a table named ``name`` on the engine,
        computed once however often the block's queries read it."""
        self._guarded(lambda: self.engine.keep(name, sql))
        try:
            yield name
        finally:
            self.engine.forget(name)

    def relation(self, table: StoreTable | str) -> Any:
        """One table as the engine's own lazy object, for queries of your own: a DuckDB relation,
        or a Spark DataFrame."""
        return self.engine.relation(f"SELECT * FROM {StoreTable(table)}")

    def batches(self, table: StoreTable, columns: Sequence[str] | None = None, where: str = "",
                order_by: str = "", rows_per_batch: int = 65_536) -> Iterator[pa.RecordBatch]:
        """Stream a table as Arrow record batches, holding a bounded number at a time.

        Args:
            table: which table.
            columns: the columns wanted (None: all, with ``rank``).
            where: a SQL condition on the rows (none: every row).
            order_by: a SQL ordering (none: the files' order, by rank).
            rows_per_batch: rows per batch.
        """
        selected = ", ".join(columns) if columns else "*"
        sql = f"SELECT {selected} FROM {StoreTable(table)}"
        sql += f" WHERE {where}" if where else ""
        sql += f" ORDER BY {order_by}" if order_by else ""
        yield from self._guarded(lambda: self.engine.batches(sql, rows_per_batch))

    def _guarded(self, call: Any) -> Any:
        from dlprof.engine.base import EngineError

        try:
            return call()
        except EngineError as error:
            raise RunError(f"{self.path}: {error}") from None

    def arrow(self, table: StoreTable) -> pa.Table:
        """One whole table as Arrow, with a ``rank`` column taken from the partition directories."""
        if table not in self._arrow:
            self.check_tables()
            self._arrow[table] = _read_table(self.path, table, self.clock_offsets())
        return self._arrow[table]

    def clock_offsets(self) -> dict[int, int]:
        """Nanoseconds to subtract from each rank's times to put them on rank 0's clock."""
        offsets = {}
        for rank, manifest in self.rank_manifests.items():
            for clock in manifest.clocks:
                if clock.name == RANK0_CLOCK and clock.offset_ns:
                    offsets[rank] = clock.offset_ns
        return offsets

    def ranks(self) -> list[int]:
        """The ranks that hold slices, ascending."""
        return sorted(int(row[0]) for row in self.query("SELECT DISTINCT rank FROM slices"))

    def _frame(self, table: StoreTable) -> pd.DataFrame:
        from dlprof.engine.base import arrow_to_pandas

        return arrow_to_pandas(self.arrow(table))

    @cached_property
    def slices(self) -> pd.DataFrame:
        """The whole slices table as pandas (read on first use; prefer :meth:`sql` on large runs)."""
        return self._frame(StoreTable.SLICES)

    @cached_property
    def counters(self) -> pd.DataFrame:
        return self._frame(StoreTable.COUNTERS)

    @cached_property
    def metrics(self) -> pd.DataFrame:
        return self._frame(StoreTable.METRICS)

    @cached_property
    def memory(self) -> pd.DataFrame:
        return self._frame(StoreTable.MEMORY)


def load(path: str | os.PathLike[str], engine: EngineKind | str | None = None) -> Run:
    """Open a run directory.

    Args:
        path: the run directory (the one holding ``run.json``).
        engine: the query engine for its analyses (``duckdb``, ``spark``); None: ``--engine``,
            else ``DLPROF_ENGINE``, else DuckDB.

    Returns:
        The run; its tables are read when first queried.

    Raises:
        RunError: the directory is not a run, or its manifest cannot be read.
    """
    run_dir = Path(path)
    if not run_dir.is_dir():
        what = not_a_file(run_dir)
        raise RunError(f"{run_dir}: {'a file' if what is None else what}, not a run directory"
                       if run_dir.exists() else f"{run_dir}: no such run directory")
    try:
        ranks = read_rank_manifests(run_dir)
    except (OSError, ValueError, TypeError, KeyError) as error:
        raise RunError(f"{run_dir}: unreadable rank manifest ({error})") from None
    has_manifest = (run_dir / MANIFEST_NAME).is_file()
    if not has_manifest and not ranks:
        raise RunError(f"{run_dir}: not a dlprof run (no {MANIFEST_NAME})")
    try:
        # Rank 0 writes run.json; without it (rank 0 never started) the ranks' own suffice.
        manifest = Manifest.read(run_dir) if has_manifest else None
    except (OSError, ValueError, TypeError, KeyError) as error:
        raise RunError(f"{run_dir / MANIFEST_NAME}: unreadable manifest ({error})") from None
    if ranks:
        manifest = combine(ranks, manifest, _writer_alive)
    assert manifest is not None
    newest = max([manifest.schema_version, *(m.schema_version for m in ranks.values())])
    if newest > SCHEMA_VERSION:
        raise RunError(
            f"{run_dir}: written by a newer dlprof (schema {newest}, "
            f"this one reads up to {SCHEMA_VERSION})"
        )
    try:
        kind = None if engine is None else EngineKind(engine)
    except ValueError:
        raise RunError(f"engine {engine!r}: choose {', '.join(str(k) for k in EngineKind)}") from None
    return Run(path=run_dir, manifest=manifest, rank_manifests=ranks, engine_kind=kind)


def _writer_alive(manifest: Manifest) -> bool:
    if manifest.host.hostname and manifest.host.hostname != socket.gethostname():
        return True  # cannot tell from here; trust the manifest
    return manifest.writer_pid > 0 and alive(manifest.writer_pid)


def _read_table(run_dir: Path, table: StoreTable, clock_offsets: dict[int, int]) -> pa.Table:
    """A whole table in memory, every rank (what :meth:`Run.arrow` returns)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from dlprof.engine.sources import rank_dirs
    from dlprof.store.nesting import nest_slices
    from dlprof.store.schema import SCHEMAS, conform
    from dlprof.store.writer import read_chunks

    schema = SCHEMAS[table]
    parts = []
    for rank, directory in rank_dirs(run_dir, table):
        files = rank_files(directory)
        try:
            # conform: a run written before a column existed reads with it null.
            pieces = [conform(pq.read_table(part), schema) for part in files.parts]
            if files.loose_chunks:  # saved but not made final: a run killed, a worker late
                loose = read_chunks(files.loose_chunks, schema)
                if table is StoreTable.SLICES:
                    loose, _ = nest_slices(loose)
                pieces.append(loose)
            data = (pa.concat_tables(pieces, promote_options="permissive").unify_dictionaries()
                    if pieces else schema.empty_table())
        except (pa.ArrowInvalid, OSError) as error:
            detail = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise RunError(f"{directory}: damaged Parquet file ({detail})") from None
        offset = clock_offsets.get(rank)
        if offset:
            for column in ("start_ns", "ts_ns"):
                if column in data.column_names:
                    index = data.column_names.index(column)
                    shifted = pc.subtract(data.column(column), pa.scalar(offset, pa.int64()))
                    data = data.set_column(index, column, shifted)
        parts.append(data.append_column("rank", pa.array([rank] * data.num_rows, pa.int32())))
    if not parts:
        return schema.empty_table().append_column("rank", pa.array([], pa.int32()))
    return pa.concat_tables(parts, promote_options="permissive")
