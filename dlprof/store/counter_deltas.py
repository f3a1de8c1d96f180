"""Counter deltas per slice (a step, a region), in fixed-shape buffers until they are written.

The session appends one row per counter when a slice ends (``after - before`` of the readings
taken at its boundaries); :meth:`CounterDeltas.drain` turns them into metrics-table rows.
"""

from __future__ import annotations

import threading
from array import array
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
        self._codes = array("i", range(len(self.metrics)))
        self._never_scaled = array("b", bytes(len(self.metrics)))
        self._lock = threading.Lock()
        self._new_columns()

    def _new_columns(self) -> None:
        self._slice = array("q")
        self._code = array("i")
        self._value = array("d")
        self._scaled = array("b")

    def record(self, slice_id: int, before: tuple[int, ...], after: tuple[int, ...]) -> None:
        """Keep the deltas of one slice; a short or empty reading (another thread's region in
        thread scope, counters closed) records nothing."""
        n = len(before)
        if not n or n != len(after):
            return
        deltas = [last - first for first, last in zip(before, after, strict=True)]
        missed_before = getattr(before, "unobserved_ns", None)
        missed_after = getattr(after, "unobserved_ns", None)
        if missed_before == missed_after:  # the common case: no counter was multiplexed
            scaled: Sequence[int] = self._never_scaled
        else:
            scaled = [1 if b > a else 0 for a, b in zip(missed_before or (0,) * n, missed_after or (0,) * n,
                                                         strict=True)]
        with self._lock:
            self._slice.extend((slice_id,) * n)
            self._code.extend(self._codes)
            self._value.extend(deltas)
            self._scaled.extend(scaled)

    def drain(self) -> pa.Table:
        """Everything recorded since the last drain, as metrics-table rows."""
        with self._lock:
            slices, codes, values, scaled = self._slice, self._code, self._value, self._scaled
            self._new_columns()
        n = len(slices)
        return pa.table(
            {
                "slice_id": pa.array(np.frombuffer(slices, dtype=np.int64)),
                "metric": pa.DictionaryArray.from_arrays(
                    pa.array(np.frombuffer(codes, dtype=np.int32)), pa.array(self.metrics, pa.string())
                ),
                "value": pa.array(np.frombuffer(values, dtype=np.float64)),
                "scope": pa.array([self.scope] * n).dictionary_encode(),
                "method": pa.DictionaryArray.from_arrays(
                    pa.array(np.frombuffer(scaled, dtype=np.int8)), pa.array([EXACT, SCALED])),
            }
        )
