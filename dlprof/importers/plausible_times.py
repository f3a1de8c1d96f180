"""Times implausibly far from the rest of a trace: dropped and counted, not stored.

Each time is checked on its own as it is read (:mod:`dlprof.importers.kineto_events`: a number,
within ±3e18 ns), but one event at ``"ts": 0.5`` among events of 2024 passes that check and then
makes the run start in 1970, and eight events of 95 years each add up past int64. So each piece
of an imported trace is also judged as a whole: its events' starts have a median and a spread
(the median absolute deviation), and an event that starts, or ends, further from the median
than a day plus ten spreads is dropped, counted as ``ts_implausible`` or ``dur_implausible``::

    tables = within_plausible_times(tables)   # KinetoTables of one piece, its outliers dropped

A trace's events lie within seconds or hours of one another; a day of slack keeps every real
one, and ten spreads keep a piece whose events are spread wide (a long trace, several phases).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dlprof.importers.damage import Damage
from dlprof.importers.kineto import KinetoTables

# What any real event of a trace may lie from the median of its piece, beyond ten spreads.
SLACK_NS = 24 * 3600 * 10**9
SPREADS = 10


def within_plausible_times(tables: KinetoTables) -> KinetoTables:
    """One piece's rows without those whose times lie implausibly far from the others.

    Args:
        tables: the rows of one piece of a trace (times relative to the trace's base).

    Returns:
        The same rows less the implausible ones (slices, their metrics, memory and counter
        rows), ``dropped`` counting them per reason.
    """
    # As floats: a start and a duration near 3e18 each would wrap an int64 sum.
    starts = tables.slices.column("start_ns").fill_null(0).to_numpy(zero_copy_only=False).astype(np.float64)
    if len(starts) < 3:
        return tables  # no "others" to be far from
    low, high = _window(starts)
    ends = starts + tables.slices.column("dur_ns").fill_null(0).to_numpy(zero_copy_only=False).astype(np.float64)
    start_far = (starts < low) | (starts > high)
    end_far = ~start_far & (ends > high)
    dropped = dict(tables.dropped)
    _count(dropped, Damage.TS_IMPLAUSIBLE, int(start_far.sum()))
    _count(dropped, Damage.DUR_IMPLAUSIBLE, int(end_far.sum()))
    slices, metrics = tables.slices, tables.metrics
    if start_far.any() or end_far.any():
        keep = pa.array(~(start_far | end_far))
        gone = slices.column("id").filter(pc.invert(keep))
        slices = slices.filter(keep)
        if metrics.num_rows:
            metrics = metrics.filter(pc.invert(pc.is_in(metrics.column("slice_id"), gone)))
    memory = _timed_rows(tables.memory, low, high, dropped)
    counters = _timed_rows(tables.counters, low, high, dropped)
    return dataclasses.replace(tables, slices=slices, metrics=metrics, memory=memory, counters=counters,
                               dropped=dropped)


def _window(starts: np.ndarray) -> tuple[float, float]:
    """The times a piece's events may lie within: its median, a day and ten spreads either side."""
    median = float(np.median(starts))
    spread = float(np.median(np.abs(starts - median)))
    reach = SLACK_NS + SPREADS * spread
    return median - reach, median + reach


def _timed_rows(rows: pa.Table, low: float, high: float, dropped: dict[str, int]) -> pa.Table:
    """Memory or counter rows (``ts_ns``) within the slices' window."""
    if rows.num_rows == 0 or "ts_ns" not in rows.column_names:
        return rows
    ts = rows.column("ts_ns").fill_null(0).to_numpy(zero_copy_only=False).astype(np.float64)
    far = (ts < low) | (ts > high)
    if not far.any():
        return rows
    _count(dropped, Damage.TS_IMPLAUSIBLE, int(far.sum()))
    return rows.filter(pa.array(~far))


def _count(dropped: dict[str, int], reason: Damage, count: int) -> None:
    if count:
        dropped[str(reason)] = dropped.get(str(reason), 0) + count
