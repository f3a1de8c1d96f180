"""Everything the HTML report shows, as one JSON-able dict built from a run.

    run = dlprof.load("dlprof-runs/20261122-101500-train")
    data = report_data(run)
    data["tables"]["op"]["rows"][0]     # the most expensive op, as ``top()`` ranks it

Pure: nothing is printed or written. Every part the run cannot give (no kernels, no counters,
no steps) is left empty with the reason in words, so a report is made for any readable run.
The timeline holds every step and, per track (a CPU thread or a GPU stream), only the longest
slices up to a budget, so a run of millions of events still gives a file a browser opens; the
dict says how many slices were left out. Every part is a query on the run's engine that returns
at most what the page shows: the timeline's chosen slices, each curve's binned points.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from dlprof.analysis.aggregate import default_sort, top
from dlprof.analysis.derived import BUILTINS, derived_metrics
from dlprof.analysis.energy import NO_POWER, energy_summary, step_energy
from dlprof.analysis.memory import MemoryGroup, live_at_peak, memory_peaks
from dlprof.analysis.report_gpu import gpu_overview, top_advice
from dlprof.analysis.roofline import roofline_chart
from dlprof.analysis.sql import DEVICE_KINDS_SQL
from dlprof.analysis.steps import step_report
from dlprof.analysis.threads import GPU_ANNOTATIONS, thread_roles
from dlprof.analysis.tuning import tuning_candidates
from dlprof.keys import Kind
from dlprof.store.reader import Run

# The top tables the report holds, in the order shown, with their titles.
TABLE_KINDS: dict[str, str] = {
    Kind.OP: "Ops",
    Kind.MODULE: "Layers",
    Kind.KERNEL: "Kernels",
    Kind.REGION: "Regions",
}


@dataclass(frozen=True)
class ReportLimits:
    """How much of a large run the report carries."""

    table_rows: int = 50  # rows per top table
    timeline_slices: int = 40_000  # slices on the timeline besides the steps, over all tracks
    curve_points: int = 1_000  # points per memory or counter curve
    metric_rows: int = 30  # rows of derived metrics and of tuning candidates


# Called with the name of each stage as it starts, so a caller can show progress.
Progress = Callable[[str], None]
STAGES = ("summary", "gpu", "advice", "steps", "tables", "timeline", "memory", "counters", "metrics", "tuning",
          "roofline")


def report_data(run: Run, limits: ReportLimits = ReportLimits(), progress: Progress | None = None) -> dict[str, Any]:
    """Gather what the report shows.

    Args:
        run: the run.
        limits: how many rows, slices and points to keep.
        progress: called with each stage's name (:data:`STAGES`) as it starts.

    Returns:
        A dict of plain values (str, int, float, None, lists, dicts) with keys ``summary``,
        ``gpu`` and ``advice`` (what the page opens with: :mod:`dlprof.analysis.report_gpu`),
        ``steps``, ``tables``, ``timeline``, ``memory``, ``counters``, ``metrics``, ``tuning`` and ``roofline``.
        Times are nanoseconds; timeline and curve times are offsets from ``summary.t0_ns``.
    """
    report = progress or (lambda stage: None)
    report("summary")
    t0 = _origin(run)
    data: dict[str, Any] = {"summary": _summary(run, t0)}
    report("gpu")
    data["gpu"] = gpu_overview(run)
    report("advice")
    data["advice"] = top_advice(run)
    report("steps")
    data["steps"] = _steps(run, t0)
    report("tables")
    data["tables"] = _tables(run, limits.table_rows)
    report("timeline")
    data["timeline"] = timeline(run, t0, limits.timeline_slices)
    report("memory")
    data["memory"] = _memory(run, t0, limits.curve_points, limits.table_rows)
    report("counters")
    data["counters"] = _counters(run, t0, limits.curve_points)
    report("metrics")
    data["metrics"] = _metrics(run, limits.metric_rows)
    report("tuning")
    data["tuning"] = _tuning(run, limits.metric_rows)
    report("roofline")
    data["roofline"] = roofline_chart(run, limits.metric_rows)
    return data


def _origin(run: Run) -> int:
    """The time every offset in the report counts from: the earliest event, or the run's start."""
    first = run.query("SELECT min(t) FROM (SELECT min(start_ns) AS t FROM slices UNION ALL "
                      "SELECT min(ts_ns) FROM memory UNION ALL SELECT min(ts_ns) FROM counters) AS firsts").rows
    return int(first[0][0]) if first and first[0][0] is not None else run.manifest.start_ns


