"""Counter deltas per slice (a step, a region), in fixed-shape buffers until they are written.

The session appends one row per counter when a slice ends (``after - before`` of the readings
taken at its boundaries); :meth:`CounterDeltas.drain` turns them into metrics-table rows.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import pyarrow as pa


class CounterReading(tuple[int, ...]):
    """A reading that also says, per counter, how long it was enabled but not counting (ns).

    perf_event multiplexes hardware counters when there are more than the PMU holds; a slice
    over which a counter's unobserved time grew holds a scaled estimate, not an exact count.
    """

    unobserved_ns: tuple[int, ...]

    def __new__(cls, values: Sequence[int], unobserved_ns: Sequence[int]) -> CounterReading:
        reading = super().__new__(cls, values)
        reading.unobserved_ns = tuple(unobserved_ns)
        return reading


def unobserved_ns(reading: tuple[int, ...]) -> tuple[int, ...]:
    """Per counter, the ns it was enabled but not counting (none for a plain tuple)."""
    return getattr(reading, "unobserved_ns", None) or (0,) * len(reading)


EXACT = "exact"
SCALED = "scaled"


class CounterDeltas:
    """Metrics rows (slice id, counter, value) for a fixed list of counters."""

    def __init__(self, metrics: Sequence[str], scope: str) -> None:
        """Args:
        metrics: the counters' metric names, in the order readings list them (``perf:task-clock``).
        scope: what each reading covers, ``thread`` or ``process``.
        """
        self.metrics = list(metrics)
        self.scope = scope
        self._lock = threading.Lock()
        self._pending: list[tuple[int, tuple[int, ...], tuple[int, ...]]] = []

    def record(self, slice_id: int, before: tuple[int, ...], after: tuple[int, ...]) -> None:
        """Keep the deltas of one slice; a short or empty reading (another thread's region in
        thread scope, counters closed) records nothing. The readings are kept as they are and
        subtracted when drained: this runs at every region's end."""
        with self._lock:
            self._pending.append((slice_id, before, after))

    def drain(self) -> pa.Table:
        """Everything recorded since the last drain, as metrics-table rows."""
        with self._lock:
            pending, self._pending = self._pending, []
        width = len(self.metrics)
        kept = [(slice_id, before, after) for slice_id, before, after in pending
                if len(before) == width and len(after) == width and width]
        n = len(kept) * width
        slices = np.repeat(np.array([k[0] for k in kept], dtype=np.int64), width)
        codes = np.tile(np.arange(width, dtype=np.int32), len(kept))
        before = np.array([k[1] for k in kept], dtype=np.int64).reshape(n)
        after = np.array([k[2] for k in kept], dtype=np.int64).reshape(n)
        missed_before = np.array([unobserved_ns(k[1]) for k in kept], dtype=np.int64).reshape(n)
        missed_after = np.array([unobserved_ns(k[2]) for k in kept], dtype=np.int64).reshape(n)
        scaled = (missed_after > missed_before).astype(np.int8)
        return pa.table(
            {
                "slice_id": pa.array(slices),
                "metric": pa.DictionaryArray.from_arrays(pa.array(codes), pa.array(self.metrics, pa.string())),
                "value": pa.array((after - before).astype(np.float64)),
                "scope": pa.array([self.scope] * n, pa.string()).dictionary_encode(),
                "method": pa.DictionaryArray.from_arrays(pa.array(scaled), pa.array([EXACT, SCALED])),
            }
        )
