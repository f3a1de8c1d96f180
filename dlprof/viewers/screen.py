"""What a terminal can take: how wide a table may be, and text made safe to print.

    width = table_width(sys.stdout)      # $COLUMNS, else the terminal's width, else 80
    line = printable(name)               # "\\x1b[2J" -> "␛[2J"

Width: ``$COLUMNS`` when it is set (also when the output is piped, so ``COLUMNS=120 dlprof top
| less`` is 120 wide), else the terminal's own width, else :data:`PIPED_WIDTH` (80) for a pipe
or a file: a table written to a file reads as it would in a default terminal, and ``--wide``
(:func:`set_wide`) lifts the limit for whoever wants every column and whole names.

Safety: names, categories and paths come from the profiled program, from imported traces and
from run directories anyone can edit. Every viewer, table, error and success line passes text
that reaches the terminal through :func:`printable` (:mod:`dlprof.text`'s, here for the viewers;
the recording path, below the viewers, imports it from there). CSV and JSON keep the true names.
"""

from __future__ import annotations

import io
import os
import textwrap
from typing import TextIO

from dlprof.text import printable

__all__ = ["PIPED_WIDTH", "printable", "set_wide", "table_width", "wrapped"]

# The width of a table written to a pipe or a file when $COLUMNS is not set.
PIPED_WIDTH = 80

class _Layout:
    """Whether tables are shown whole (``--wide``) for the command being run."""

    wide = False


def set_wide(wide: bool) -> None:
    """Show every column and whole names however wide the table (``--wide``), or fit the width.

    Args:
        wide: True for ``--wide``; every table command sets it from its option on each call.
    """
    _Layout.wide = wide


def table_width(stream: TextIO) -> int | None:
    """The width a table printed to ``stream`` must fit.

    Args:
        stream: where the table goes.

    Returns:
        None with ``--wide`` (no limit); else ``$COLUMNS`` when set to a positive number, the
        terminal's width when ``stream`` is one, and :data:`PIPED_WIDTH` otherwise.
    """
    if _Layout.wide:
        return None
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if stream.isatty():
        try:
            return os.get_terminal_size(stream.fileno()).columns or PIPED_WIDTH
        except (OSError, ValueError, io.UnsupportedOperation):
            pass
    return PIPED_WIDTH


def wrapped(text: str, stream: TextIO, indent: str = "") -> str:
    """A line of prose for ``stream``: made printable and wrapped to its table width.

    Args:
        text: the line.
        stream: where it goes (its width, as tables fit it; no wrapping with ``--wide``).
        indent: what the lines after the first begin with.

    Returns:
        The text, its lines joined by newlines.
    """
    width = table_width(stream)
    line = printable(text)
    return "\n".join(textwrap.wrap(line, width, subsequent_indent=indent)) if width else line
