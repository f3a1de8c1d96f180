"""A roofline plot as a standalone SVG document, from the values
:func:`dlprof.analysis.roofline.chart_values` gives (the HTML report draws the same values, with
the same geometry, in its script).

    write_text(path, roofline_svg(sweep_chart(names, figures), "models (area: step time)"))

Log-log: FLOPs per byte against FLOP/s; one roof per math mode (min(peak, bandwidth x
intensity)); one dot per point, its area by time, red when compute-bound, blue when memory-bound.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any
from xml.etree import ElementTree

WIDTH, HEIGHT, LEFT, BOTTOM = 640, 360, 60, 40
_SVG = "http://www.w3.org/2000/svg"


def _element(parent: ElementTree.Element, tag: str, text: str = "", **attributes: object) -> ElementTree.Element:
    child = ElementTree.SubElement(parent, tag, {k.replace("_", "-"): str(v) for k, v in attributes.items()})
    child.text = text or None
    return child


def roofline_svg(chart: Mapping[str, Any], what: str = "ops (area: time)") -> str:
    """The chart as an SVG document (text); a document with the chart's reason when it has no points.

    Args:
        chart: ``device``, ``bandwidth``, ``peaks``, ``coverage``, ``points`` and ``reason``.
        what: what the dots are, for the caption.

    Returns:
        The SVG, one ``circle`` per point (``data-testid="roofline-point"``, a ``title`` naming it).
    """
    svg = ElementTree.Element("svg", {"xmlns": _SVG, "viewBox": f"0 0 {WIDTH} {HEIGHT + 20}",
                                      "width": str(WIDTH), "height": str(HEIGHT + 20),
                                      "font-family": "sans-serif", "data-testid": "roofline-plot"})
    points = list(chart.get("points", []))
    if not points:
        _element(svg, "text", str(chart.get("reason") or "nothing to plot"), x=10, y=20, font_size=12)
        return ElementTree.tostring(svg, encoding="unicode")
    bandwidth = float(chart["bandwidth"])
    peaks = {str(mode): float(peak) for mode, peak in dict(chart["peaks"]).items()}
    xs = [float(p["intensity"]) for p in points]
    ys = [float(p["flop_rate"]) for p in points]
    ridge = max([peak / bandwidth for peak in peaks.values()] + [1.0])
    x0 = math.floor(math.log10(min([*xs, ridge / 100])))
    x1 = math.ceil(math.log10(max([*xs, ridge * 10])))
    y0 = math.floor(math.log10(min(ys)))
    y1 = max(math.ceil(math.log10(max([*ys, *peaks.values()]))), y0 + 1)

    def px(value: float) -> float:
        return round(LEFT + (math.log10(value) - x0) / (x1 - x0) * (WIDTH - LEFT - 10), 2)

    def py(value: float) -> float:
        return round(HEIGHT - BOTTOM - (math.log10(value) - y0) / (y1 - y0) * (HEIGHT - BOTTOM - 10), 2)

    _element(svg, "text", f"{chart['device']}: {100 * float(chart['coverage']):.1f}% of time has known FLOPs; "
             f"dots are {what}, lines the roof of each math mode", x=LEFT, y=HEIGHT + 14, font_size=10)
    for e in range(x0, x1 + 1):
        _element(svg, "text", f"1e{e}", x=px(10.0 ** e), y=HEIGHT - BOTTOM + 16, text_anchor="middle", font_size=10)
    for f in range(y0, y1 + 1):
        _element(svg, "text", f"1e{f}", x=LEFT - 4, y=py(10.0 ** f) + 3, text_anchor="end", font_size=10)
    _element(svg, "text", "FLOPs per byte", x=(LEFT + WIDTH) / 2, y=HEIGHT - 6, text_anchor="middle", font_size=11)
    _element(svg, "text", "FLOP/s", x=12, y=HEIGHT / 2, font_size=11, transform=f"rotate(-90 12 {HEIGHT / 2})",
             text_anchor="middle")
    left, right = 10.0 ** x0, 10.0 ** x1
    for mode, peak in peaks.items():
        knee = peak / bandwidth
        start = max(left, 10.0 ** y0 / bandwidth)
        corners = [(start, start * bandwidth), (knee, peak), (right, peak)]
        _element(svg, "polyline", fill="none", stroke="#555", stroke_width=1.5, data_testid="roof",
                 points=" ".join(f"{px(x)},{py(y)}" for x, y in corners))
        _element(svg, "text", mode, x=WIDTH - 12, y=py(peak) - 4, text_anchor="end", font_size=10)
    longest = max(int(p["time_ns"]) for p in points) or 1
    for point in points:
        dot = _element(svg, "circle", cx=px(float(point["intensity"])), cy=py(float(point["flop_rate"])),
                       r=round(2 + 8 * math.sqrt(int(point["time_ns"]) / longest), 2),
                       fill="#c0392b" if point["bound"] == "compute" else "#2c7fb8", fill_opacity=0.6,
                       data_testid="roofline-point")
        _element(dot, "title", f"{point['name']}: {point['mode']}, {point['bound'] or 'unknown'}-bound, "
                 f"{int(point['time_ns']) / 1e6:.3g} ms")
    return ElementTree.tostring(svg, encoding="unicode")
