"""Time to accuracy: when a metric of the ``series`` table first reached a target, and at what cost.

    target = Target.parse("eval_accuracy>=0.759")
    result = time_to_target(run, target)     # seconds, steps, samples, epochs, evaluation share
    summary = olympic_mean([result, ...])    # MLPerf's score over several runs

Per run (:func:`time_to_target`):

- **the crossing** is the first row of the target's metric (by time) whose value meets the
  target; later crossings, and falls back below it, do not matter.
- **time** runs from the run's origin to the crossing: MLPerf's ``run_start`` mark where the
  program logged one (MLPerf times a run from ``run_start``), else the start of profiling.
- **steps** are the steps ended when the crossing value was logged; **epochs** the epoch it
  carries (MLPerf's ``epoch_num``, the epochs a Keras fit had begun, ``dlprof.log(epoch=)``);
  **samples** the ``samples_count`` it carries, else its steps times the ``global_batch_size``
  the program logged (MLPerf logs it), else unknown.
- **evaluation** is the time inside evaluations before the crossing: the intervals between
  ``eval_start`` and ``eval_stop`` marks (MLPerf's, a Keras fit's validations), or where there
  are none, ``dlprof.region`` slices named as an evaluation (:data:`EVAL_REGIONS`).

Over runs (:func:`olympic_mean`), MLPerf's result summariser's rule (mlperf_logging
``result_summarizer``): sort the times of the runs that converged, drop the ``drop`` fastest and
as many of the slowest less the runs that did not converge (they count as the slowest dropped),
and average the rest. ``drop`` is 1 for every MLPerf training benchmark but UNet3D (4); MLPerf
asks for 5 runs (ResNet, SSD, Mask R-CNN, DLRM), 10 (BERT, RNN-T, Stable Diffusion...) or 40
(UNet3D). More runs that did not converge than ``drop``: no score.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from dlprof.keys import Kind
from dlprof.store.reader import Run

# MLPerf's names for the marks and settings read here (Keras's marks use the same).
RUN_START = "run_start"
EVAL_START = "eval_start"
EVAL_STOP = "eval_stop"
GLOBAL_BATCH_SIZE = "global_batch_size"
# dlprof.region names taken as an evaluation when the series holds no eval marks.
EVAL_REGIONS = ("eval", "evaluate", "evaluation", "validate", "validation")
# MLPerf's scoring: the fastest and slowest runs dropped (UNet3D: 4 of each).
MLPERF_DROPPED = 1


class Comparison(StrEnum):
    """How a value meets a target."""

    AT_LEAST = ">="
    MORE = ">"
    AT_MOST = "<="
    LESS = "<"

    def met(self, value: float, threshold: float) -> bool:
        """Whether ``value`` meets ``threshold`` this way."""
        return {
            Comparison.AT_LEAST: value >= threshold, Comparison.MORE: value > threshold,
            Comparison.AT_MOST: value <= threshold, Comparison.LESS: value < threshold,
        }[self]


_TARGET = re.compile(r"^\s*([A-Za-z_][\w.:/-]*)\s*(>=|<=|>|<)\s*(\S+)\s*$")


@dataclass(frozen=True)
class Target:
    """A metric and the value it must reach: ``eval_accuracy>=0.759``, ``val_loss<0.3``."""

    metric: str
    comparison: Comparison
    threshold: float

    @classmethod
    def parse(cls, text: str) -> Target:
        """Read ``METRIC>=VALUE`` (or ``>``, ``<=``, ``<``).

        Raises:
            ValueError: the text is not of that form, or the value is no finite number.
        """
        match = _TARGET.match(text)
        if match is None:
            raise ValueError(f"target {text!r}: write METRIC>=VALUE, e.g. eval_accuracy>=0.759 "
                             "(or >, <=, <)")
        metric, comparison, number = match.groups()
        try:
            threshold = float(number)
        except ValueError:
            threshold = math.nan
        if not math.isfinite(threshold):
            raise ValueError(f"target {text!r}: {number!r} is not a finite number")
        return cls(metric, Comparison(comparison), threshold)

    def __str__(self) -> str:
        return f"{self.metric}{self.comparison}{self.threshold:g}"


@dataclass(frozen=True)
class TimeToTarget:
    """One run's way to a target (see the module's docstring)."""

    run: str  # the run directory's name
    reached: bool
    seconds: float | None  # origin to the crossing; None when not reached
    steps: int | None
    samples: int | None
    epochs: float | None
    value: float | None  # the metric's value at the crossing
    eval_seconds: float  # time inside evaluations before the crossing (or in the whole run)
    origin: str  # what time counts from: "run_start" or "profiling start"
    best: float | None  # the best value the metric reached (a run that fell short says how far)

    @property
    def eval_share(self) -> float | None:
        """The share of the time to the target spent in evaluation (0 to 1)."""
        return self.eval_seconds / self.seconds if self.seconds else None


@dataclass(frozen=True)
class OlympicMean:
    """MLPerf's score over several runs."""

    seconds: float | None  # the mean of the runs kept; None when no score can be given
    kept: int  # runs averaged
    dropped_fastest: int
    dropped_slowest: int  # converged runs dropped as the slowest
    not_reached: int  # runs that never reached the target (dropped as the slowest)
    drop: int  # the rule's number dropped at each end


