"""The HTML report: one self-contained file, data as JSON and the page's CSS and script inlined.

    html = render_report(report_data(run))
    Path("report.html").write_text(html, encoding="utf-8")

As pyinstrument's HTML renderer does, the page is a small script (``html_resources/report.js``)
over a JSON document; nothing is fetched, and a Content-Security-Policy forbids every request, so
the file works offline and cannot leak anything. Names from the run reach the page only inside
the JSON (with ``<``, ``>`` and ``&`` escaped, so no name can close the script element) and are
shown with ``textContent``: an op named ``<script>`` is text. Table cells are formatted here, with
the terminal tables' units, so the page reads as ``dlprof top`` does.
"""

from __future__ import annotations

import base64
import hashlib
import html
import math
from importlib import resources
from typing import Any

import orjson
import pandas as pd

from dlprof.viewers.names import readable, signatures_shortened
from dlprof.viewers.terminal import format_column, format_sizes, human_header, size_unit

# Columns shown as text (left-aligned, sorted as strings); every other column is a number.
_TEXT_COLUMNS = frozenset({"name", "input_shapes", "kind", "reasons", "device", "step", "op", "source", "window",
                           "status", "part"})
# C++ signatures in the advice are cut to this (the page wraps the text around them).
ADVICE_NAME_WIDTH = 100
# The units shown in the headers of the report's energy table.
_ENERGY_UNITS = {"joules_per_step": "J", "watts": "W"}


def _resource(name: str) -> str:
    return (resources.files("dlprof.viewers") / "html_resources" / name).read_text(encoding="utf-8")


