"""Everything the HTML report shows, as one JSON-able dict built from a run.

    run = dlprof.load("dlprof-runs/20261122-101500-train")
    data = report_data(run)
    data["tables"]["op"]["rows"][0]     # the most expensive op, as ``top()`` ranks it

Pure: nothing is printed or written. Every part the run cannot give (no kernels, no counters,
no steps) is left empty with the reason in words, so a report is made for any readable run.
The timeline holds every step and, per track (a CPU thread or a GPU stream), only the longest
slices up to a budget, so a run of millions of events still gives a file a browser opens; the
dict says how many slices were left out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from dlprof.analysis.aggregate import kinds_present, top
from dlprof.analysis.derived import BUILTINS, derived_metrics
from dlprof.analysis.gpu import cpu_steps
from dlprof.analysis.tuning import tuning_candidates
from dlprof.keys import DEVICE_KINDS, Kind, SortKey
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
STAGES = ("summary", "steps", "tables", "timeline", "memory", "counters", "metrics", "tuning")


def report_data(run: Run, limits: ReportLimits = ReportLimits(), progress: Progress | None = None) -> dict[str, Any]:
    """Gather what the report shows.

    Args:
        run: the run.
        limits: how many rows, slices and points to keep.
        progress: called with each stage's name (:data:`STAGES`) as it starts.

    Returns:
        A dict of plain values (str, int, float, None, lists, dicts) with keys ``summary``,
        ``steps``, ``tables``, ``timeline``, ``memory``, ``counters``, ``metrics`` and ``tuning``.
        Times are nanoseconds; timeline and curve times are offsets from ``summary.t0_ns``.
    """
    report = progress or (lambda stage: None)
    report("summary")
    t0 = _origin(run)
    data: dict[str, Any] = {"summary": _summary(run, t0)}
    report("steps")
    data["steps"] = _steps(run, t0)
    report("tables")
    data["tables"] = _tables(run, limits.table_rows)
    report("timeline")
    data["timeline"] = timeline(run, t0, limits.timeline_slices)
    report("memory")
    data["memory"] = _memory(run, t0, limits.curve_points)
    report("counters")
    data["counters"] = _counters(run, t0, limits.curve_points)
    report("metrics")
    data["metrics"] = _metrics(run, limits.metric_rows)
    report("tuning")
    data["tuning"] = _tuning(run, limits.metric_rows)
    return data


def _origin(run: Run) -> int:
    """The time every offset in the report counts from: the earliest event, or the run's start."""
    starts = [int(run.slices["start_ns"].min())] if len(run.slices) else []
    for frame in (run.memory, run.counters):
        if len(frame):
            starts.append(int(frame["ts_ns"].min()))
    return min(starts) if starts else run.manifest.start_ns


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
        "kinds": {kind: int(n) for kind, n in run.slices["kind"].value_counts().items()},
    }


def _plain_dict(values: dict[str, Any]) -> dict[str, Any]:
    return {str(k): v if isinstance(v, str | int | float | bool) or v is None else str(v)
            for k, v in values.items()}


def _steps(run: Run, t0: int) -> dict[str, Any]:
    steps = cpu_steps(run)
    if steps.empty:
        return {"rows": [], "reason": "the run has no steps (ProfilerStep#N slices)"}
    rows = [[int(rank), str(name), int(start) - t0, int(end - start)]
            for rank, name, start, end in steps[["rank", "name", "start_ns", "end_ns"]].itertuples(
                index=False, name=None)]
    return {"columns": ["rank", "name", "start_ns", "dur_ns"], "rows": rows, "reason": ""}


