"""tfprof's views for a terminal: the op view's ``value (cum%, self%)`` cells, and the scope and
code trees drawn with guides; CSV and JSON give the analysis frames unchanged.

    write_op_view(op_view(run), "train: op view", TableFormat.TABLE)
    write_tree(scope_tree(run), "train: scope view", TableFormat.TABLE)

An op view cell reads as tfprof prints it: ``19.442 (100.00%, 54.15%)`` is the value (in the
column's unit), then the share of this row and all rows below it, then the row's own share.
"""

from __future__ import annotations

import sys
from typing import TextIO

import pandas as pd

from dlprof.analysis.tfprof import MEASURES, SORT_COLUMN, percent_columns
from dlprof.keys import SortKey, TableFormat
from dlprof.viewers.names import NAME_WIDTH
from dlprof.viewers.terminal import readable_columns, render_table, write_table

# tfprof's column titles.
_OP_VIEW_HEADERS = {
    "bytes": "Requested bytes",
    "total_ns": "Total exec",
    "device_ns": "Accelerator exec",
    "cpu_ns": "CPU exec",
    "occurrence": "Occurrence",
    "flops": "FLOPs",
}
# Shown only when some row has them: a CPU-only run has no accelerator time, a run without
# memory profiling no requested bytes, most ops no FLOPs.
_OPTIONAL = frozenset({"bytes", "device_ns", "flops"})

# Tree guides: the connector of a node, then what its children's lines continue with.
_BRANCH, _LAST = "├─ ", "└─ "
_PIPE, _SPACE = "│  ", "   "
# The least of a name kept beside deep guides; past that, the guides are cut on the left.
_NAME_MIN = 32


def op_view_display(frame: pd.DataFrame) -> pd.DataFrame:
    """The op view as text cells: the type, then one ``value (cum%, self%)`` column per measure;
    the three times share one unit."""
    shown = [m for m in MEASURES if m not in _OPTIONAL or frame[m].astype(bool).any()]
    times = [(m, _OP_VIEW_HEADERS[m]) for m in shown if m.endswith("_ns")]
    groups = [[(m, _OP_VIEW_HEADERS[m])] for m in shown if not m.endswith("_ns")]
    groups.insert(1 if "bytes" in shown else 0, times)  # tfprof's order: bytes, times, the rest
    values = readable_columns(frame, [], groups)
    display = pd.DataFrame({"name": frame["name"].astype(str)})
    for header, measure in zip(values.columns, [m for group in groups for m, _ in group], strict=True):
        share, cumulative = percent_columns(measure)
        display[header] = [
            f"{cell or 0} ({cum:.2f}%, {own:.2f}%)"
            for cell, cum, own in zip(values[header], frame[cumulative], frame[share], strict=True)
        ]
    return display


def tree_guides(frame: pd.DataFrame) -> list[str]:
    """Each node's name behind the guides that draw its place in the tree (rows depth-first)."""
    parents = frame["parent"].tolist()
    last_child = {parent: row for row, parent in enumerate(parents)}  # the last row wins
    continuation: dict[int, str] = {}
    lines = []
    for row, (parent, name) in enumerate(zip(parents, frame["name"].astype(str), strict=True)):
        if parent < 0:
            continuation[row] = ""
            lines.append(_keep_tail(name, NAME_WIDTH))
            continue
        is_last = last_child[parent] == row
        lead = continuation[parent] + (_LAST if is_last else _BRANCH)
        continuation[row] = continuation[parent] + (_SPACE if is_last else _PIPE)
        if len(lead) > NAME_WIDTH - _NAME_MIN:
            lead = "…" + lead[len(lead) - (NAME_WIDTH - _NAME_MIN) + 1:]
        lines.append(lead + _keep_tail(name, NAME_WIDTH - len(lead)))
    return lines


def _keep_tail(name: str, width: int) -> str:
    """A name cut to ``width`` from the left: a frame's function and a scope's innermost part
    are at its end."""
    return name if len(name) <= width else "…" + name[len(name) - width + 1:]


def tree_display(frame: pd.DataFrame) -> pd.DataFrame:
    """A tree as text rows: guided names, total and self time, their shares, the ops counted."""
    display = readable_columns(frame, [], [
        [("total_ns", "Total"), ("self_ns", "Self")],
        [("total_pct", "Total %"), ("self_pct", "Self %")],
        [("ops", "Ops")],
    ])
    display.insert(0, "name", tree_guides(frame))
    return display


def write_op_view(frame: pd.DataFrame, title: str, fmt: TableFormat, out: TextIO | None = None,
                  by: SortKey = SortKey.MICROS) -> None:
    """Print an op view (:func:`dlprof.analysis.tfprof.op_view`): tfprof's layout for a person,
    the frame as CSV or JSON for a script.

    Args:
        frame: the op view.
        title: the line above the table.
        fmt: table, CSV or JSON.
        out: where to print (stdout by default).
        by: what the rows are sorted by: a narrow table keeps that column.
    """
    stream = out or sys.stdout
    if fmt is TableFormat.TABLE:
        render_table(op_view_display(frame), title, stream, sort=_OP_VIEW_HEADERS[SORT_COLUMN[by]])
    else:
        write_table(frame, title, fmt, stream)


def write_tree(frame: pd.DataFrame, title: str, fmt: TableFormat, out: TextIO | None = None) -> None:
    """Print a scope or code tree (:mod:`dlprof.analysis.trees`): drawn for a person, the frame
    (``node``/``parent`` numbers to rebuild it) as CSV or JSON for a script."""
    stream = out or sys.stdout
    if fmt is TableFormat.TABLE:
        render_table(tree_display(frame), title, stream)
    else:
        write_table(frame, title, fmt, stream)
