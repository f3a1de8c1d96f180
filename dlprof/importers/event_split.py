"""A piece of a trace's events array cut into one string per event, from its bytes alone.

The strings are Arrow views over one copy of the piece, so each event reaches DuckDB's JSON
reader as the bytes it was read as: no Python object, no re-serialisation::

    lines = event_strings(piece, Layout.BLOCKS, b"  ")   # pa.StringArray, or None

Kineto's layout (a field per line, each event closed by ``}`` at its indentation) and one event
per line are cut where their newlines say. Anything else (everything on one line, as torch's
``export_chrome_trace`` writes) is cut by its JSON structure: the quotes that are not escaped
bound the strings, and outside them an event ends where its closing brace brings the depth of
brackets back to zero (:func:`structural_strings`). Each string runs from one event's end to the
next one's, the separating comma overwritten with a space; what else lies between two events
stays in a string, so the JSON reader refuses it and the caller parses the piece another way.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from dlprof.importers.chunked_json import Layout

_SPACE = b" \t\r\n"
_QUOTE, _BACKSLASH, _COMMA, _BLANK = 34, 92, 44, 32
# Depth change of each structural byte: { and [ open, } and ] close, a comma none.
_DEPTH_STEP = np.zeros(256, dtype=np.int8)
_DEPTH_STEP[[ord("{"), ord("[")]] = 1
_DEPTH_STEP[[ord("}"), ord("]")]] = -1
_STRUCTURAL = np.zeros(256, dtype=bool)
_STRUCTURAL[[ord("{"), ord("["), ord("}"), ord("]"), _COMMA]] = True


def event_strings(piece: bytes, layout: Layout, indent: bytes) -> pa.StringArray | None:
    """The piece's events as strings over one copy of its bytes, or None where bytes cannot tell.

    Args:
        piece: events as the file separates them, without the array's brackets.
        layout: how the file lays them out.
        indent: the events' indentation, in Kineto's layout.
    """
    if layout is Layout.INLINE:
        return _brace_comma_strings(piece)
    data = np.frombuffer(piece, dtype=np.uint8)
    if layout is Layout.LINES:
        newlines = np.flatnonzero(data == 10)
        # An event ends at a newline followed by a line with something on it.
        newlines = newlines[newlines + 1 < len(data)]
        ends = newlines[data[newlines + 1] > 32]
        before = np.maximum(ends - 1, 0)
        ends = np.where(data[before] == 13, before, ends)  # "\r\n"
    else:
        closing = np.frombuffer(b"\n" + indent + b"}", dtype=np.uint8)
        ends = np.flatnonzero(data == ord("}"))
        ends = ends[ends >= len(closing) - 1]
        for back, byte in enumerate(closing[::-1].tolist()):
            ends = ends[data[ends - back] == byte]
        ends = ends + 1
        if len(ends) == 0:
            return None
    writable = bytearray(piece)
    view = np.frombuffer(writable, dtype=np.uint8)
    # The comma after each event (after its closing brace, or at its line's end).
    comma = ends - 1 if layout is Layout.LINES else ends
    comma = comma[comma < len(view)]
    for _ in range(2):  # "}," or "} ," or "},\r"
        at_comma = view[comma] == _COMMA
        view[comma[at_comma]] = _BLANK
        comma = comma[~at_comma & (view[comma] == _BLANK)] + (1 if layout is Layout.BLOCKS else -1)
        comma = comma[(comma >= 0) & (comma < len(view))]
    last = int(ends[-1]) if len(ends) else 0
    if layout is Layout.BLOCKS and writable[last:].strip(_SPACE + b","):
        return None  # something after the last whole event
    # Kineto's layout: up to the last event's end; one event a line: to the piece's end.
    offsets = np.concatenate(([0], ends) if layout is Layout.BLOCKS else ([0], ends, [len(view)]))
    return _strings(writable, offsets)


def _brace_comma_strings(piece: bytes) -> pa.StringArray | None:
    """Events on one line cut after each ``}`` that a comma and a ``{`` follow (``}, {``).

    Such a cut may fall inside a string or an event; the reader then refuses the string on the
    left of it (it ends inside a string, or with a bracket open), and the caller cuts by
    structure: a piece whose every string reads cut only between events.
    """
    data = np.frombuffer(piece, dtype=np.uint8)
    closing = np.flatnonzero(data[:-2] == ord("}"))
    closing = closing[data[closing + 1] == _COMMA]
    spaced = data[closing + 2] == _BLANK
    opening = np.where(spaced, closing + 3, closing + 2)
    keep = opening < len(data)
    closing, opening = closing[keep], opening[keep]
    closing = closing[data[opening] == ord("{")]
    writable = bytearray(piece)
    view = np.frombuffer(writable, dtype=np.uint8)
    view[closing + 1] = _BLANK
    return _strings(writable, np.concatenate(([0], closing + 1, [len(view)])))


def structural_strings(piece: bytes) -> pa.StringArray | None:
    """The piece's events cut where each top-level value closes, outside strings.

    Returns:
        One string per event, or None where the piece does not hold whole objects and arrays
        separated by commas (it ends inside a string or an event, a bracket closes what was not
        opened, or a bare value lies between events).
    """
    data = np.frombuffer(piece, dtype=np.uint8)
    quotes = _unescaped_quotes(data)
    if len(quotes) % 2:
        return None  # the piece ends inside a string
    structural = np.flatnonzero(_STRUCTURAL[data])
    # A byte lies inside a string when an odd number of quotes comes before it.
    structural = structural[np.searchsorted(quotes, structural) % 2 == 0]
    depth = np.cumsum(_DEPTH_STEP[data[structural]], dtype=np.int64)
    if len(depth) == 0 or depth.min() < 0 or depth[-1] != 0:
        return None
    closing = _DEPTH_STEP[data[structural]] < 0
    ends = structural[closing & (depth == 0)] + 1
    separators = structural[(data[structural] == _COMMA) & (depth == 0)]
    if len(separators) != len(ends) - 1:
        return None  # a value between two events, or two commas
    writable = bytearray(piece)
    view = np.frombuffer(writable, dtype=np.uint8)
    view[separators] = _BLANK
    if writable[int(ends[-1]):].strip(_SPACE):
        return None  # a bare value after the last event
    return _strings(writable, np.concatenate(([0], ends[:-1], [len(view)])))


def _unescaped_quotes(data: np.ndarray) -> np.ndarray:
    """Positions of the quotes that open or close a string (not those escaped by a backslash)."""
    quotes = np.flatnonzero(data == _QUOTE)
    after_backslash = quotes[(quotes > 0) & (data[np.maximum(quotes - 1, 0)] == _BACKSLASH)]
    if len(after_backslash) == 0:
        return quotes
    # A quote is escaped when an odd run of backslashes ends just before it.
    backslashes = np.flatnonzero(data == _BACKSLASH)
    run_start = np.ones(len(backslashes), dtype=bool)
    run_start[1:] = np.diff(backslashes) != 1
    first_of_run = np.maximum.accumulate(np.where(run_start, np.arange(len(backslashes)), 0))
    last = np.searchsorted(backslashes, after_backslash - 1)
    escaped = after_backslash[(last - first_of_run[last] + 1) % 2 == 1]
    return np.setdiff1d(quotes, escaped, assume_unique=True)


def _strings(buffer: bytearray, offsets: np.ndarray) -> pa.StringArray:
    return pa.StringArray.from_buffers(len(offsets) - 1, pa.py_buffer(offsets.astype(np.int32)),
                                       pa.py_buffer(buffer))
