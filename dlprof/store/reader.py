"""Reading a run directory into pandas DataFrames, without the collectors that wrote it.

    run = dlprof.load("dlprof-runs/20261122-101500-train")
    run.slices.groupby("name").dur_ns.sum()

Rows saved but never made final (a run killed, a worker that saved late) are read from their chunks
and nested on the way in.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dlprof.keys import RunStatus, StoreTable
from dlprof.store.job import combine, rank_status
from dlprof.store.layout import rank_files
from dlprof.store.manifest import MANIFEST_NAME, RANK0_CLOCK, Manifest, read_rank_manifests
from dlprof.store.nesting import nest_slices
from dlprof.store.schema import SCHEMA_VERSION, SCHEMAS, conform
from dlprof.store.writer import read_chunks


class RunError(Exception):
    """A run cannot be read; the message is one line a person can act on."""


@dataclass
class Run:
    """A loaded run: its manifest and its tables, each read on first use."""

    path: Path
    # The run's manifest; for several ranks, combined from theirs (see dlprof.store.job).
    manifest: Manifest
    # Each rank's own manifest, in a run of several ranks (empty otherwise).
    rank_manifests: dict[int, Manifest] = field(default_factory=dict)
    _arrow: dict[StoreTable, pa.Table] = field(default_factory=dict, repr=False)

    @property
    def status(self) -> RunStatus:
        """The manifest's status, or ``killed`` if it says running and its writer is gone."""
        return rank_status(self.manifest, _writer_alive)

    def arrow(self, table: StoreTable) -> pa.Table:
        """One table as Arrow, with a ``rank`` column taken from the partition directories."""
        if table not in self._arrow:
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

    def _frame(self, table: StoreTable) -> pd.DataFrame:
        return _to_pandas(self.arrow(table))

    @cached_property
    def slices(self) -> pd.DataFrame:
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


def load(path: str | os.PathLike[str]) -> Run:
    """Open a run directory.

    Args:
        path: the run directory (the one holding ``run.json``).

    Returns:
        The run; its tables are read when first used.

    Raises:
        RunError: the directory is not a run, or its manifest cannot be read.
    """
    run_dir = Path(path)
    if not run_dir.is_dir():
        raise RunError(f"{run_dir}: no such run directory")
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
    return Run(path=run_dir, manifest=manifest, rank_manifests=ranks)


def _writer_alive(manifest: Manifest) -> bool:
    if manifest.host.hostname and manifest.host.hostname != socket.gethostname():
        return True  # cannot tell from here; trust the manifest
    if manifest.writer_pid <= 0:
        return False
    try:
        os.kill(manifest.writer_pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _rank_dirs(run_dir: Path, table: StoreTable) -> list[tuple[int, Path]]:
    table_dir = run_dir / str(table)
    if not table_dir.is_dir():
        return []
    found = []
    for directory in table_dir.iterdir():
        key, _, value = directory.name.partition("=")
        if directory.is_dir() and key == "rank" and value.isdigit():
            found.append((int(value), directory))
    return sorted(found)


def _read_table(run_dir: Path, table: StoreTable, clock_offsets: dict[int, int]) -> pa.Table:
    schema = SCHEMAS[table]
    parts = []
    for rank, directory in _rank_dirs(run_dir, table):
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
        if clock_offsets.get(rank):
            data = _shift_times(data, clock_offsets[rank])
        rank_column = pa.array([rank] * data.num_rows, pa.int32())
        parts.append(data.append_column("rank", rank_column))
    if not parts:
        return schema.empty_table().append_column("rank", pa.array([], pa.int32()))
    return pa.concat_tables(parts, promote_options="permissive")


def _shift_times(data: pa.Table, offset_ns: int) -> pa.Table:
    """Move a rank's timestamps onto rank 0's clock."""
    for column in ("start_ns", "ts_ns"):
        if column in data.column_names:
            index = data.column_names.index(column)
            shifted = pc.subtract(data.column(column), pa.scalar(offset_ns, pa.int64()))
            data = data.set_column(index, column, shifted)
    return data


_PANDAS_TYPES = {
    pa.int64(): pd.Int64Dtype(),
    pa.int32(): pd.Int32Dtype(),
    pa.int16(): pd.Int16Dtype(),
}


def _to_pandas(table: pa.Table) -> pd.DataFrame:
    """Arrow to pandas with nullable integers (ids exceed float precision) and plain strings."""
    columns = []
    for column in table.itercolumns():
        if pa.types.is_dictionary(column.type):
            column = column.cast(pa.string())
        columns.append(column)
    plain = pa.Table.from_arrays(columns, names=table.column_names)
    return plain.to_pandas(types_mapper=_PANDAS_TYPES.get)