def time_to_target(run: Run, target: Target) -> TimeToTarget:
    """When ``target`` was first met in ``run``'s series, and what it took.

    Args:
        run: the run.
        target: the metric and the value it must reach.

    Returns:
        The figures; ``reached`` false (and times None) when no value met the target.

    Raises:
        ValueError: the run logged no value of the target's metric (in words naming those it did).
    """
    d = run.engine.dialect
    metric = d.literal(target.metric)
    values = run.query(f"SELECT ts_ns, step, epoch, samples, value FROM series WHERE metric = {metric} "
                       "AND value IS NOT NULL ORDER BY ts_ns, rank").rows
    if not values:
        logged = [str(row[0]) for row in run.query(
            "SELECT DISTINCT metric FROM series WHERE value IS NOT NULL ORDER BY metric").rows]
        raise ValueError(f"{run.path.name}: no values of {target.metric!r}; "
                         + (f"it logged: {', '.join(logged)}" if logged else
                            "it logged none (dlprof.log(), a Keras fit or MLPerf log lines under dlprof run)"))
    higher = target.comparison in (Comparison.AT_LEAST, Comparison.MORE)
    best = (max if higher else min)(float(row[4]) for row in values)
    crossing = next((row for row in values if target.comparison.met(float(row[4]), target.threshold)), None)
    origin_ns, origin = _origin(run)
    end_ns = int(crossing[0]) if crossing is not None else None
    eval_ns = _evaluation_ns(run, origin_ns, end_ns)
    if crossing is None:
        return TimeToTarget(run.path.name, False, None, None, None, None, None, eval_ns / 1e9, origin, best)
    ts_ns, step, epoch, samples, value = crossing
    if samples is None and step is not None:
        batch = _last_value(run, GLOBAL_BATCH_SIZE)
        samples = int(step * batch) if batch is not None else None
    return TimeToTarget(
        run.path.name, True, (int(ts_ns) - origin_ns) / 1e9, None if step is None else int(step),
        None if samples is None else int(samples), None if epoch is None else float(epoch), float(value),
        eval_ns / 1e9, origin, best,
    )


def _origin(run: Run) -> tuple[int, str]:
    """Where time to the target counts from: the first ``run_start`` mark, else profiling's start."""
    rows = run.query(f"SELECT min(ts_ns) FROM series WHERE metric = '{RUN_START}'").rows
    if rows and rows[0][0] is not None:
        return int(rows[0][0]), RUN_START
    return run.manifest.start_ns, "profiling start"


def _last_value(run: Run, metric: str) -> float | None:
    rows = run.query(f"SELECT value FROM series WHERE metric = '{metric}' AND value IS NOT NULL "
                     "ORDER BY ts_ns DESC LIMIT 1").rows
    return float(rows[0][0]) if rows else None


def _evaluation_ns(run: Run, origin_ns: int, end_ns: int | None) -> int:
    """Time inside evaluations between ``origin_ns`` and ``end_ns`` (None: the run's end)."""
    d = run.engine.dialect
    marks = (
        "SELECT rank, source, metric, ts_ns, lead(metric) OVER w AS next_metric, lead(ts_ns) OVER w AS next_ns "
        f"FROM series WHERE metric IN ('{EVAL_START}', '{EVAL_STOP}') AND value IS NULL "
        f"WINDOW w AS (PARTITION BY rank, source ORDER BY ts_ns, CASE metric WHEN '{EVAL_STOP}' THEN 0 ELSE 1 END)"
    )
    intervals = run.query(f"SELECT ts_ns, next_ns FROM ({marks}) AS m WHERE metric = '{EVAL_START}' "
                          f"AND next_metric = '{EVAL_STOP}'").rows
    if not intervals:
        intervals = run.query(
            "SELECT start_ns, start_ns + dur_ns FROM slices "
            f"WHERE kind = '{Kind.REGION}' AND lower(name) IN {d.literals(EVAL_REGIONS)}").rows
    return _union_ns([(int(a), int(b)) for a, b in intervals], origin_ns, end_ns)


def _union_ns(intervals: list[tuple[int, int]], low: int, high: int | None) -> int:
    """The length of the union of ``intervals`` clipped to [low, high] (no upper bound: None)."""
    total, reach = 0, low
    for start, end in sorted(intervals):
        start, end = max(start, reach), end if high is None else min(end, high)
        if end > start:
            total += end - start
            reach = end
    return total


def olympic_mean(results: Sequence[TimeToTarget], drop: int = MLPERF_DROPPED) -> OlympicMean:
    """MLPerf's score over runs: the mean time to the target with the fastest and slowest dropped.

    Args:
        results: one per run.
        drop: how many runs are dropped at each end (MLPerf: 1; UNet3D: 4).

    Returns:
        The mean of the runs kept and what was dropped; ``seconds`` None when more runs than
        ``drop`` never reached the target, or when no run is left to average.
    """
    times = sorted(r.seconds for r in results if r.reached and r.seconds is not None)
    not_reached = len(results) - len(times)
    if not_reached > drop:
        return OlympicMean(None, 0, 0, 0, not_reached, drop)
    kept = times[drop:len(times) - (drop - not_reached)]
    dropped_fastest = min(drop, len(times))
    return OlympicMean(
        sum(kept) / len(kept) if kept else None, len(kept), dropped_fastest,
        len(times) - len(kept) - dropped_fastest, not_reached, drop,
    )
