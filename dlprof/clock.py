"""dlprof's clock: ``perf_counter_ns`` readings, mapped to epoch nanoseconds through a pair.

Collectors time with the monotonic ``perf_counter_ns`` (cheap, never jumps) and the store keeps
epoch nanoseconds, Kineto's convention. The mapping is one offset measured at start, with the
uncertainty of its measurement, recorded in the manifest.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class ClockPair:
    """Simultaneous readings of the wall clock and ``perf_counter_ns``."""

    realtime_ns: int
    monotonic_ns: int
    uncertainty_ns: int

    @property
    def offset_ns(self) -> int:
        """Add to a ``perf_counter_ns`` reading to get epoch nanoseconds."""
        return self.realtime_ns - self.monotonic_ns


def sample_clocks(tries: int = 5) -> ClockPair:
    """The tightest of a few (realtime, monotonic, realtime) readings."""
    best: ClockPair | None = None
    for _ in range(tries):
        before = time.time_ns()
        mono = time.perf_counter_ns()
        after = time.time_ns()
        pair = ClockPair((before + after) // 2, mono, after - before)
        if best is None or pair.uncertainty_ns < best.uncertainty_ns:
            best = pair
    assert best is not None
    return best
