"""The sink: the only way events enter the store.

Collectors buffer in their own fixed-shape arrays on the hot path and hand the sink whole
batches; the sink writes each batch as a chunk of the right table.
"""

from __future__ import annotations

import pyarrow as pa

from dlprof.keys import StoreTable
from dlprof.store.writer import RankWriter


class Sink:
    """Typed entry points for each table of one rank."""

    def __init__(self, writer: RankWriter) -> None:
        self._writer = writer

    @property
    def rank(self) -> int:
        return self._writer.rank

    def append_slices(self, batch: pa.Table, source: str) -> None:
        """Timed intervals; ``id``, ``pid``, ``tid``, ``kind``, ``name``, start and duration set."""
        self._writer.write_chunk(StoreTable.SLICES, batch, source)

    def append_counters(self, batch: pa.Table, source: str) -> None:
        """Samples of gauges over time: ``track``, ``ts_ns``, ``value``, ``unit``."""
        self._writer.write_chunk(StoreTable.COUNTERS, batch, source)

    def append_metrics(self, batch: pa.Table, source: str) -> None:
        """Counter values measured over one slice each: ``slice_id``, ``metric``, ``value``."""
        self._writer.write_chunk(StoreTable.METRICS, batch, source)

    def append_memory(self, batch: pa.Table, source: str) -> None:
        """Allocations (positive bytes) and frees (negative bytes)."""
        self._writer.write_chunk(StoreTable.MEMORY, batch, source)

    def append_series(self, batch: pa.Table, source: str) -> None:
        """Metric values over training: ``ts_ns``, ``step``, ``split``, ``metric``, ``value``."""
        self._writer.write_chunk(StoreTable.SERIES, batch, source)
