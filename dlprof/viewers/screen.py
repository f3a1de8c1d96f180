"""What a terminal can take: how wide a table may be, and text made safe to print.

    width = table_width(sys.stdout)      # $COLUMNS, else the terminal's width, else 80
    line = printable(name)               # "\\x1b[2J" -> "␛[2J"

Width: ``$COLUMNS`` when it is set (also when the output is piped, so ``COLUMNS=120 dlprof top
| less`` is 120 wide), else the terminal's own width, else :data:`PIPED_WIDTH` (80) for a pipe
or a file: a table written to a file reads as it would in a default terminal, and ``--wide``
(:func:`set_wide`) lifts the limit for whoever wants every column and whole names.

Safety: names, categories and paths come from the profiled program and from imported traces,
so they may hold terminal escapes (``ESC]0;...BEL`` sets the window title, ``ESC]52;c;...``
writes the clipboard, ``ESC[2J`` clears the screen). Every viewer passes text that reaches the
terminal through :func:`printable`, which shows each control character (C0, DEL, C1) as a
visible symbol of the same width. CSV and JSON keep the true names.
"""

from __future__ import annotations

import io
import os
import textwrap
from typing import TextIO

# The width of a table written to a pipe or a file when $COLUMNS is not set.
PIPED_WIDTH = 80

# C0 controls show as Unicode's control pictures (ESC as ␛, BEL as ␇, newline as ␊), DEL as
# ␡; C1 controls (0x80-0x9F, which some terminals obey as ESC sequences) have no pictures and
# show as the replacement character. One character each: a table's columns stay aligned.
_VISIBLE = {code: chr(0x2400 + code) for code in range(0x20)}
_VISIBLE[0x7F] = "\u2421"
_VISIBLE.update({code: "\ufffd" for code in range(0x80, 0xA0)})


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


def printable(text: str) -> str:
    """``text`` with every control character replaced by a visible symbol of the same width.

    Args:
        text: a name, category, path or any text that came from data.

    Returns:
        The text, safe to write to a terminal: no escape sequence in it can act.
    """
    return text.translate(_VISIBLE)
