"""Tables for a terminal (rich), and the same tables as CSV or JSON for scripts.

A table is a pandas DataFrame or, where a command avoids loading pandas (``dlprof top``,
``dlprof ls``), :class:`dlprof.engine.rows.Rows`; both print alike.
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from dlprof.engine.rows import Rows
from dlprof.keys import TableFormat

if TYPE_CHECKING:
    import pandas as pd

_TIME_UNITS = ((1_000_000_000, "s"), (1_000_000, "ms"), (1_000, "us"), (1, "ns"))

# How each known column is shown: header, and whether it is a time, a percentage, a count.
_HEADERS = {
    "name": "Name",
    "input_shapes": "Input shapes",
    "calls": "Calls",
    "total_ns": "Total",
    "self_ns": "Self",
    "self_pct": "Self %",
    "cum_pct": "Cum %",
    "avg_ns": "Avg",
    "min_ns": "Min",
    "max_ns": "Max",
    "bytes": "Bytes",
    "flops": "FLOPs",
    "device_ns": "Device",
    "rank_min_ns": "Rank min",
    "rank_median_ns": "Rank median",
    "rank_max_ns": "Rank max",
    "max_rank": "Max rank",
}


def _missing(value: Any) -> bool:
    """None, NaN, or pandas' NA."""
    if value is None:
        return True
    try:
        return bool(value != value)  # NaN and pd.NA are not equal to themselves
    except TypeError:  # pd.NA's comparison has no truth value
        return True


def _values(values: Any) -> list[Any]:
    """A column as a list of Python values (a Series, an array or a list)."""
    return values.tolist() if hasattr(values, "tolist") else list(values)


def _time_unit(values: Sequence[Any]) -> tuple[int, str]:
    present = [abs(float(v)) for v in values if not _missing(v)]
    largest = max(present) if present else 0.0
    for scale, unit in _TIME_UNITS:
        if largest >= scale * 10:
            return scale, unit
    return 1, "ns"


def _count(value: float) -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.2f}{suffix}"
    return f"{int(value)}"


NAME_WIDTH = 90


def short_name(name: str, width: int = NAME_WIDTH) -> str:
    """A long C++ kernel name made readable: parameters, then template arguments, then the tail
    are dropped until it fits (tables for scripts keep the whole name)."""
    if len(name) <= width:
        return name
    if name.endswith(")") and "(" in name:
        name = name[: _matching_open(name, len(name) - 1, "(", ")")] + "(…)"
    if len(name) > width and "<" in name:
        name = _collapse(name, "<", ">")
    return name if len(name) <= width else name[: width - 1] + "…"


def _matching_open(text: str, close: int, opening: str, closing: str) -> int:
    depth = 0
    for index in range(close, -1, -1):
        if text[index] == closing:
            depth += 1
        elif text[index] == opening:
            depth -= 1
            if depth == 0:
                return index
    return close


def _collapse(text: str, opening: str, closing: str) -> str:
    """Replace every outermost bracketed part with an ellipsis: f<a<b>> -> f<…>."""
    out: list[str] = []
    depth = 0
    for char in text:
        if char == opening:
            if depth == 0:
                out.append(opening + "…")
            depth += 1
        elif char == closing and depth:
            depth -= 1
            if depth == 0:
                out.append(closing)
        elif depth == 0:
            out.append(char)
    return "".join(out)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def format_column(name: str, values: Any, header: str | None = None) -> tuple[str, list[str]]:
    """A column's header (``header`` or the column's usual one, with its unit) and its cells as
    text, in one unit per column."""
    header = header or _HEADERS.get(name, name)
    values = _values(values)
    if name.endswith("_ns"):
        scale, unit = _time_unit(values)
        return f"{header} ({unit})", [f"{v / scale:,.3f}" for v in values]
    if name.endswith("_pct"):
        return header, [f"{v:.2f}" for v in values]
    if name in ("bytes", "flops"):
        return header, ["" if not v else _count(v) for v in values]
    if name == "name":
        return header, [short_name(str(v)) for v in values]
    if ":" in name and values and all(_is_number(v) for v in values):
        # A metric column (perf:page-faults): exact counts read best with thousands separators.
        return header, [f"{int(v):,}" for v in values]
    return header, [str(v) for v in values]


