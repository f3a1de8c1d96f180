"""Tables for a terminal (rich), and the same tables as CSV or JSON for scripts.

A table is a pandas DataFrame or, where a command avoids loading pandas (``dlprof top``,
``dlprof ls``), :class:`dlprof.engine.rows.Rows`; both print alike.

For a person (:func:`render_table`): every time column of a table shares one unit, chosen from
the sort column's values (else the first time column's), named in each header; counters that
count nanoseconds join it, others are counts. The table fits the terminal
(:mod:`dlprof.viewers.fit`: the name and the sort column stay, lesser columns go first and are
named under the table, ``--wide`` shows all) and every string from the data is made printable
(:mod:`dlprof.viewers.screen`). CSV and JSON keep every column and the true names, control
characters included: they are data for scripts (JSON escapes them; CSV writes them as they are,
so a CSV shown on a terminal should go through ``cat -v`` or a spreadsheet).
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TextIO

from dlprof.engine.rows import Rows
from dlprof.keys import NANOSECOND_COUNTERS, TableFormat
from dlprof.viewers.fit import Column, print_columns
from dlprof.viewers.names import distinct_names

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
    "self_device_ns": "Self device",
    "time_ns": "Time",
    "source_ns": "Source",
    "target_ns": "Target",
    "rank_min_ns": "Rank min",
    "rank_median_ns": "Rank median",
    "rank_max_ns": "Rank max",
    "max_rank": "Max rank",
    "gpu_ns": "GPU time",
    "kernel_ns": "Kernels",
    "copy_ns": "Copies",
    "idle_ns": "Idle",
    "span_ns": "Span",
    "busy_pct": "Busy %",
    "kernel_pct": "Of kernel time %",
}

# Which columns a table narrower than its content keeps, after the name, the sort column and
# the columns a command names: the most useful first (top's, then ls's by their headers).
# Columns not listed follow in table order.
_KEEP_ORDER = (
    "name", "input_shapes", "total_ns", "device_ns", "self_ns", "calls", "self_device_ns", "self_pct", "avg_ns",
    "cum_pct",
    "max_ns", "min_ns", "bytes", "flops", "rank_median_ns", "rank_max_ns", "max_rank", "rank_min_ns",
    "Status", "Started", "Duration", "Script", "Events", "Size",
)
# Left-aligned text, shortened to fit: names, shapes, paths.
_TEXT_COLUMNS = frozenset({"name", "input_shapes", "Script", "Latest arrival", "step", "Step", "Op at peak"})
# Columns of sentences: their cells wrap onto more lines rather than being cut.
_PROSE_COLUMNS = frozenset({"reason", "Reason", "Why", "fix", "Fix", "Finding"})


class TimeUnit(NamedTuple):
    """The unit of a table's time columns: nanoseconds per unit, and its symbol."""

    scale: int
    symbol: str


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


