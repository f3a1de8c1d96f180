"""The roofline: each op, kernel or layer against what its device could do at its intensity.

    found = roofline(run, RooflineKey.OP)
    found.table      # name, flops, bytes, time_ns, intensity, flop_rate, byte_rate, bound, roof_pct...
    found.coverage   # the share of device time whose FLOPs are known

A row's roof is min(peak, bandwidth x intensity) (Williams, Waterman and Patterson's roofline):
the peak of the row's math mode (:mod:`dlprof.analysis.math_modes`) and the device's memory
bandwidth. A row is memory-bound when its intensity lies below the ridge point (peak /
bandwidth), compute-bound above it, and its percent of roof is its achieved FLOP/s over that
roof. Only the time of items with known FLOPs enters a row's rates.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import pandas as pd

from dlprof.analysis.math_modes import MathMode
from dlprof.analysis.run_device import run_device
from dlprof.analysis.work_items import Source, WorkItems, work_items
from dlprof.hardware.devices import Device
from dlprof.store.reader import Run

ROOFLINE_COLUMNS = ["name", "shapes", "calls", "time_ns", "flops", "bytes", "intensity", "flop_rate",
                    "byte_rate", "bound", "roof_pct", "mode", "flops_source", "bytes_source"]


class RooflineKey(StrEnum):
    """``dlprof roofline --by``: what one row gathers."""

    OP = "op"  # the op and its input shapes
    KERNEL = "kernel"
    LAYER = "layer"  # the innermost module around the op


class Bound(StrEnum):
    """What limits a row at its intensity."""

    MEMORY = "memory"
    COMPUTE = "compute"


@dataclass(frozen=True)
class Roofline:
    """A run's roofline rows, the device they are measured against, and their coverage."""

    table: pd.DataFrame  # ROOFLINE_COLUMNS, by time
    device: Device
    known_ns: int  # time of items with known FLOPs
    total_ns: int  # all device time (GPU), or all ops' self time (CPU)

    @property
    def coverage(self) -> float:
        return self.known_ns / self.total_ns if self.total_ns else 0.0


def roof(mode: MathMode, device: Device, intensity: float) -> tuple[float | None, Bound | None]:
    """The attainable FLOP/s at ``intensity`` in ``mode`` on ``device``, and what bounds it.

    Args:
        mode: the math mode, which picks the peak.
        device: the device row.
        intensity: FLOPs per byte.

    Returns:
        (roof, bound), or (None, None) when the device has no peak for the mode.
    """
    peak = mode.peak(device)
    if not peak or not device.memory_bandwidth:
        return None, None
    by_memory = device.memory_bandwidth * intensity
    return (by_memory, Bound.MEMORY) if by_memory < peak else (peak, Bound.COMPUTE)


def _keys(key: RooflineKey) -> list[str]:
    return {RooflineKey.OP: ["op_name", "input_shapes"], RooflineKey.KERNEL: ["name"],
            RooflineKey.LAYER: ["layer"]}[key]


def _source(values: pd.Series) -> str:
    known = sorted(set(values) - {str(Source.NONE)})
    return "+".join(known) if known else str(Source.NONE)


def roofline_rows(items: WorkItems, key: RooflineKey, device: Device) -> pd.DataFrame:
    """Group work items into roofline rows (a pure function of the items, for tests and reports).

    Args:
        items: the run's work items.
        key: what one row gathers.
        device: the device whose roof the rows are measured against.

    Returns:
        A frame of :data:`ROOFLINE_COLUMNS`, the longest first.
    """
    table = items.table.dropna(subset=["time_ns"])
    keys = _keys(key)
    table = table.dropna(subset=keys[:1]).copy()
    table["input_shapes"] = table["input_shapes"].fillna("")
    table["known_ns"] = table["time_ns"].where(table["flops"].notna(), 0)
    rows = []
    for group, part in table.groupby(keys, sort=False):
        values = group if isinstance(group, tuple) else (group,)
        mode: MathMode = part.loc[part["time_ns"].astype("float64").idxmax(), "mode"]
        with_flops = part[part["flops"].notna()]
        flops = float(with_flops["flops"].sum()) if len(with_flops) else np.nan
        moved = float(with_flops["bytes"].sum()) if with_flops["bytes"].notna().any() else np.nan
        known = float(with_flops["time_ns"].sum())
        intensity = flops / moved if moved and moved > 0 else np.nan
        rate = flops / (known / 1e9) if known > 0 else np.nan
        attainable, bound = roof(mode, device, intensity) if intensity == intensity else (None, None)
        rows.append({
            "name": str(values[0]), "shapes": str(values[1]) if len(values) > 1 else "",
            "calls": int(part["op_id"].nunique()) if key is not RooflineKey.KERNEL else len(part),
            "time_ns": int(part["time_ns"].sum()), "flops": flops, "bytes": moved, "intensity": intensity,
            "flop_rate": rate, "byte_rate": moved / (known / 1e9) if known > 0 else np.nan,
            "bound": str(bound) if bound else "", "roof_pct": 100 * rate / attainable if attainable else np.nan,
            "mode": mode.label, "flops_source": _source(part["flops_source"]),
            "bytes_source": _source(with_flops["bytes_source"]) if len(with_flops) else str(Source.NONE),
        })
    frame = pd.DataFrame(rows, columns=ROOFLINE_COLUMNS)
    return frame.sort_values(["time_ns", "name"], ascending=[False, True], ignore_index=True)