def _tables(run: Run, limit: int) -> dict[str, Any]:
    present = set(kinds_present(run))
    tables: dict[str, Any] = {}
    for kind, title in TABLE_KINDS.items():
        if kind not in present:
            continue
        table = top(run, kind=kind, by=SortKey.MICROS, limit=limit)
        of_kind = run.slices[run.slices["kind"] == kind]
        tables[str(kind)] = {"title": title, "total": len(of_kind),
                             "groups": int(of_kind["name"].nunique()), **_records(table)}
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
    slices = run.slices
    if slices.empty:
        return {"tracks": [], "names": [], "kinds": [], "track": [], "start": [], "dur": [],
                "depth": [], "name": [], "kind": [], "shown": 0, "total": 0}
    on_device = slices["kind"].isin([str(k) for k in DEVICE_KINDS]) | (slices["device"] != "cpu")
    lane = slices["stream"].fillna(slices["tid"]).where(on_device, slices["tid"])
    keys = pd.DataFrame({
        "rank": slices["rank"].astype("int64"),
        "device": slices["device"].astype(str).where(on_device, "cpu"),
        "pid": slices["pid"].fillna(-1).astype("int64"),
        "lane": lane.fillna(-1).astype("int64"),
    })
    track = keys.groupby(["rank", "device", "pid", "lane"], sort=True).ngroup().to_numpy()
    frame = pd.DataFrame({
        "track": track,
        "start": slices["start_ns"].astype("int64").to_numpy() - t0,
        "dur": slices["dur_ns"].fillna(0).astype("int64").to_numpy(),
        "depth": slices["depth"].fillna(0).astype("int64").to_numpy(),
        "name": slices["name"].astype(str).to_numpy(),
        "kind": slices["kind"].astype(str).to_numpy(),
    })
    kept = frame[_keep(frame, budget)].sort_values(["track", "depth", "start"], kind="stable")
    base = kept.groupby("track")["depth"].min()
    depth = kept["depth"] - kept["track"].map(base)
    names, name_index = np.unique(kept["name"].to_numpy(), return_inverse=True)
    kinds, kind_index = np.unique(kept["kind"].to_numpy(), return_inverse=True)
    labels = keys.assign(track=track).drop_duplicates("track").sort_values("track")
    lanes = depth.groupby(kept["track"]).max()
    tracks = [
        {"label": _track_label(int(r), str(d), int(p), int(la), len(run.manifest.ranks) > 1),
         "rank": int(r), "device": str(d), "depth": int(lanes.get(t, 0)) + 1,
         "total": int((track == t).sum())}
        for t, r, d, p, la in labels[["track", "rank", "device", "pid", "lane"]].itertuples(
            index=False, name=None)
    ]
    return {
        "tracks": tracks,
        "names": [str(n) for n in names],
        "kinds": [str(k) for k in kinds],
        "track": kept["track"].tolist(),
        "start": kept["start"].tolist(),
        "dur": kept["dur"].tolist(),
        "depth": depth.tolist(),
        "name": name_index.tolist(),
        "kind": kind_index.tolist(),
        "shown": len(kept),
        "total": len(frame),
    }


def _keep(frame: pd.DataFrame, budget: int) -> np.ndarray:
    """Which slices the timeline keeps: every step, then each track's longest within its share."""
    is_step = np.asarray(frame["kind"] == Kind.STEP, dtype=bool)
    others = frame[~is_step]
    keep: np.ndarray = is_step.copy()
    if others.empty or budget <= 0:
        return keep
    sizes = others.groupby("track").size().sort_values()
    share: dict[int, int] = {}
    left, tracks_left = budget, len(sizes)
    for track_id, size in zip(sizes.index.tolist(), sizes.tolist(), strict=True):
        # Small tracks first: what they do not use goes to the others.
        share[int(track_id)] = take = min(int(size), left // tracks_left)
        left -= take
        tracks_left -= 1
    ordered = others.sort_values(["track", "dur", "start"], ascending=[True, False, True], kind="stable")
    position = ordered.groupby("track").cumcount().to_numpy()
    chosen = ordered.index[position < ordered["track"].map(share).to_numpy()]
    keep[frame.index.get_indexer(chosen)] = True
    return keep


def _track_label(rank: int, device: str, pid: int, lane: int, ranked: bool) -> str:
    prefix = f"rank {rank} · " if ranked else ""
    if device != "cpu":
        return f"{prefix}{device} stream {lane}"
    return f"{prefix}pid {pid} thread {lane}"


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


def _memory(run: Run, t0: int, points: int) -> dict[str, Any]:
    memory = run.memory
    if memory.empty:
        return {"series": [], "reason": "the run recorded no allocations"}
    series = []
    for (rank, device), group in memory.groupby(["rank", "device"], sort=True, observed=True):
        group = group.sort_values("ts_ns", kind="stable").dropna(subset=["total_allocated"])
        if group.empty:
            continue
        ts, values = downsample(group["ts_ns"].to_numpy(dtype="int64") - t0,
                                group["total_allocated"].to_numpy(dtype="float64"), points)
        series.append({"label": f"rank {rank} {device} allocated", "unit": "bytes", "ts": ts,
                       "values": values, "peak": float(group["total_allocated"].max())})
    return {"series": series, "reason": "" if series else "no allocation totals recorded"}


def _counters(run: Run, t0: int, points: int) -> dict[str, Any]:
    counters = run.counters
    if counters.empty:
        return {"series": [], "reason": "the run recorded no counters"}
    series = []
    columns = ["rank", "device", "track", "unit"]
    for (rank, device, track, unit), group in counters.fillna({"unit": ""}).groupby(
            columns, sort=True, observed=True):
        group = group.sort_values("ts_ns", kind="stable").dropna(subset=["value"])
        ts, values = downsample(group["ts_ns"].to_numpy(dtype="int64") - t0,
                                group["value"].to_numpy(dtype="float64"), points, how="mean")
        series.append({"label": f"{track} (rank {rank}, {device})", "unit": str(unit), "ts": ts,
                       "values": values})
    return {"series": series, "reason": ""}


def _metrics(run: Run, limit: int) -> dict[str, Any]:
    if run.metrics.empty and run.slices["flops"].isna().all():
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