def time_unit(values: Sequence[Any]) -> TimeUnit:
    """The unit a column of times reads best in: the one that shows a typical value as 10 or
    more, at most seconds, so that one outlier (a 22 s warm-up step among 56 ms ones) does not
    turn the whole column into seconds; a unit larger still where the largest would need more
    than six digits before the point.

    Args:
        values: times in nanoseconds; missing ones are ignored.

    Returns:
        The unit: 38 ms typical gives ms (38.091), 7.9 ms gives us (7,923.444), 56 ms with one
        22 s value gives ms (22,289.864 for the outlier).
    """
    present = sorted(abs(float(v)) for v in values if not _missing(v))
    nonzero = [v for v in present if v > 0]
    # The upper quartile: a table sorted by time holds its largest rows first, and those set the
    # unit unless they are a few outliers.
    typical = nonzero[min(len(nonzero) - 1, (3 * len(nonzero)) // 4)] if nonzero else 0.0
    largest = present[-1] if present else 0.0
    position = next((i for i, (scale, _) in enumerate(_TIME_UNITS) if typical >= scale * 10), len(_TIME_UNITS) - 1)
    while position > 0 and largest >= _TIME_UNITS[position][0] * 1e6:
        position -= 1
    return TimeUnit(*_TIME_UNITS[position])


def format_time(ns: float, unit: TimeUnit) -> str:
    """A time in ``unit`` with three decimals and thousands separators, without the unit."""
    return f"{ns / unit.scale:,.3f}"


def time_text(ns: float, unit: TimeUnit | None = None) -> str:
    """A time with its unit (``12.865 ms``, ``9.245 ms``), in ``unit`` or in the largest that
    shows it as 1 or more."""
    chosen = unit or next((TimeUnit(scale, symbol) for scale, symbol in _TIME_UNITS if abs(ns) >= scale),
                          TimeUnit(1, "ns"))
    return f"{format_time(ns, chosen)} {chosen.symbol}"


def is_time_column(name: str) -> bool:
    """Whether a column holds nanoseconds: ``*_ns`` columns and clock counters."""
    return name.endswith("_ns") or name in NANOSECOND_COUNTERS


def _count(value: float) -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.2f}{suffix}"
    return f"{int(value)}"


def human_header(column: str) -> str:
    """A column's name as a header: ``mean_ns`` reads ``Mean``, ``step_pct`` ``Step %``,
    ``data_wait_ns`` ``Data wait``; counters (``perf:page-faults``) and headers already made
    for a person are kept."""
    if ":" in column or " " in column or not column.replace("_", "").isalnum():
        return column
    words = column.removesuffix("_ns").removesuffix("_pct").replace("_", " ").strip()
    words = words[:1].upper() + words[1:]
    return f"{words} %" if column.endswith("_pct") else words


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def format_column(name: str, values: Any, header: str | None = None,
                  unit: TimeUnit | None = None) -> tuple[str, list[str]]:
    """A column's header (``header`` or the column's usual one, with its unit) and its cells as
    text, in one unit per column.

    Args:
        name: the analysis column (``total_ns``, ``perf:page-faults``...).
        values: its values.
        header: the header to show instead of the column's usual one.
        unit: the unit of a time column (by default, the one that suits its values).

    Returns:
        The header and the cells.
    """
    header = header or _HEADERS.get(name) or human_header(name)
    values = _values(values)
    if is_time_column(name):
        unit = unit or time_unit(values)
        return f"{header} ({unit.symbol})", [format_time(v, unit) for v in values]
    if name.endswith("_pct"):
        return header, [f"{v:.2f}" for v in values]
    if name in ("bytes", "flops"):
        return header, ["" if not v else _count(v) for v in values]
    if ":" in name and values and all(_is_number(v) for v in values):
        # A counter metric (perf:page-faults): exact counts read best with thousands separators.
        return f"{header} (count)", [f"{int(v):,}" for v in values]
    return header, [str(v) for v in values]


def readable_columns(table: pd.DataFrame, keys: list[str], groups: list[list[tuple[str, str]]]) -> pd.DataFrame:
    """Chosen columns of an analysis table as text for a person, missing values as ``-``.

    Args:
        table: the analysis table.
        keys: columns shown as they are, headed by their capitalised name (``rank``, ``step``).
        groups: lists of (column, header); columns of one group are shown side by side, and
            every time column of the table shares one unit, in its header, chosen from the first
            group holding times.

    Returns:
        A frame of text cells, for :func:`write_table`.
    """
    import pandas as pd

    shown = {key.capitalize(): table[key].astype(str).tolist() for key in keys}
    times = [[column for column, _ in group if is_time_column(column)] for group in groups]
    leading = next((columns for columns in times if columns), [])
    # Missing cells are shown as "-" below; filled, they cannot upset the choice of unit.
    unit = time_unit(pd.concat([table[c] for c in leading], ignore_index=True).fillna(0).tolist()) if leading else None
    for group in groups:
        for column, header in group:
            viewer_header, cells = format_column(column, table[column].fillna(0), header, unit)
            missing = table[column].isna().tolist()
            shown[viewer_header] = ["-" if gone else cell for cell, gone in zip(cells, missing, strict=True)]
    return pd.DataFrame(shown)


def _columns(frame: pd.DataFrame | Rows) -> tuple[list[str], dict[str, list[Any]]]:
    """A table's column names and each column's values as a list."""
    if isinstance(frame, Rows):
        return list(frame.columns), {c: frame.column(c) for c in frame.columns}
    names = [str(c) for c in frame.columns]
    return names, {str(c): frame[c].tolist() for c in frame.columns}


def _keep_order(names: list[str], first: Sequence[str]) -> list[str]:
    """The columns from the one to keep longest to the one to drop first; a column named in
    ``first`` without its unit (``Step median``) stands for its header (``Step median (ms)``)."""
    def named(key: str) -> list[str]:
        return [n for n in names if n == key or n.startswith(f"{key} (")]

    ordered = [n for key in first for n in named(key)] + [n for n in _KEEP_ORDER if n in names] + names
    return list(dict.fromkeys(ordered))


def render_table(frame: pd.DataFrame | Rows, title: str, out: TextIO | None = None, sort: str | None = None,
                 keep: Sequence[str] = ()) -> None:
    """Print a table for a person: one time unit, fitted to the terminal, data made printable.

    Args:
        frame: the table (values, or text cells from :func:`readable_columns`).
        title: the line above it.
        out: where to print (stdout by default).
        sort: the column the rows are sorted by: it is kept however narrow the terminal, and
            its values choose the time unit when it is a time.
        keep: other columns to keep however narrow the terminal, most important first.
    """
    stream = out or sys.stdout
    names, values = _columns(frame)
    times = [n for n in names if is_time_column(n)]
    reference = sort if sort in times else (times[0] if times else None)
    unit = time_unit(values[reference]) if reference else None
    asked = ["name", *([sort] if sort else []), *keep]
    order = _keep_order(names, asked)
    essential = {n for n in names if any(n == key or n.startswith(f"{key} (") for key in asked)}
    columns = []
    for name in names:
        header, cells = format_column(name, values[name], unit=unit if is_time_column(name) else None)
        prose = name in _PROSE_COLUMNS
        text = prose or name in _TEXT_COLUMNS
        columns.append(Column(header, cells, text=text, wrap=prose, priority=order.index(name),
                              shorten_all=distinct_names if name == "name" else None,
                              essential=name in essential))
    print_columns(columns, title, stream)


def write_table(frame: pd.DataFrame | Rows, title: str, fmt: TableFormat, out: TextIO | None = None,
                sort: str | None = None, keep: Sequence[str] = ()) -> None:
    """Print ``frame`` in the chosen format: a table for a person, CSV or JSON for a script.

    Args:
        frame: the table.
        title: the line above a table for a person.
        fmt: table, CSV or JSON.
        out: where to print (stdout by default).
        sort: the column the rows are sorted by (see :func:`render_table`).
        keep: other columns a narrow table keeps (see :func:`render_table`).
    """
    stream = out or sys.stdout
    if fmt is TableFormat.TABLE:
        render_table(frame, title, stream, sort, keep)
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