def roofline(run: Run, key: RooflineKey = RooflineKey.OP, device_name: str | None = None,
             rank: int | None = None) -> Roofline:
    """A run's roofline.

    Args:
        run: the loaded run.
        key: one row per op and input shapes, per kernel, or per layer.
        device_name: the device to measure against (default: the run's own, resolved).
        rank: only this rank.

    Returns:
        The rows, the device and the coverage.

    Raises:
        UnknownDevice: no device row fits (the message names ``--device``).
        ValueError: ``--by layer`` on a run with no layers.
    """
    device = run_device(run, device_name, rank)
    items = work_items(run, rank, with_layers=key is RooflineKey.LAYER)
    if key is RooflineKey.LAYER and items.table["layer"].isna().all():
        raise ValueError(f"{run.path}: no work inside a layer (module) slice; profile with the layers "
                         "collector, or use --by op or --by kernel")
    known = items.table["time_ns"].where(items.table["flops"].notna(), 0).fillna(0).sum()
    return Roofline(roofline_rows(items, key, device), device, int(known), items.total_ns)


def roofline_chart(run: Run, limit: int) -> dict[str, object]:
    """What the HTML report's roofline plot draws, as plain values.

    Args:
        run: the loaded run.
        limit: the most points (the longest rows).

    Returns:
        ``device``, ``bandwidth`` (bytes/s), ``peaks`` (mode label -> FLOP/s, the modes plotted),
        ``coverage``, ``points`` (``name``, ``intensity``, ``flop_rate``, ``time_ns``, ``bound``,
        ``mode``) and ``reason`` (why there is no plot; empty when there is one).
    """
    try:
        found = roofline(run, RooflineKey.OP)
    except ValueError as error:  # no device row fits
        return {"points": [], "reason": str(error)}
    placed = found.table.dropna(subset=["intensity", "flop_rate"]).head(limit)
    points = [{"name": f"{r.name} {r.shapes}".strip(), "intensity": float(r.intensity),
               "flop_rate": float(r.flop_rate), "time_ns": int(r.time_ns), "bound": r.bound, "mode": r.mode}
              for r in placed.itertuples(index=False)]
    return chart_values(found.device, points, found.coverage,
                        "no op with both FLOPs and bytes known to place on the roofline")


def chart_values(device: Device, points: list[dict[str, object]], coverage: float, empty: str) -> dict[str, object]:
    """A roofline plot's values (as :func:`roofline_chart` gives them) for any points: ops of a
    run, or the models of a sweep.

    Args:
        device: the device whose roofs are drawn.
        points: ``name``, ``intensity``, ``flop_rate``, ``time_ns``, ``bound`` and ``mode`` each.
        coverage: the share of time whose FLOPs are known.
        empty: the reason given when there are no points.

    Returns:
        The chart's values; one roof per math mode of the points that has a peak on the device.
    """
    peaks = {str(label): MathMode.from_label(str(label)).peak(device) for label in dict.fromkeys(p["mode"] for p in points)}
    return {"device": device.name, "bandwidth": device.memory_bandwidth,
            "peaks": {label: peak for label, peak in peaks.items() if peak},
            "coverage": coverage, "points": points, "reason": "" if points else empty}
