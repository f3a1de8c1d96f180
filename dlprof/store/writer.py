"""Writing a rank's tables: complete chunk files while the run goes on, one file per table at the end.

A chunk is a whole Parquet file written under a temporary name and renamed, so a run killed at
any moment keeps every chunk flushed before. :meth:`RankWriter.compact` merges a rank's chunks
into ``part-00000.parquet``, nesting the slices on the way, and then removes the chunks; a reader
that finds both trusts the part file.
"""

from __future__ import annotations

import itertools
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from dlprof.keys import StoreTable
from dlprof.store.attribution import attribute_memory
from dlprof.store.nesting import NestingReport, nest_slices
from dlprof.store.schema import SCHEMAS, conform, write_parquet

PART_NAME = "part-00000.parquet"
CHUNK_GLOB = "chunk-*.parquet"


def rank_dir(run_dir: Path, table: StoreTable, rank: int) -> Path:
    return run_dir / str(table) / f"rank={rank}"


class RankWriter:
    """Writes the chunks and the final part files of one rank of one run."""

    def __init__(self, run_dir: Path, rank: int, metadata: dict[str, str] | None = None) -> None:
        """Args:
        run_dir: the run directory.
        rank: the partition this writer owns.
        metadata: key-value pairs for the part files' footers (rank, world size, host), so a
            reader of the Parquet files alone knows where each partition came from.
        """
        self.run_dir = run_dir
        self.rank = rank
        self.metadata = metadata or {}
        self._sequence = itertools.count()
        self._lock = threading.Lock()

    def write_chunk(self, table: StoreTable, data: pa.Table, source: str) -> Path | None:
        """Write ``data`` as one complete chunk of ``table``; nothing for an empty table.

        Args:
            table: which table the rows belong to.
            data: rows with any subset of the table's columns.
            source: a short word naming the writer (``session``, ``kineto``), part of the name.
        """
        if data.num_rows == 0:
            return None
        with self._lock:
            number = next(self._sequence)
        path = rank_dir(self.run_dir, table, self.rank) / f"chunk-{source}-{number:06d}.parquet"
        write_parquet(conform(data, SCHEMAS[table]), path)
        return path

    def compact(self) -> tuple[dict[str, int], NestingReport]:
        """Merge every chunk of this rank into one part file per table.

        Returns:
            Rows per table, and what nesting changed in the slices.
        """
        counts: dict[str, int] = {}
        report = NestingReport()
        chunks = {table: self._chunks(table) for table in StoreTable}
        merged: dict[StoreTable, pa.Table] = {
            table: read_chunks(paths, SCHEMAS[table]) for table, paths in chunks.items() if paths
        }
        if StoreTable.SLICES in merged:
            merged[StoreTable.SLICES], report = nest_slices(merged[StoreTable.SLICES])
            if StoreTable.MEMORY in merged:
                merged[StoreTable.SLICES], merged[StoreTable.MEMORY] = attribute_memory(
                    merged[StoreTable.SLICES], merged[StoreTable.MEMORY]
                )
        for table in StoreTable:
            part = rank_dir(self.run_dir, table, self.rank) / PART_NAME
            if table not in merged:
                counts[str(table)] = pq.read_metadata(part).num_rows if part.exists() else 0
                continue
            data = merged.pop(table)
            if "ts_ns" in data.column_names:
                data = data.sort_by("ts_ns")
            write_parquet(data.replace_schema_metadata(self.metadata or None), part)
            for chunk in chunks[table]:
                chunk.unlink()
            counts[str(table)] = data.num_rows
        return counts, report

    def _chunks(self, table: StoreTable) -> list[Path]:
        directory = rank_dir(self.run_dir, table, self.rank)
        return sorted(directory.glob(CHUNK_GLOB)) if directory.is_dir() else []


def read_chunks(paths: list[Path], schema: pa.Schema) -> pa.Table:
    """Read and concatenate chunk files, unifying their dictionaries."""
    tables = [conform(pq.read_table(p), schema) for p in paths]
    if not tables:
        return schema.empty_table()
    return pa.concat_tables(tables).unify_dictionaries().combine_chunks()
