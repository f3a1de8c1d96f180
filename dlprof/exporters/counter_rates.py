"""Counter tracks for the timelines: CPU counter deltas per step and per region, as rates.

The counters collector keeps, for each step and region, the delta of each CPU counter
(``perf:task-clock``, ``papi:...``) as a metrics row of the slice. The Chrome and Perfetto
exporters draw them as counter tracks, one per (rank, pid, metric), each a step function:

* at a step's start, the counter's delta over the step divided by the step's duration in
  seconds: a rate, so that steps of different lengths compare and the track reads as a curve
  (``perf:task-clock`` counts nanoseconds, so its rate is CPU nanoseconds per second);
* 0 after the last step, and at a step's end when the next one begins more than a step's length
  later (steps the schedule skipped, where nothing was counted), so no rate is drawn over them.

Regions get a track of their own per metric, ``<metric> (regions)``, built the same way from the
outermost counted regions (an inner region overlaps its outer one, whose counts include it).
Per-kernel metrics (``cupti:``) and per-layer counts are left out: they are not one timeline::

    for track in counter_rate_tracks(run):
        print(track.name, list(zip(track.ts_ns, track.values)))
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from dlprof.keys import Kind, StoreTable
from dlprof.store.reader import Run

# The per-slice CPU counter metrics that become tracks.
CPU_COUNTER_PREFIXES = ("perf:", "papi:")
REGION_SUFFIX = " (regions)"
RATE_UNIT = "/s"


@dataclass
class RateTrack:
    """One counter track: a metric's rate over the steps (or regions) of one process."""

    rank: int
    pid: int
    name: str  # the metric, with REGION_SUFFIX for the regions' track
    ts_ns: list[int] = field(default_factory=list)  # epoch nanoseconds, ascending
    values: list[float] = field(default_factory=list)  # per second


def counter_rate_tracks(run: Run) -> list[RateTrack]:
    """The counter tracks of a run, as the module docstring describes them.

    Args:
        run: the loaded run.

    Returns:
        One track per (rank, pid, metric) for steps and one for regions where any was counted,
        sorted by rank, pid and name; empty for a run without CPU counter metrics.
    """
    metrics = run.arrow(StoreTable.METRICS)
    if metrics.num_rows == 0:
        return []
    names = metrics.column("metric").cast(pa.string())
    wanted = pc.or_(*(pc.starts_with(names, prefix) for prefix in CPU_COUNTER_PREFIXES))
    rows = pa.table({"slice_id": metrics.column("slice_id"), "metric": names,
                     "value": metrics.column("value")}).filter(wanted)
    if rows.num_rows == 0:
        return []
    slices = run.arrow(StoreTable.SLICES)
    kinds = slices.column("kind").cast(pa.string())
    timed = slices.filter(pc.is_in(kinds, pa.array([str(Kind.STEP), str(Kind.REGION)])))
    timed = pa.table({"slice_id": timed.column("id"), "rank": timed.column("rank"),
                      "pid": timed.column("pid"), "kind": timed.column("kind").cast(pa.string()),
                      "start_ns": timed.column("start_ns"), "dur_ns": timed.column("dur_ns")})
    joined = rows.join(timed, "slice_id", join_type="inner").sort_by(
        [("rank", "ascending"), ("pid", "ascending"), ("kind", "ascending"),
         ("metric", "ascending"), ("start_ns", "ascending")])
    groups: dict[tuple[int, int, str, str], list[tuple[int, int, float]]] = {}
    for row in joined.to_pylist():
        key = (row["rank"], row["pid"], row["kind"], row["metric"])
        groups.setdefault(key, []).append((row["start_ns"], row["dur_ns"], row["value"]))
    tracks = []
    for (rank, pid, kind, metric), spans in groups.items():
        name = metric + (REGION_SUFFIX if kind == Kind.REGION else "")
        tracks.append(_track(RateTrack(rank, pid, name), _outermost(spans)))
    return sorted(tracks, key=lambda t: (t.rank, t.pid, t.name))


def _outermost(spans: list[tuple[int, int, float]]) -> list[tuple[int, int, float]]:
    """Spans sorted by start, without those that start inside one kept before them."""
    kept: list[tuple[int, int, float]] = []
    for span in spans:
        if not kept or span[0] >= kept[-1][0] + kept[-1][1]:
            kept.append(span)
    return kept


def _track(track: RateTrack, spans: list[tuple[int, int, float]]) -> RateTrack:
    for i, (start, dur, delta) in enumerate(spans):
        if dur <= 0:
            continue  # no time to divide by; the previous value holds
        track.ts_ns.append(start)
        track.values.append(delta * 1e9 / dur)
        end = start + dur
        if i + 1 == len(spans) or spans[i + 1][0] - end > dur:
            track.ts_ns.append(end)
            track.values.append(0.0)
    return track
