"""The overhead part's figures: one workload run three ways, interleaved over rounds, summed up.

    ways = round_order(2)                          # ("dlprof", "plain", "bare"): rotated each round
    m = Measurement("gpt", "bare", 0, wall_s=12.1, step_ms=41.0, peak_rss_mib=3100, peak_cuda_mib=9800)
    rows, ratios = summarise([m, ...])             # the report's tables

The ways are those of ``bench/whole_process.py``: ``plain`` (python), ``bare`` (one torch.profiler
around the whole program, then ``export_chrome_trace``: ``bench/bare_profiler.py``) and
``dlprof`` (``dlprof run``). Per way: the median over rounds of the whole process's wall time,
of the step period (the median time between two optimizer steps, the first
:data:`WARM_UP_STEPS` left out), of the peak resident memory of the process tree and of the
peak CUDA memory torch held. Ratios are taken round by round (each round's ways ran back to
back), then their median and range. Pure functions, standard library only.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

WAYS = ("plain", "bare", "dlprof")
RATIOS = (("dlprof", "bare"), ("dlprof", "plain"), ("bare", "plain"))
WARM_UP_STEPS = 3  # steps left out of the period: allocator, cuBLAS and autotuning warm up there
MIN_ROUNDS = 3


@dataclass(frozen=True)
class Measurement:
    """One process of one way in one round."""

    workload: str
    way: str
    round: int
    wall_s: float
    step_ms: float | None  # the median step period, None if too few steps were timed
    peak_rss_mib: float
    peak_cuda_mib: float | None
    returncode: int = 0
    events: int = 0  # rows dlprof wrote, or events in the bare trace


def round_order(number: int) -> tuple[str, ...]:
    """The ways of round ``number`` (from 0), rotated so that drift falls on each alike."""
    shift = number % len(WAYS)
    return WAYS[shift:] + WAYS[:shift]


def step_period_ms(steps_ns: Sequence[int], warm_up: int = WARM_UP_STEPS) -> float | None:
    """The median time between consecutive optimizer steps after the first ``warm_up``, in ms."""
    kept = list(steps_ns)[warm_up:]
    gaps = [(later - earlier) / 1e6 for earlier, later in itertools.pairwise(kept)]
    return statistics.median(gaps) if gaps else None


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarise(measurements: Sequence[Measurement]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One workload's measurements as the report's two tables.

    Returns:
        Per way: rounds, median wall time, step period, peak tree memory, peak CUDA memory and
        events; per ratio (``dlprof/bare``...): of wall time and of step period, the median over
        rounds with the least and most, and of the peak tree memory, the median.
    """
    by_way = {way: [m for m in measurements if m.way == way and m.returncode == 0] for way in WAYS}
    rows = []
    for way, taken in by_way.items():
        rows.append({"way": way, "rounds": len(taken),
                     "wall_s": _rounded(_median([m.wall_s for m in taken]), 2),
                     "step_ms": _rounded(_median([m.step_ms for m in taken]), 2),
                     "peak_rss_mib": _rounded(_median([m.peak_rss_mib for m in taken]), 0),
                     "peak_cuda_mib": _rounded(_median([m.peak_cuda_mib for m in taken]), 0),
                     "events": int(statistics.median([m.events for m in taken])) if taken else 0})
    ratios = []
    rounds = sorted({m.round for m in measurements})
    for top, bottom in RATIOS:
        row: dict[str, Any] = {"ratio": f"{top}/{bottom}"}
        for figure in ("wall_s", "step_ms", "peak_rss_mib"):
            per_round = []
            for number in rounds:
                a = next((getattr(m, figure) for m in by_way[top] if m.round == number), None)
                b = next((getattr(m, figure) for m in by_way[bottom] if m.round == number), None)
                if a is not None and b:
                    per_round.append(a / b)
            label = {"wall_s": "wall", "step_ms": "step", "peak_rss_mib": "memory"}[figure]
            row[label] = _rounded(statistics.median(per_round), 3) if per_round else None
            if figure != "peak_rss_mib":
                row[f"{label} range"] = (f"{min(per_round):.3f}-{max(per_round):.3f}" if per_round else "")
        ratios.append(row)
    return rows, ratios


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
