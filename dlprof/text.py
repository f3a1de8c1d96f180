"""Text from data made safe to print: the one sanitiser every message and table goes through.

    line = printable(name)               # "\\x1b[2J" -> "␛[2J"

Names, categories and paths come from the profiled program, from imported traces and from run
directories anyone can edit, so they may hold terminal escapes (``ESC]0;...BEL`` sets the window
title, ``ESC]52;c;...`` writes the clipboard, ``ESC[2J`` clears the screen) or bidirectional
controls (U+202E turns the rest of a line around, so ``evil\\u202egnp.py`` reads as
``evilyp.png``). :func:`printable` shows each control character (C0, DEL, C1) as a visible symbol
of the same width and each bidirectional control, and the line and paragraph separators, as the
replacement character. It sits in the core so that the recording path's one-line messages use it
as the viewers' tables do (``dlprof.viewers.screen`` hands it on).
"""

from __future__ import annotations

import os

# C0 controls show as Unicode's control pictures (ESC as ␛, BEL as ␇, newline as ␊), DEL as
# ␡; C1 controls (0x80-0x9F, which some terminals obey as ESC sequences) have no pictures and
# show as the replacement character. One character each: a table's columns stay aligned.
_VISIBLE = {code: chr(0x2400 + code) for code in range(0x20)}
_VISIBLE[0x7F] = "\u2421"
_VISIBLE.update({code: "\ufffd" for code in range(0x80, 0xA0)})
# Bidirectional controls (the Arabic letter mark, LRM and RLM, the embeddings and overrides
# U+202A-202E, the isolates U+2066-2069) reorder what follows them on screen; the line and
# paragraph separators break a line where a terminal may not show one.
_BIDI = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x2028, 0x2029)
_VISIBLE.update({code: "\ufffd" for code in _BIDI})


def printable(text: str | os.PathLike[str]) -> str:
    """``text`` with every control character replaced by a visible symbol of the same width.

    Args:
        text: a name, category, path or any text that came from data (a path is turned into
            its text).

    Returns:
        The text, safe to write to a terminal: no escape sequence in it can act, and nothing in
        it reorders what a terminal shows.
    """
    return str(text).translate(_VISIBLE)
