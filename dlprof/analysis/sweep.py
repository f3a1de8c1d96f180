"""A swept model's run as one point on the roofline: what ``dlprof sweep`` tabulates and plots.

    figures = point_figures(dlprof.load("sweep/fc-l2-w64-b16-i32"))
    figures.flops, figures.step_ns, figures.flop_rate, figures.roof_pct

FLOPs and bytes per step are the run's work items (ops with FLOPs on a CPU, device slices on a
GPU; :mod:`dlprof.analysis.work_items`) over its recorded steps. The achieved rate is FLOPs per
step over the median step time, so everything else a step does (elementwise ops without a FLOP
formula, the optimizer, the framework) counts against it; the roof is the device's at the
step's intensity in the math mode that took the most time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dlprof.analysis.math_modes import MathMode
from dlprof.analysis.roofline import RooflineKey, chart_values, roof, roofline
from dlprof.analysis.steps import step_report
from dlprof.hardware.devices import Device
from dlprof.store.reader import Run

FIGURE_COLUMNS = ["step_ns", "steps", "flops", "bytes", "intensity", "flop_rate", "roof_pct", "bound",
                  "mode", "coverage"]


@dataclass(frozen=True)
class PointFigures:
    """One run's step on the roofline."""

    step_ns: float  # median over the counted steps
    steps: int  # steps recorded (the FLOPs are divided among them)
    flops: float  # per step
    bytes: float  # per step, compulsory traffic of the ops with FLOPs
    intensity: float  # FLOPs per byte
    flop_rate: float  # achieved: flops / step time
    roof_pct: float  # flop_rate over the roof at this intensity
    bound: str  # memory or compute ('' when the device has no peak for the mode)
    mode: str  # the math mode that took the most time
    coverage: float  # share of op (or device) time with known FLOPs
    device: Device

    def row(self) -> dict[str, object]:
        """The figures as a table row (:data:`FIGURE_COLUMNS`)."""
        return {column: getattr(self, column) for column in FIGURE_COLUMNS}


def point_figures(run: Run, device_name: str | None = None) -> PointFigures:
    """A run's step time, FLOPs, intensity, achieved rate and place under the roof.

    Args:
        run: a run whose steps are the same training step (a sweep point's).
        device_name: the device to measure against (default: the run's own, resolved).

    Returns:
        The figures; FLOPs and rates are NaN when no op has FLOPs.

    Raises:
        UnknownDevice: no device row fits.
    """
    found = roofline(run, RooflineKey.OP, device_name)
    report = step_report(run)
    counted = report.statistics
    step_ns = float(counted["median_ns"].iloc[0]) if len(counted) and counted["steps"].iloc[0] else np.nan
    steps = len(report.steps)
    table = found.table
    with_flops = table[table["flops"].notna()]
    flops = float(with_flops["flops"].sum()) / steps if steps and len(with_flops) else np.nan
    moved = float(with_flops["bytes"].sum()) / steps if steps and with_flops["bytes"].notna().any() else np.nan
    intensity = flops / moved if moved and moved > 0 else np.nan
    rate = flops / (step_ns / 1e9) if step_ns > 0 else np.nan
    label = str(table.loc[table["time_ns"].idxmax(), "mode"]) if len(table) else "fp32"
    attainable, bound = roof(MathMode.from_label(label), found.device, intensity) if intensity == intensity \
        else (None, None)
    return PointFigures(step_ns=step_ns, steps=steps, flops=flops, bytes=moved, intensity=intensity,
                        flop_rate=rate, roof_pct=100 * rate / attainable if attainable else np.nan,
                        bound=str(bound) if bound else "", mode=label, coverage=found.coverage,
                        device=found.device)


def sweep_chart(names: list[str], figures: list[PointFigures]) -> dict[str, object]:
    """The roofline plot of a sweep: one point per model, against the first point's device.

    Args:
        names: each point's name.
        figures: each point's figures, in the same order.

    Returns:
        The chart's values as :func:`dlprof.analysis.roofline.chart_values` gives them.
    """
    points: list[dict[str, object]] = [
        {"name": name, "intensity": f.intensity, "flop_rate": f.flop_rate, "time_ns": int(f.step_ns),
         "bound": f.bound, "mode": f.mode}
        for name, f in zip(names, figures, strict=True)
        if f.intensity == f.intensity and f.flop_rate == f.flop_rate and f.flop_rate > 0]
    coverage = float(np.mean([f.coverage for f in figures])) if figures else 0.0
    device = figures[0].device if figures else None
    if device is None:
        return {"points": [], "reason": "no models"}
    return chart_values(device, points, coverage, "no model with both FLOPs and bytes known")