def readable_columns(table: pd.DataFrame, keys: list[str], groups: list[list[tuple[str, str]]]) -> pd.DataFrame:
    """Chosen columns of an analysis table as text for a person, missing values as ``-``.

    Args:
        table: the analysis table.
        keys: columns shown as they are, headed by their capitalised name (``rank``, ``step``).
        groups: lists of (column, header); the times of one group share one unit, in the header.

    Returns:
        A frame of text cells, for :func:`write_table`.
    """
    import pandas as pd

    shown = {key.capitalize(): table[key].astype(str).tolist() for key in keys}
    for group in groups:
        stacked = pd.concat([table[column] for column, _ in group], ignore_index=True)
        # Missing cells are shown as "-" below; filled, they cannot upset the choice of unit.
        viewer_header, cells = format_column(group[0][0], stacked.fillna(0))
        unit = _unit(group[0][0], viewer_header)
        for i, (column, header) in enumerate(group):
            part = cells[i * len(table) : (i + 1) * len(table)]
            missing = table[column].isna().tolist()
            shown[f"{header}{unit}"] = ["-" if gone else cell for cell, gone in zip(part, missing, strict=True)]
    return pd.DataFrame(shown)


def _unit(column: str, viewer_header: str) -> str:
    """`` (ms)`` and the like for a time column, taken from the terminal viewer's header."""
    if not column.endswith("_ns"):
        return ""
    _, opened, unit = viewer_header.rpartition(" (")
    return f" ({unit}" if opened else ""


def _columns(frame: pd.DataFrame | Rows) -> tuple[list[str], dict[str, list[Any]]]:
    """A table's column names and each column's values as a list."""
    if isinstance(frame, Rows):
        return list(frame.columns), {c: frame.column(c) for c in frame.columns}
    names = [str(c) for c in frame.columns]
    return names, {str(c): frame[c].tolist() for c in frame.columns}


def render_table(frame: pd.DataFrame | Rows, title: str, out: TextIO | None = None) -> None:
    """Print a table as an aligned table with a title."""
    stream = out or sys.stdout
    # Off a terminal (a pipe, a file) nothing limits the width: keep names whole.
    width = None if stream.isatty() else 220
    console = Console(file=stream, width=width, highlight=False)
    table = Table(title=Text(title), title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)
    cells: list[list[str]] = []
    names, columns = _columns(frame)
    for column in names:
        header, values = format_column(column, columns[column])
        numeric = column not in ("name", "input_shapes")
        if numeric:
            table.add_column(Text(header), justify="right", no_wrap=True)
        else:
            table.add_column(Text(header), justify="left", overflow="fold", ratio=1, min_width=24)
        cells.append(values)
    for row in zip(*cells, strict=True):
        # Text, not str: a name such as "[/]" or "[red]" is shown as written, never as markup.
        table.add_row(*(Text(cell) for cell in row))
    console.print(table)


def write_table(frame: pd.DataFrame | Rows, title: str, fmt: TableFormat, out: TextIO | None = None) -> None:
    """Print ``frame`` in the chosen format: a table for a person, CSV or JSON for a script."""
    stream = out or sys.stdout
    if fmt is TableFormat.TABLE:
        render_table(frame, title, stream)
    elif isinstance(frame, Rows):
        _write_rows(frame, fmt, stream)
    elif fmt is TableFormat.CSV:
        buffer = io.StringIO()
        frame.to_csv(buffer, index=False)
        stream.write(buffer.getvalue())
    else:
        records = json.loads(frame.to_json(orient="records"))
        stream.write(json.dumps(records, indent=1) + "\n")


def _plain(value: Any) -> Any:
    """A cell as JSON or CSV writes it: missing values as null (empty in CSV)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _write_rows(rows: Rows, fmt: TableFormat, stream: TextIO) -> None:
    """CSV or JSON of plain rows, laid out as pandas writes a DataFrame's."""
    if fmt is TableFormat.CSV:
        writer = csv.writer(stream, lineterminator="\n")
        writer.writerow(rows.columns)
        writer.writerows([["" if _plain(v) is None else v for v in row] for row in rows])
    else:
        records = [{k: _plain(v) for k, v in record.items()} for record in rows.records()]
        stream.write(json.dumps(records, indent=1) + "\n")


_SIZE_UNITS = ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"), (1, "B"))


def size_unit(values: Sequence[Any]) -> tuple[int, str]:
    """The one unit a set of byte counts reads best in: the largest that keeps the biggest >= 1."""
    present = [abs(float(v)) for v in values if not _missing(v)]
    largest = max(present) if present else 0.0
    return next(((scale, unit) for scale, unit in _SIZE_UNITS if largest >= scale), (1, "B"))


def format_sizes(values: Sequence[Any], scale: int) -> list[str]:
    """Byte counts in one unit (:func:`size_unit`'s scale), missing ones as ``-``."""
    if scale == 1:
        return ["-" if _missing(v) else f"{int(v):,}" for v in values]
    return ["-" if _missing(v) else f"{float(v) / scale:,.2f}" for v in values]