def _plain(value: Any) -> Any:
    """A pandas or numpy scalar as a JSON value (missing ones as None)."""
    if value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value)):
        return None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return None if np.isnan(value) else float(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _records(frame: pd.DataFrame) -> dict[str, Any]:
    """A DataFrame as ``{"columns": [...], "rows": [[...], ...]}`` of plain values."""
    rows = [[_plain(v) for v in row] for row in frame.itertuples(index=False, name=None)]
    return {"columns": [str(c) for c in frame.columns], "rows": rows}


def _summary(run: Run, t0: int) -> dict[str, Any]:
    manifest = run.manifest
    host = manifest.host
    return {
        "name": manifest.name,
        "path": str(run.path),
        "command": list(manifest.command),
        "status": str(run.status),
        "exit_code": manifest.exit_code,
        "error": manifest.error,
        "degraded": list(manifest.degraded),  # why the recording is not whole, a line each
        "start_ns": manifest.start_ns,
        "end_ns": manifest.end_ns,
        "duration_ns": manifest.duration_ns,
        "t0_ns": t0,
        "host": {
            "hostname": host.hostname, "os": host.os, "python": host.python,
            "cpu_model": host.cpu_model, "cpu_cores": host.cpu_cores, "memory_bytes": host.memory_bytes,
        },
        "devices": [_plain_dict(d) for d in manifest.devices],
        "collectors": [
            {"name": c.name, "version": c.version, "active": c.active, "notes": list(c.notes)}
            for c in manifest.collectors
        ],
        "ranks": list(manifest.ranks),
        "world_size": manifest.world_size,
        "schedule": manifest.schedule,
        "counts": dict(manifest.counts),
        "kinds": {str(kind): int(n) for kind, n in run.query(
            "SELECT kind, count(*) AS n FROM slices WHERE kind IS NOT NULL GROUP BY kind ORDER BY n DESC, kind")},
    }


def _plain_dict(values: dict[str, Any]) -> dict[str, Any]:
    return {str(k): v if isinstance(v, str | int | float | bool) or v is None else str(v)
            for k, v in values.items()}


def _steps(run: Run, t0: int) -> dict[str, Any]:
    """Every step (with its status: counted, warm-up or partial), the statistics over the counted
    ones, their mean breakdown per part on the host and per GPU (see :mod:`dlprof.analysis.steps`) and, where the run
    recorded power, their energy (:mod:`dlprof.analysis.energy`)."""
    found = step_report(run)
    if found.steps.empty:
        return {"rows": [], "reason": "the run has no steps (ProfilerStep#N slices)"}
    rows = [[int(rank), str(name), int(start) - t0, int(dur), str(status)]
            for rank, name, start, dur, status in found.steps[["rank", "step", "start_ns", "dur_ns", "status"]]
            .itertuples(index=False, name=None)]
    return {"columns": ["rank", "name", "start_ns", "dur_ns", "status"], "rows": rows, "reason": "",
            "statistics": _records(found.statistics), "breakdown": _records(found.breakdown),
            "device_breakdown": _records(found.device_breakdown),
            "energy": _energy(run)}


# Where a run recorded no power: why, in words.
NO_ENERGY = f"Energy: {NO_POWER}"
# The energy table's columns, from energy_summary's.
_ENERGY_COLUMNS = {"rank": "rank", "device": "device", "source": "source", "steps": "steps",
                   "mean_joules": "joules_per_step", "watts": "watts"}


def _energy(run: Run) -> dict[str, Any]:
    """Per device, the mean joules per counted step and mean watts (``energy_summary``'s), and
    the joules of every step of the run; or why there are none."""
    energy = step_energy(run)
    if energy.empty:
        return {"recorded": False, "reason": NO_ENERGY, "columns": [], "rows": [], "total_joules": None}
    summary = energy_summary(energy)[list(_ENERGY_COLUMNS)].rename(columns=_ENERGY_COLUMNS)
    return {"recorded": True, "reason": "", **_records(summary), "total_joules": float(energy["joules"].sum()),
            "steps": int(energy[["rank", "start_ns"]].drop_duplicates().shape[0])}


def _tables(run: Run, limit: int) -> dict[str, Any]:
    counted = {str(kind): (int(total), int(groups)) for kind, total, groups in run.query(
        "SELECT kind, count(*), count(DISTINCT name) FROM slices GROUP BY kind")}
    tables: dict[str, Any] = {}
    sort = default_sort(run)  # as dlprof top sorts: by device time on a run with GPU work
    for kind, title in TABLE_KINDS.items():
        if kind not in counted:
            continue
        table = top(run, kind=kind, by=sort, limit=limit)
        total, groups = counted[kind]
        tables[str(kind)] = {"title": title, "total": total, "groups": groups, "by": str(sort), **_records(table)}
    return tables


def timeline(run: Run, t0: int, budget: int) -> dict[str, Any]:
    """Steps and their nested slices, one track per CPU thread or GPU stream.

    Args:
        run: the run.
        t0: the origin of the offsets.
        budget: slices kept besides the steps, shared equally by the tracks (a track that needs
            fewer leaves the rest to the others); each keeps its longest.

    Returns:
        Columnar slices (``track``, ``start``, ``dur``, ``depth``, ``name`` and ``kind`` as
        indices into ``names`` and ``kinds``), the ``tracks`` with their labels and depths, and
        ``shown`` of ``total`` slices.
    """
    on_device = f"(kind IN {DEVICE_KINDS_SQL} OR device <> 'cpu')"
    placed = (
        f"SELECT rank, CASE WHEN {on_device} THEN device ELSE 'cpu' END AS place, coalesce(pid, -1) AS pid, "
        f"coalesce(CASE WHEN {on_device} THEN coalesce(stream, tid) ELSE tid END, -1) AS lane, "
        "start_ns, coalesce(dur_ns, 0) AS dur, coalesce(depth, 0) AS depth, name, kind FROM slices"
    )
    tracks = run.sql(
        "SELECT rank, place, pid, lane, count(*) AS total, "
        f"count(*) FILTER (WHERE kind IS NULL OR kind <> '{Kind.STEP}') AS others "
        f"FROM ({placed}) AS placed GROUP BY rank, place, pid, lane ORDER BY rank, place, pid, lane"
    )
    if tracks.empty:
        return {"tracks": [], "names": [], "kinds": [], "track": [], "start": [], "dur": [],
                "depth": [], "name": [], "kind": [], "shown": 0, "total": 0}
    share = _shares(tracks["others"].astype("int64").tolist(), budget)
    numbered = " UNION ALL ".join(
        f"SELECT {int(r)} AS rank, {run.engine.dialect.literal(str(p))} AS place, {int(pid)} AS pid, "
        f"{int(lane)} AS lane, {number} AS track, {share[number]} AS share"
        for number, (r, p, pid, lane) in enumerate(tracks[["rank", "place", "pid", "lane"]].itertuples(index=False))
    )
    is_step = f"coalesce(kind = '{Kind.STEP}', FALSE)"
    kept = run.sql(
        f"SELECT t.track, p.start_ns - {int(t0)} AS start, p.dur, p.depth, p.name, p.kind FROM ("
        f"SELECT *, row_number() OVER (PARTITION BY rank, place, pid, lane, {is_step} "
        f"ORDER BY dur DESC, start_ns) AS place_in_track FROM ({placed}) AS placed) AS p "
        "JOIN (" + numbered + ") AS t ON t.rank = p.rank AND t.place = p.place AND t.pid = p.pid AND t.lane = p.lane "
        f"WHERE {is_step.replace('kind', 'p.kind')} OR p.place_in_track <= t.share"
    ).astype({"track": "int64", "start": "int64", "dur": "int64", "depth": "int64"})
    kept = kept.assign(name=kept["name"].astype(str), kind=kept["kind"].astype(str))
    kept = kept.sort_values(["track", "depth", "start"], kind="stable")
    base = kept.groupby("track")["depth"].min()
    depth = kept["depth"] - kept["track"].map(base)
    names, name_index = np.unique(kept["name"].to_numpy(), return_inverse=True)
    kinds, kind_index = np.unique(kept["kind"].to_numpy(), return_inverse=True)
    lanes = depth.groupby(kept["track"]).max()
    ranked = len(run.manifest.ranks) > 1
    roles = thread_roles(run)
    listed = [
        {"label": _track_label(int(r), str(p), int(pid), int(lane), ranked, roles.get((int(r), int(pid), int(lane)))),
         "rank": int(r), "device": str(p),
         "depth": int(lanes.get(number, 0)) + 1, "total": int(total)}
        for number, (r, p, pid, lane, total) in enumerate(
            tracks[["rank", "place", "pid", "lane", "total"]].itertuples(index=False))
    ]
    return {
        "tracks": listed,
        "names": [str(n) for n in names],
        "kinds": [str(k) for k in kinds],
        "track": kept["track"].tolist(),
        "start": kept["start"].tolist(),
        "dur": kept["dur"].tolist(),
        "depth": depth.tolist(),
        "name": name_index.tolist(),
        "kind": kind_index.tolist(),
        "shown": len(kept),
        "total": int(tracks["total"].sum()),
    }


def _shares(sizes: list[int], budget: int) -> list[int]:
    """How many slices each track keeps: an equal share of the budget, the smallest tracks first,
    each leaving what it does not use to the others."""
    share = [0] * len(sizes)
    left, tracks_left = max(budget, 0), len(sizes)
    for track in sorted(range(len(sizes)), key=lambda t: (sizes[t], t)):
        share[track] = take = min(sizes[track], left // tracks_left)
        left -= take
        tracks_left -= 1
    return share


def _track_label(rank: int, device: str, pid: int, lane: int, ranked: bool, role: str | None = None) -> str:
    """A track named as a person knows it: ``cuda:0 stream 7``, ``main``, ``autograd``,
    ``DataLoader worker 0``; a thread of no known role by its numbers."""
    prefix = f"rank {rank} · " if ranked else ""
    if device != "cpu":
        return f"{prefix}{device} stream {lane}"
    if role == GPU_ANNOTATIONS:
        return f"{prefix}GPU annotations (stream {lane})"
    return f"{prefix}{role}" if role else f"{prefix}pid {pid} thread {lane}"


def downsample(ts: np.ndarray, values: np.ndarray, points: int, how: str = "max") -> tuple[list[int], list[float]]:
    """At most ``points`` points: the series cut into equal time bins, one value per bin.

    Args:
        ts: times, ascending.
        values: the values at those times.
        points: the most points to return.
        how: ``max`` (peaks survive, for memory) or ``mean`` (for sampled gauges).

    Returns:
        Each bin's first time and its value; the series itself when it is short enough.
    """
    if len(ts) <= points:
        return [int(t) for t in ts], [float(v) for v in values]
    edges = np.linspace(ts[0], ts[-1], points + 1)
    bins = np.clip(np.searchsorted(edges, ts, side="right") - 1, 0, points - 1)
    grouped = pd.Series(values).groupby(bins)
    reduced = grouped.max() if how == "max" else grouped.mean()
    first = pd.Series(ts).groupby(bins).min()
    return [int(t) for t in first.to_numpy()], [float(v) for v in reduced.to_numpy()]


def _curves(run: Run, table: str, keys: list[str], value: str, how: str, t0: int,
            points: int) -> list[tuple[tuple[Any, ...], list[int], list[float], float]]:
    """Each series of a table (one per ``keys``), binned to at most ``points`` points.

    The bins are :func:`downsample`'s: equal spans of time from the series' first to its last
    sample, one value per bin (its ``how``: max or mean) at the bin's first time; a series short
    enough is returned whole. The engine bins; only the points come back.

    Returns:
        Per series, in key order: its keys, times (offsets from ``t0``), values and its peak.
    """
    key_list = ", ".join(keys)
    aggregate = "max" if how == "max" else "avg"
    present = f"SELECT {key_list}, ts_ns, CAST({value} AS DOUBLE) AS v FROM {table} WHERE {value} IS NOT NULL"
    spans = (f"SELECT {key_list}, min(ts_ns) AS first_ns, max(ts_ns) AS last_ns, count(*) AS n, max(v) AS peak "
             f"FROM present GROUP BY {key_list}")
    joined = " AND ".join(f"p.{k} IS NOT DISTINCT FROM s.{k}" for k in keys)
    binned = (
        f"SELECT {', '.join('p.' + k for k in keys)}, s.peak, CASE WHEN s.n <= {points} OR s.last_ns = s.first_ns "
        f"THEN p.ts_ns ELSE least(CAST(floor(CAST(p.ts_ns - s.first_ns AS DOUBLE) * {points} / "
        f"(s.last_ns - s.first_ns)) AS BIGINT), {points - 1}) END AS bin, p.ts_ns, p.v "
        f"FROM present p JOIN spans s ON {joined}"
    )
    rows = run.query(
        f"WITH present AS ({present}), spans AS ({spans}), binned AS ({binned}) "
        f"SELECT {key_list}, min(ts_ns) AS t, {aggregate}(v) AS v, max(peak) AS peak FROM binned "
        f"GROUP BY {key_list}, bin ORDER BY {key_list}, t"
    )
    series: dict[tuple[Any, ...], tuple[list[int], list[float], float]] = {}
    for row in rows:
        key = tuple(row[: len(keys)])
        times, values, _ = series.setdefault(key, ([], [], float(row[-1])))
        times.append(int(row[-3]) - t0)
        values.append(float(row[-2]))
    return [(key, times, values, peak) for key, (times, values, peak) in series.items()]


def _memory(run: Run, t0: int, points: int, rows: int) -> dict[str, Any]:
    """Allocated memory over time per device, with its peak marked, the peaks and what was live
    at them (``dlprof memory``'s tables)."""
    if not run.query("SELECT 1 FROM memory LIMIT 1").rows:
        return {"series": [], "reason": "the run recorded no allocations"}
    peaks = memory_peaks(run)
    # A (rank, device) curve's peak: the highest of its processes'.
    highest = peaks.sort_values("peak_bytes", ascending=False).drop_duplicates(["rank", "device"])
    peak_at = {(int(r), str(d)): int(t) - t0 for r, d, t in zip(highest["rank"], highest["device"],
                                                                 highest["peak_ns"], strict=True)}
    series = [
        {"label": f"rank {rank} {device} allocated", "unit": "bytes", "ts": ts, "values": values, "peak": peak,
         "peak_ts": peak_at.get((int(rank), str(device)))}
        for (rank, device), ts, values, peak in _curves(run, "memory", ["rank", "device"], "total_allocated",
                                                        "max", t0, points)
    ]
    shown = peaks[["rank", "device", "peak_bytes", "reserved_peak_bytes", "live_bytes", "untraced_bytes",
                   "step", "op"]]
    live = live_at_peak(run, MemoryGroup.OP, limit=rows).rename(columns={"op": "name", "bytes": "live_bytes"})
    return {"series": series, "reason": "" if series else "no allocation totals recorded",
            "peaks": _records(shown), "live": _records(live[["rank", "device", "name", "live_bytes", "blocks",
                                                              "peak_pct"]])}


def _counters(run: Run, t0: int, points: int) -> dict[str, Any]:
    if not run.query("SELECT 1 FROM counters LIMIT 1").rows:
        return {"series": [], "reason": "the run recorded no counters"}
    curves = _curves(run, "(SELECT rank, device, track, coalesce(unit, '') AS unit, ts_ns, value FROM counters) "
                     "AS counters", ["rank", "device", "track", "unit"], "value", "mean", t0, points)
    series = [
        {"label": f"{track} (rank {rank}, {device})", "unit": str(unit), "ts": ts, "values": values}
        for (rank, device, track, unit), ts, values, _ in curves
    ]
    return {"series": series, "reason": ""}


def _metrics(run: Run, limit: int) -> dict[str, Any]:
    if not run.query("SELECT 1 FROM metrics LIMIT 1").rows and not run.query(
            "SELECT 1 FROM slices WHERE flops IS NOT NULL LIMIT 1").rows:
        # Nothing to derive from: one sentence, not every built-in's list of missing counters.
        return {"columns": [], "rows": [], "units": {}, "unavailable": {},
                "reason": "this run holds no counter values; derived metrics need per-kernel or "
                          "per-region counters (see dlprof metrics --list)"}
    try:
        table = derived_metrics(run, BUILTINS)
    except ValueError as error:  # FormulaError: a built-in name ambiguous in this run
        return {"columns": [], "rows": [], "units": {}, "unavailable": {}, "reason": str(error)}
    values = table.values.head(limit)
    reason = "" if table.metrics else "no built-in metric can be computed for this run"
    return {**_records(values), "units": {m.name: m.unit for m in table.metrics},
            "unavailable": dict(table.unavailable), "reason": reason}


def _tuning(run: Run, limit: int) -> dict[str, Any]:
    try:
        found = tuning_candidates(run, limit=limit)
    except ValueError as error:  # no kernels
        return {"columns": [], "rows": [], "basis": "", "reason": str(error)}
    table = found.table.drop(columns=["rules"])
    return {**_records(table), "basis": str(found.basis),
            "reason": "" if len(table) else "no kernel matched a tuning rule"}

