"""A table fitted to the terminal: lesser columns dropped first, names shortened in the middle.

    columns = [Column("Name", names, text=True, priority=0), Column("Total (ms)", totals, priority=1)]
    print_columns(columns, "top ops", sys.stdout)

Every column has a priority (0 is kept first). The name and the sort column come first; a
column that does not fit beside the ones before it is dropped with every column after it, and
a line under the table names what was dropped. Text columns (names, shapes, scripts) shrink
to what is left, never below a floor (:data:`NAME_FLOOR` for the leading one), so the name
column never disappears; and a column the command did not ask for (not ``essential``) is shown
only while the name keeps its room (:data:`NAME_SHARE` of the width, or all it needs), so a
wider terminal never gives the names less. Names are shortened together, keeping what tells
them apart (:mod:`dlprof.viewers.names`), prose wraps; numbers are never cut. ``--wide`` (:func:`screen.set_wide`) shows
every column and whole names. Every header, cell and title passes through
:func:`screen.printable`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TextIO

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from dlprof.viewers.names import cut_middle
from dlprof.viewers.screen import printable, table_width

# The least width of the leading text column (the name) while other columns are shown.
NAME_FLOOR = 30
# The share of the width the name keeps before a column no one asked for is shown beside it.
NAME_SHARE = 0.5
# The least width of any other text column (input shapes, a script's path), and of prose.
TEXT_FLOOR = 12
PROSE_FLOOR = 20
# What a rich table with box.SIMPLE_HEAD adds to its cells' widths: one space either side of
# each cell, a separator between cells and an edge each side, that is 3 per column and 1.
_PER_COLUMN, _EDGES = 3, 1


@dataclass(frozen=True)
class Column:
    """One column of a table for a person.

    Attributes:
        header: the header, with its unit.
        cells: the cells as text, as the data has them (made printable when shown: rich's
            ``Text`` would silently drop some control characters, BEL among them).
        text: left-aligned text that may be shortened to fit (names); numbers are never cut.
        priority: the lower, the longer the column stays as the width shrinks.
        shorten: how a text cell is cut to a width (the middle, by default).
        shorten_all: how the column's cells are cut to a width together, where what one cell
            keeps depends on the others (names: :func:`~dlprof.viewers.names.distinct_names`).
        wrap: prose (a description, a reason): its cells wrap onto more lines instead of being cut.
        width: the width fitted, for a column that wraps (set by :func:`fit_columns`).
        styles: each cell's rich style (none by default).
        essential: asked for by the command (the sort column, those it keeps): shown while
            the floors fit, before the name gets its room.
    """

    header: str
    cells: list[str]
    text: bool = False
    priority: int = 0
    shorten: Callable[[str, int], str] = field(default=cut_middle, compare=False)
    shorten_all: Callable[[list[str], int], list[str]] | None = field(default=None, compare=False)
    wrap: bool = False
    width: int | None = None
    styles: list[str] | None = None
    essential: bool = False

    def natural_width(self) -> int:
        """The width that shows the header and every cell whole."""
        return max([cell_len(self.header), *(cell_len(cell) for cell in self.cells)])


def fit_columns(columns: list[Column], width: int | None) -> tuple[list[Column], list[str]]:
    """The columns that fit ``width``, in their order, text cut to fit; and the headers dropped.

    Args:
        columns: the table's columns in display order.
        width: the width to fit; None to keep every column whole.

    Returns:
        The columns shown (their text cells shortened where needed) and the headers of those
        dropped, in display order.
    """
    if width is None or not columns:
        return columns, []
    by_priority = sorted(range(len(columns)), key=lambda i: (columns[i].priority, i))
    first_text = next((i for i in by_priority if columns[i].text), None)
    natural = [c.natural_width() for c in columns]
    floor = [min(natural[i], NAME_FLOOR if i == first_text else PROSE_FLOOR if c.wrap else TEXT_FLOOR)
             if c.text else natural[i] for i, c in enumerate(columns)]
    # The room the name keeps before columns no one asked for are shown beside it.
    name_room = 0 if first_text is None else (
        max(min(natural[first_text], int(width * NAME_SHARE)), floor[first_text]) - floor[first_text])
    kept: list[int] = []
    for index in by_priority:
        needed = sum(floor[i] for i in [*kept, index]) + _PER_COLUMN * (len(kept) + 1) + _EDGES
        if kept and not columns[index].essential and index != first_text:
            needed += name_room
        if kept and needed > width:
            break
        kept.append(index)
    # What is left past the floors goes to the names (most important first), then to prose,
    # shared in proportion to what each lacks.
    spare = width - sum(floor[i] for i in kept) - _PER_COLUMN * len(kept) - _EDGES
    widths = {i: floor[i] for i in kept}
    for index in kept:
        if columns[index].text and not columns[index].wrap and spare > 0:
            widths[index] = min(natural[index], floor[index] + spare)
            spare -= widths[index] - floor[index]
    lacking = {i: natural[i] - floor[i] for i in kept if columns[i].wrap}
    for index, lack in lacking.items():
        widths[index] += min(lack, spare * lack // max(sum(lacking.values()), 1))
    shown = [_shortened(columns[i], widths[i]) for i in sorted(kept)]
    dropped = [columns[i].header for i in range(len(columns)) if i not in widths]
    return shown, dropped


def _shortened(column: Column, width: int) -> Column:
    if not column.text or column.natural_width() <= width:
        return column
    if column.wrap:
        return replace(column, width=width)
    if column.shorten_all is not None:
        return replace(column, cells=column.shorten_all(column.cells, width))
    cells = [cell if cell_len(cell) <= width else column.shorten(cell, width) for cell in column.cells]
    return replace(column, cells=cells)


def printable_column(column: Column) -> Column:
    """The column with its header and cells made printable (and so measured as shown)."""
    return replace(column, header=printable(column.header), cells=[printable(cell) for cell in column.cells])


def rich_table(columns: list[Column], title: str) -> Table:
    """A rich table of these columns, already printable and fitted."""
    table = Table(title=Text(printable(title)) if title else None, title_justify="left",
                  header_style="bold", box=box.SIMPLE_HEAD)
    for column in columns:
        table.add_column(Text(column.header), justify="left" if column.text else "right", width=column.width,
                         no_wrap=not column.wrap, overflow="fold" if column.wrap else "ellipsis")
    styled = [[Text(cell, style=style) for cell, style in zip(c.cells, c.styles or [""] * len(c.cells), strict=True)]
              for c in columns]
    for row in zip(*styled, strict=True):
        table.add_row(*row)
    return table


def console_for(stream: TextIO, width: int | None, natural: int = 0) -> Console:
    """A rich console writing to ``stream`` at ``width`` (None: ``natural``, at least 80)."""
    return Console(file=stream, width=width or max(natural, 80), highlight=False)


def print_columns(columns: list[Column], title: str, stream: TextIO, console: Console | None = None) -> None:
    """Print a table fitted to the width of ``stream`` (see the module's docstring).

    Args:
        columns: the columns in display order.
        title: the line above the table (none when empty).
        stream: where to print; its width decides what fits.
        console: a console to print with, when the caller prints more around the table.
    """
    width = table_width(stream)
    shown, dropped = fit_columns([printable_column(c) for c in columns], width)
    natural = sum(c.natural_width() for c in shown) + _PER_COLUMN * len(shown) + _EDGES
    out = console or console_for(stream, width, natural)
    if width is None:
        # Whole names however wide: the console must not fold a row the table cannot cut.
        out.width = max(out.width, natural)
    out.print(rich_table(shown, title))
    if dropped:
        several = len(dropped) != 1
        out.print(Text(f"({len(dropped)} column{'s' if several else ''} hidden to fit {width} columns: "
                       f"{', '.join(dropped)}; --wide shows {'them' if several else 'it'})"))
