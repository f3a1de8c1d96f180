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
from dlprof.store import scan
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
    tracks = []
    for rank in scan.ranks(run, StoreTable.METRICS):
        rows = _cpu_counter_rows(run, rank)
        if rows.num_rows == 0:
            continue
        joined = rows.join(_timed_slices(run, rank), "slice_id", join_type="inner").sort_by(
            [("pid", "ascending"), ("kind", "ascending"), ("metric", "ascending"), ("start_ns", "ascending")])
        groups: dict[tuple[int, str, str], list[tuple[int, int, float]]] = {}
        for row in joined.to_pylist():
            groups.setdefault((row["pid"], row["kind"], row["metric"]), []).append(
                (row["start_ns"], row["dur_ns"], row["value"]))
        for (pid, kind, metric), spans in groups.items():
            name = metric + (REGION_SUFFIX if kind == Kind.REGION else "")
            tracks.append(_track(RateTrack(rank, pid, name), _outermost(spans)))
    return sorted(tracks, key=lambda t: (t.rank, t.pid, t.name))


def _cpu_counter_rows(run: Run, rank: int) -> pa.Table:
    """A rank's metrics rows of CPU counters (slice_id, metric, value)."""
    parts = []
    for batch in scan.scan(run, StoreTable.METRICS, rank, ["slice_id", "metric", "value"]):
        names = batch.column(1).cast(pa.string())
        wanted = pc.or_(*(pc.starts_with(names, prefix) for prefix in CPU_COUNTER_PREFIXES))
        parts.append(pa.table({"slice_id": batch.column(0), "metric": names, "value": batch.column(2)})
                     .filter(wanted))
    return pa.concat_tables(parts) if parts else pa.table({"slice_id": pa.array([], pa.int64())})


def _timed_slices(run: Run, rank: int) -> pa.Table:
    """A rank's steps and regions: their id, pid, kind, start and duration."""
    kinds = pa.array([str(Kind.STEP), str(Kind.REGION)])
    parts = []
    for batch in scan.scan(run, StoreTable.SLICES, rank, ["id", "pid", "kind", "start_ns", "dur_ns"]):
        kind = batch.column(2).cast(pa.string())
        parts.append(pa.table({"slice_id": batch.column(0), "pid": batch.column(1), "kind": kind,
                               "start_ns": batch.column(3), "dur_ns": batch.column(4)})
                     .filter(pc.fill_null(pc.is_in(kind, kinds), False)))
    if not parts:
        return pa.table({"slice_id": pa.array([], pa.int64()), "pid": pa.array([], pa.int64()),
                         "kind": pa.array([], pa.string()), "start_ns": pa.array([], pa.int64()),
                         "dur_ns": pa.array([], pa.int64())})
    return pa.concat_tables(parts)


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
