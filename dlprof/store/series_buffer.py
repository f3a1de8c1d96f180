"""Fixed-shape columnar buffers for metric values logged during training (the ``series`` table).

    buffer = SeriesBuffer(pid=os.getpid(), to_epoch_ns=offset)
    buffer.append(SeriesSource.LOG, "train", step=12, values=(("loss", 0.31),))
    table = buffer.drain()   # Arrow rows for the sink, at the next save

A value is appended as numbers into ``array.array`` columns under one lock, with the metric,
split and source names interned once, as :mod:`dlprof.store.slice_buffer` does for slices.
Times are ``perf_counter_ns`` readings mapped to epoch nanoseconds, unless the source gives its
own epoch time (an MLPerf line's ``time_ms``).
"""

from __future__ import annotations

import math
import threading
from array import array
from collections.abc import Iterable
from time import perf_counter_ns

import numpy as np
import pyarrow as pa

from dlprof.keys import SeriesSource
from dlprof.store.schema import SERIES

# Stands for "not given" in the integer columns (step, samples): becomes a null.
_MISSING = -1


class SeriesBuffer:
    """Metric values recorded in this process since the last save."""

    def __init__(self, pid: int, to_epoch_ns: int) -> None:
        """Args:
        pid: the process the values are logged in.
        to_epoch_ns: added to ``perf_counter_ns`` readings to give epoch nanoseconds.
        """
        self.pid = pid
        self.to_epoch_ns = to_epoch_ns
        self._lock = threading.Lock()
        self._codes: dict[str, int] = {}
        self._new_columns()

    def _new_columns(self) -> None:
        self._ts = array("q")
        self._step = array("q")
        self._epoch = array("d")
        self._samples = array("q")
        self._split = array("i")
        self._metric = array("i")
        self._value = array("d")
        self._source = array("i")

    def now_ns(self) -> int:
        """The epoch time now, on the session's clock."""
        return perf_counter_ns() + self.to_epoch_ns

    def append(self, source: SeriesSource, split: str, step: int | None,
               values: Iterable[tuple[str, float | None]], *, epoch: float | None = None,
               samples: int | None = None, ts_ns: int | None = None) -> None:
        """Record metric values taken at one moment.

        Args:
            source: who logged them.
            split: ``"train"``, ``"eval"`` or the source's own word.
            step: the steps ended when they were taken; None when unknown.
            values: (metric, value) pairs; a None value is a mark (an interval's start or end).
            epoch: the epoch they belong to, where known.
            samples: training samples seen, where known.
            ts_ns: their epoch time, when the source gives it; else now.
        """
        when = self.now_ns() if ts_ns is None else ts_ns
        with self._lock:
            source_code, split_code = self._code(source), self._code(split)
            for metric, value in values:
                self._ts.append(when)
                self._step.append(_MISSING if step is None else step)
                self._epoch.append(math.nan if epoch is None else epoch)
                self._samples.append(_MISSING if samples is None else samples)
                self._split.append(split_code)
                self._metric.append(self._code(metric))
                self._value.append(math.nan if value is None else value)
                self._source.append(source_code)

    def __len__(self) -> int:
        return len(self._ts)

    def _code(self, name: str) -> int:
        code = self._codes.get(name)
        if code is None:
            code = self._codes[name] = len(self._codes)
        return code

    def drain(self) -> pa.Table:
        """What was recorded since the last drain, as rows of the ``series`` table."""
        with self._lock:
            columns = (self._ts, self._step, self._epoch, self._samples, self._split, self._metric,
                       self._value, self._source)
            names = list(self._codes)
            self._new_columns()
        ts, step, epoch, samples, split, metric, value, source = (np.frombuffer(c, c.typecode) for c in columns)
        dictionary = pa.array(names, pa.string())

        def named(codes: np.ndarray) -> pa.DictionaryArray:
            return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), dictionary)

        return pa.table({
            "pid": pa.array(np.full(len(ts), self.pid, np.int64)),
            "ts_ns": pa.array(ts, pa.int64()),
            "step": pa.array(step, pa.int64(), mask=step == _MISSING),
            "epoch": pa.array(epoch, pa.float64(), mask=np.isnan(epoch)),
            "samples": pa.array(samples, pa.int64(), mask=samples == _MISSING),
            "split": named(split),
            "metric": named(metric),
            "value": pa.array(value, pa.float64(), mask=np.isnan(value)),
            "source": named(source),
        }, schema=SERIES)
