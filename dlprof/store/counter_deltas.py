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
        self._codes = tuple(range(len(self.metrics)))
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
        if not before or len(before) != len(after):
            return
        missed = (tuple(b - a for a, b in zip(before.unobserved_ns, after.unobserved_ns, strict=True))
                  if isinstance(before, CounterReading) and isinstance(after, CounterReading)
                  else (0,) * len(before))
        with self._lock:
            for code, first, last in zip(self._codes, before, after, strict=True):
                self._slice.append(slice_id)
                self._code.append(code)
                self._value.append(float(last - first))
                self._scaled.append(1 if code < len(missed) and missed[code] > 0 else 0)

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
