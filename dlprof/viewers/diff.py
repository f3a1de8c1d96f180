"""A diff of two runs for a person: the totals, then one table per kind, changes in colour.

    render_diff(table, "before (A) vs after (B), per step", limit=20)

Takes a :func:`dlprof.analysis.diff.diff` table (with a ``regressed`` column when a threshold was
given) and only lays it out: slower in red with a ``+``, faster in green, regressed rows marked
``!``; fitted to the terminal as every table is (:mod:`dlprof.viewers.fit`: the name, the
change and its percentage stay longest). Off a terminal the colours go and the signs stay.
"""

from __future__ import annotations

import sys
from typing import TextIO

import pandas as pd
from rich.text import Text

from dlprof.analysis.diff import Change, CostDiff, EnergyDiff, change_pct, limit_names
from dlprof.viewers.fit import Column, console_for, print_columns
from dlprof.viewers.names import distinct_names
from dlprof.viewers.screen import printable, table_width
from dlprof.viewers.terminal import readable_columns

SLOWER, FASTER = "red", "green"
# What the change column says where there is no percentage.
_NO_PERCENT = {Change.NEW: "new", Change.VANISHED: "gone"}
def render_diff(table: pd.DataFrame, heading: str, limit: int | None = None, out: TextIO | None = None) -> None:
    """Print a diff table: a totals table, then the names of each kind by absolute change.

    Args:
        table: a diff table, optionally with a boolean ``regressed`` column.
        heading: the first line, naming the runs and what the times are per.
        limit: names shown per kind (None: all).
        out: where to print (stdout by default); its width decides the columns shown.
    """
    stream = out or sys.stdout
    console = console_for(stream, table_width(stream))
    console.print(Text(printable(heading), style="bold"))
    totals = table[table["status"] == Change.TOTAL]
    print_columns(_columns(totals, label="kind"), "Totals", stream, console)
    shown = limit_names(table, limit)
    for kind in totals["kind"]:
        names = table[(table["kind"] == kind) & (table["status"] != Change.TOTAL)]
        rows = shown[(shown["kind"] == kind) & (shown["status"] != Change.TOTAL)]
        new = int((names["status"] == Change.NEW).sum())
        gone = int((names["status"] == Change.VANISHED).sum())
        title = (f"{kind}: {len(rows)} of {len(names)} names by absolute change "
                 f"({new} new in B, {gone} gone from A)")
        print_columns(_columns(rows, label="name"), title, stream, console)


# Columns whose times share one unit, so that A, B and the change read side by side.
_TIMES = [("time_a_ns", "Time A"), ("time_b_ns", "Time B"), ("delta_ns", "Change")]
_AVERAGES = [("avg_a_ns", "Avg A"), ("avg_b_ns", "Avg B")]
# What a narrow terminal keeps, first to last (headers without their unit); the rest go first.
_KEEP_ORDER = ("!", "Name", "Kind", "Change", "Change %", "Time A", "Time B", "Share B %", "Avg B", "Avg A",
               "Calls B", "Calls A", "Share A %")


def _columns(rows: pd.DataFrame, label: str) -> list[Column]:
    """The columns of a table of diff rows; ``label`` is the column that names each row."""
    flagged = rows["regressed"].tolist() if "regressed" in rows else [False] * len(rows)
    signs = rows["delta_ns"].tolist()
    plain = [""] * len(rows)
    changed = [SLOWER if sign > 0 else FASTER if sign < 0 else "" for sign in signs]
    # (header, cells, styles)
    columns: list[tuple[str, list[str], list[str]]] = []
    if any(flagged):
        columns.append(("!", ["!" if f else "" for f in flagged], ["bold red"] * len(rows)))
    columns.append((label.capitalize(), [str(v) for v in rows[label]], plain))
    columns.append(("Calls A", _calls(rows["calls_a"]), plain))
    columns.append(("Calls B", _calls(rows["calls_b"]), plain))
    times = readable_columns(rows, [], [_TIMES] + ([_AVERAGES] if label == "name" else []))
    for header, cells in times.items():
        if not header.startswith("Change"):
            columns.append((str(header), cells.tolist(), plain))
            continue
        columns.append((str(header), [_signed(c, s) for c, s in zip(cells, signs, strict=True)], changed))
        percents = [
            _NO_PERCENT.get(Change(status), "-") if pd.isna(pct) else f"{pct:+.1f}%"
            for status, pct in zip(rows["status"], rows["delta_pct"], strict=True)
        ]
        columns.append(("Change %", percents, changed))
    if label == "name":
        columns.append(("Share A %", [f"{v:.1f}" for v in rows["share_a_pct"]], plain))
        columns.append(("Share B %", [f"{v:.1f}" for v in rows["share_b_pct"]], plain))
    return [Column(header, cells, text=header == label.capitalize(), priority=_priority(header),
                   shorten_all=distinct_names, styles=styles) for header, cells, styles in columns]


def _priority(header: str) -> int:
    bare = header.rpartition(" (")[0] or header
    return _KEEP_ORDER.index(bare) if bare in _KEEP_ORDER else len(_KEEP_ORDER)


def _calls(values: pd.Series) -> list[str]:
    """Whole counts as they are; per-step counts, which can be fractions, to two places."""
    whole = bool((values == values.round()).all())
    return [f"{v:,.0f}" if whole else f"{v:,.2f}" for v in values]


def _signed(cell: str, sign: float) -> str:
    """A change with ``+`` when B is slower."""
    return f"+{cell}" if sign > 0 and cell[:1].isdigit() else cell


def _change(a: float | None, b: float | None) -> str:
    pct = change_pct(a, b)
    return "" if pct is None else f" ({pct:+.1f}%)"


def energy_lines(energy: EnergyDiff, costs: CostDiff | None = None) -> list[str]:
    """The lines under the tables: joules and watts per counted step A -> B where both runs
    recorded power, which run lacks it where one does (nothing where neither does: a CPU run
    stays quiet), and at a price, the cost of a counted step."""
    lines = []
    a, b = energy.a, energy.b
    if a is not None and b is not None:
        lines.append(f"energy per counted step: {a.joules:.3f} J -> {b.joules:.3f} J{_change(a.joules, b.joules)}; "
                     f"power {a.watts:.1f} W -> {b.watts:.1f} W{_change(a.watts, b.watts)}")
    elif a is not None or b is not None:
        lacking, having, side = ("A", "B", b) if a is None else ("B", "A", a)
        assert side is not None
        lines.append(f"energy: not recorded in {lacking}; {having}: {side.joules:.3f} J per counted step, "
                     f"{side.watts:.1f} W")
    if costs is not None:
        shown = ["no counted step" if c is None else f"{c:.6f}" for c in (costs.a, costs.b)]
        lines.append(f"cost per counted step at {costs.price_per_hour:g} an hour: {shown[0]} -> {shown[1]}"
                     f"{_change(costs.a, costs.b)}")
    return lines