def script_json(value: Any) -> str:
    """``value`` as JSON that is safe inside a ``<script>`` element.

    ``<``, ``>`` and ``&`` only occur inside JSON strings, where ``\\u003c`` means the same
    character: with them escaped no ``</script>`` or ``<!--`` can appear in the element.

    Args:
        value: plain data (NaN is written as null).

    Returns:
        The JSON text.
    """
    text = orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY).decode("utf-8")
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _number(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
            if abs(value) >= scale:
                return f"{value / scale:.4g}{prefix}"
        return f"{value:.4g}"
    return str(value)


def table_spec(columns: list[str], rows: list[list[Any]], units: dict[str, str] | None = None) -> dict[str, Any]:
    """A table as the page shows it: headers, and per row the cells' text and sort values.

    Time, percentage, byte and FLOP columns are formatted as ``dlprof top`` prints them (one
    unit per column); names are kept whole; lists are joined with "; ".

    Args:
        columns: the column names, as :func:`dlprof.analysis.report_data.report_data` gives them.
        rows: the raw values, one list per row.
        units: a unit to show in the header of some columns.

    Returns:
        ``columns`` (key, header, numeric) and ``rows`` (text, sort).
    """
    frame = pd.DataFrame(rows, columns=columns)
    shown: list[dict[str, Any]] = []
    texts: list[list[str]] = []
    for column in columns:
        values = frame[column]
        numeric = column not in _TEXT_COLUMNS
        if column == "name":
            header, cells = "Name", [str(v) for v in values]
        elif column == "reasons":
            header, cells = "Reasons", ["; ".join(v) if isinstance(v, list) else str(v) for v in values]
        elif column in ("calls", "rank") or column.endswith(("_ns", "_pct")) or column in ("bytes", "flops"):
            header, cells = format_column(column, values.fillna(0))
        elif column.endswith("_bytes"):  # sizes in the unit that suits the column, as dlprof memory's
            scale, unit = size_unit(values.tolist())
            header, cells = f"{column.removesuffix('_bytes').replace('_', ' ').capitalize()} ({unit})", \
                format_sizes(values.tolist(), scale)
        elif numeric:
            header, cells = human_header(column), [_number(v) for v in values]
        else:
            header, cells = human_header(column), ["" if v is None else str(v) for v in values]
        if units and units.get(column):
            header = f"{header} ({units[column]})"
        shown.append({"key": column, "header": header, "numeric": numeric})
        texts.append(cells)
    body = [
        {"text": [texts[c][r] for c in range(len(columns))],
         "sort": [_sort_value(row[c]) for c in range(len(columns))]}
        for r, row in enumerate(rows)
    ]
    return {"columns": shown, "rows": body}


def _sort_value(value: Any) -> Any:
    if isinstance(value, list):
        return "; ".join(str(v) for v in value)
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def page_data(data: dict[str, Any]) -> dict[str, Any]:
    """``report_data``'s dict with its tables turned into :func:`table_spec`'s shape."""
    page = dict(data)
    page["tables"] = {
        kind: {"title": t["title"], "total": t["total"], "groups": t["groups"], "by": t["by"],
               **table_spec(t["columns"], t["rows"])}
        for kind, t in data["tables"].items()
    }
    memory = data["memory"]
    page["memory"] = {**memory, **{part: table_spec(memory[part]["columns"], memory[part]["rows"])
                                   for part in ("peaks", "live") if part in memory}}
    steps = data["steps"]
    if steps["rows"]:
        energy = steps["energy"]
        page["steps"] = {**steps, "statistics": table_spec(**steps["statistics"]),
                         "breakdown": table_spec(**steps["breakdown"]),
                         "device_breakdown": table_spec(**steps["device_breakdown"]),
                         "energy": {**energy, **table_spec(energy["columns"], energy["rows"], _ENERGY_UNITS)}}
    metrics = data["metrics"]
    page["metrics"] = {"reason": metrics["reason"],
                       "intro": _unavailable(metrics["unavailable"]) if metrics["rows"] else "",
                       **table_spec(metrics["columns"], metrics["rows"], metrics["units"])}
    if metrics["reason"] and metrics["unavailable"]:
        page["metrics"]["reason"] += ": " + _unavailable(metrics["unavailable"])
    page["gpu"] = _gpu_page(data["gpu"])
    page["advice"] = _advice_page(data["advice"])
    tuning = data["tuning"]
    intro = {"counters": "Score: (metric per instruction) x exclusive ms.",
             "launch": "No per-kernel counters: score = exclusive ms x launch-configuration signals."}
    page["tuning"] = {"reason": tuning["reason"], "intro": intro.get(tuning["basis"], ""),
                      **table_spec(tuning["columns"], tuning["rows"])}
    return page


def _gpu_page(gpu: dict[str, Any]) -> dict[str, Any]:
    """The GPU overview's tables as the page shows them: kernels by readable names (the whole
    name in the Kernels table), steps with their status."""
    kernels = gpu["kernels"]
    readable_rows = [[readable(str(row[0])), *row[1:]] for row in kernels["rows"]]
    return {**gpu, "kernels": table_spec(kernels["columns"], readable_rows),
            "device_table": table_spec(gpu["devices"]["columns"], gpu["devices"]["rows"])}


def _advice_page(advice: dict[str, Any]) -> dict[str, Any]:
    """The findings with their C++ signatures shortened, as ``dlprof advise`` prints them."""
    def short(text: str) -> str:
        return signatures_shortened(text, ADVICE_NAME_WIDTH)

    findings = [{**f, "summary": short(f["summary"]),
                 "evidence": [{"place": short(e["place"]), "detail": short(e["detail"])} for e in f["evidence"]]}
                for f in advice["findings"]]
    return {**advice, "findings": findings}


def _unavailable(reasons: dict[str, str]) -> str:
    return "; ".join(f"{name}: {why}" for name, why in reasons.items())


def render_report(data: dict[str, Any]) -> str:
    """The report page for ``report_data``'s dict.

    Args:
        data: what :func:`dlprof.analysis.report_data.report_data` returns.

    Returns:
        One HTML document that needs nothing else.
    """
    script = _resource("report.js")
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    policy = ("default-src 'none'; "
              f"script-src 'sha256-{digest}'; style-src 'unsafe-inline'; img-src data:; "
              "base-uri 'none'; form-action 'none'")
    summary = data["summary"]
    title = html.escape(f"dlprof report: {summary['name']} ({summary['status']})")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{policy}\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>{title}</title>\n<style>\n{_resource('report.css')}</style>\n</head>\n<body>\n"
        f"<header><h1>{title}</h1></header>\n<main id=\"report\"></main>\n"
        "<noscript><p>This report draws itself with JavaScript; enable it to read the report."
        "</p></noscript>\n"
        f"<script type=\"application/json\" id=\"report-data\">{script_json(page_data(data))}</script>\n"
        f"<script>{script}</script>\n</body>\n</html>\n"
    )
