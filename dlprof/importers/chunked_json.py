"""A Chrome trace's events in chunks, so a large trace never sits in memory as one object tree.

Kineto (and most Chrome trace writers) put one event per line. The events array is cut at
newlines every ``chunk_bytes`` and each piece parsed on its own; a piece that does not parse
(an event spread over several lines, or the array's end) grows to the next newline until it
does. A trace written on one line is parsed whole: correct, just not bounded.

    trace = ChunkedTrace(raw)
    for events in trace.chunks():
        ...
    trace.header  # every top-level key but traceEvents, known once chunks() is exhausted
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import orjson

from dlprof.importers.kineto import gc_paused

# Small pieces keep the parsed objects few; past ~1 MB larger pieces parse no faster.
CHUNK_BYTES = 1 << 20
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
# The first line that is only the events array's closing bracket (Kineto: "]," or "]}").
_CLOSING_LINE = re.compile(rb"\n[ \t]*(\])")


class TraceFormatError(ValueError):
    """The bytes are not a Chrome trace (JSON object with traceEvents, or a bare event array)."""


class ChunkedTrace:
    """Iterates a Chrome trace's events in pieces of about ``chunk_bytes``."""

    def __init__(self, raw: bytes, chunk_bytes: int = CHUNK_BYTES) -> None:
        self._raw = raw
        self._chunk_bytes = chunk_bytes
        self.header: dict[str, Any] = {}
        self.consumed = 0  # bytes of the events array parsed so far, for a progress bar
        self.total = len(raw)

    def chunks(self) -> Iterator[list[dict[str, Any]]]:
        """The events, a list per piece; fills :attr:`header` when done."""
        raw = self._raw
        start = raw[:64].lstrip()
        if start.startswith(b"["):  # the bare-array form
            yield from self._array(raw.index(b"[") + 1, header_prefix=None)
            return
        if not start.startswith(b"{"):
            raise TraceFormatError("not JSON: a Chrome trace starts with { or [")
        match = _EVENTS_KEY.search(raw)
        if match is None:  # an object without events: an empty trace, or not a trace at all
            self.header = _parse_object(raw)
            if "traceEvents" not in self.header:
                raise TraceFormatError("not a Chrome trace: no traceEvents")
            self.header.pop("traceEvents")
            return
        yield from self._array(match.end(), header_prefix=raw[: match.start()])

    def _array(self, position: int, header_prefix: bytes | None) -> Iterator[list[dict[str, Any]]]:
        raw = self._raw
        size = len(raw)
        event_end = _event_boundary(raw, position)
        while True:
            position = _skip_space_and_commas(raw, position)
            if position >= size:
                raise TraceFormatError("truncated: the events array never ends")
            if raw[position : position + 1] == b"]":
                self._finish(position + 1, header_prefix)
                return
            cut = _next_cut(raw, position + self._chunk_bytes, event_end)
            while True:
                piece = raw[position:cut].rstrip()
                events, consumed = _parse_events(piece)
                if events is not None:
                    break
                if cut >= size:
                    # Not one event per line: fall back to parsing the document whole.
                    yield from self._whole(header_prefix)
                    return
                next_cut = raw.find(b"\n", cut + 1)
                cut = size if next_cut < 0 else next_cut
            position += consumed
            self.consumed = position
            if events:
                yield events

    def _whole(self, header_prefix: bytes | None) -> Iterator[list[dict[str, Any]]]:
        with gc_paused():
            try:
                value = orjson.loads(self._raw)
            except orjson.JSONDecodeError as error:
                raise TraceFormatError(f"truncated or malformed JSON ({error})") from None
        if header_prefix is None:
            if not isinstance(value, list):
                raise TraceFormatError("not a Chrome trace: expected an array of events")
            events = value
        else:
            if not isinstance(value, dict):
                raise TraceFormatError("not a Chrome trace: the top level is not an object")
            events = value.pop("traceEvents", [])
            self.header = value
        self.consumed = self.total
        if events:
            yield events

    def _finish(self, after_array: int, header_prefix: bytes | None) -> None:
        self.consumed = self.total
        if header_prefix is None:
            return
        rest = self._raw[after_array:]
        self.header = _parse_object(header_prefix + b'"traceEvents": []' + rest)
        self.header.pop("traceEvents")


def _event_boundary(raw: bytes, array_start: int) -> re.Pattern[bytes] | None:
    """How events end in this file: None when one event is one line (any newline will do), else
    the line that closes an event (torch writes one field per line, each event closed by ``}``
    at the indentation its ``{`` had)."""
    opening = raw.find(b"{", array_start)
    if opening < 0:
        return None
    line_start = raw.rfind(b"\n", 0, opening) + 1
    line_end = raw.find(b"\n", opening)
    first_line = raw[opening : line_end if line_end >= 0 else len(raw)].rstrip(b" \t\r,")
    if first_line.endswith(b"}"):
        return None
    indent = re.escape(raw[line_start:opening])
    return re.compile(rb"\n" + indent + rb"\},?[ \t\r]*(?=\n)")


def _next_cut(raw: bytes, start: int, event_end: re.Pattern[bytes] | None) -> int:
    """Where to end the next piece: at an event's end at or after ``start`` (or the file's end)."""
    if start >= len(raw):
        return len(raw)
    if event_end is None:
        cut = raw.find(b"\n", start)
        return len(raw) if cut < 0 else cut
    found = event_end.search(raw, start)
    return len(raw) if found is None else found.end()


def _skip_space_and_commas(raw: bytes, position: int) -> int:
    size = len(raw)
    while position < size and raw[position] in b" \t\r\n,":
        position += 1
    return position


def _parse_events(piece: bytes) -> tuple[list[dict[str, Any]] | None, int]:
    """Parse a run of events, or the run before the array's closing bracket.

    Returns:
        The events and how many bytes of ``piece`` they used, or (None, 0) if the piece ends in
        the middle of an event.
    """
    body = piece.rstrip(b", \t\r\n")
    with gc_paused():
        try:
            parsed = orjson.loads(b"[" + body + b"]")
        except orjson.JSONDecodeError:
            parsed = None
    if isinstance(parsed, list):
        return parsed, len(body)
    # The array may end inside this piece, at a line that starts with "]" (Kineto writes
    # "]," + the remaining keys); a nested array inside a multi-line event can too, so each
    # such line is tried in turn.
    for closing in _CLOSING_LINE.finditer(body):
        end = closing.start(1)
        head = body[:end].rstrip(b", \t\r\n")
        try:
            with gc_paused():
                parsed = orjson.loads(b"[" + head + b"]")
        except orjson.JSONDecodeError:
            continue
        if isinstance(parsed, list):
            return parsed, end
    return None, 0


def _parse_object(raw: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        raise TraceFormatError(f"not valid JSON ({error})") from None
    if not isinstance(value, dict):
        raise TraceFormatError("not a Chrome trace: the top level is not an object")
    return value
