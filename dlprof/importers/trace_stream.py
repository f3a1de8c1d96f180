"""Reading trace files as streams: gzip decompressed a block at a time, headers read first.

A file is opened once to learn what it is and what its header says (:func:`probe`): the format,
the rank it states and its time base, which older Kineto versions write only after the events
(for a gzip file, finding it costs one more pass of decompression and nothing more). The import
then streams the events (:class:`ChromeTraceRows`), so the rows of a piece are written before
the next is read::

    info = probe(Path("rank0.json.gz"))
    with open_trace(info.path) as (stream, file):
        rows = ChromeTraceRows(stream, first_id=0)
        for tables, events in rows:
            ...   # file.tell() is the progress made
        rows.header
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from dlprof.importers.chunked_json import CHUNK_BYTES, ChunkedTrace, TraceFormatError, open_stream
from dlprof.importers.damage import Damage
from dlprof.importers.kineto import KinetoOptions, KinetoTables, convert_events
from dlprof.importers.kineto_events import EventParser
from dlprof.importers.memory_snapshot import PICKLE_OPCODE
from dlprof.importers.trace_header import (
    HeaderError,
    base_time_ns,
    check_header,
    checked_base_time,
    stated_rank,
)
from dlprof.store.safe_files import not_a_file

_TAIL_BYTES = 1 << 20  # the end of a file searched for keys written after the events
# A number's text whole (1e300 too), so that what is not a whole number is refused, not cut short.
_BASE_TIME = re.compile(rb'"baseTimeNanoseconds"\s*:\s*(-?[0-9][0-9.eE+-]*)')
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')


class TraceImportError(ValueError):
    """A file cannot be imported; the message is one line naming it and why."""


@dataclass
class TraceInfo:
    """What a trace file is, learnt before its events are read."""

    path: Path
    kind: str  # "chrome-trace", "memory-timeline", "memory-snapshot" or "xplane"
    header: dict[str, Any] = field(default_factory=dict)  # the keys before the events
    base_ns: int = 0  # baseTimeNanoseconds, wherever the file states it

    @property
    def stated_rank(self) -> int | None:
        """The rank the header states (checked by :func:`probe`), or None."""
        return stated_rank(self.header)


@contextmanager
def open_trace(path: Path) -> Iterator[tuple[IO[bytes], IO[bytes]]]:
    """:func:`~dlprof.importers.chunked_json.open_stream`, failing with a :class:`TraceImportError`."""
    stack = ExitStack()
    try:
        streams = stack.enter_context(open_stream(path))
    except OSError as error:
        raise TraceImportError(f"{path}: cannot read ({error.strerror or error})") from None
    with stack:
        yield streams


def probe(path: Path, is_xplane: bool) -> TraceInfo:
    """Open ``path`` far enough to know its format, its leading header and its time base."""
    what = not_a_file(path)
    if what is not None:  # a FIFO would wait for a writer, /dev/zero never end
        raise TraceImportError(f"{path}: {what}, not a trace file" if what != "no such file" else f"{path}: {what}")
    if is_xplane:
        return TraceInfo(path, "xplane")
    with open_trace(path) as (stream, _):
        start = _read(path, stream, 64 << 10)
        if start.lstrip()[:2] == b"[[":  # a raw memory timeline is an array of arrays
            return TraceInfo(path, "memory-timeline")
        if start[:1] == PICKLE_OPCODE:  # a pickle: torch's memory snapshots are the ones dlprof reads
            return TraceInfo(path, "memory-snapshot")
        header = _leading_header(path, start, stream)
    checked_header(path, header)
    info = TraceInfo(path, "chrome-trace", header)
    info.base_ns = base_time_ns(header) if "baseTimeNanoseconds" in header else _trailing_base(path)
    return info


def checked_header(path: Path, header: dict[str, Any]) -> None:
    """:func:`~dlprof.importers.trace_header.check_header`, failing with a :class:`TraceImportError`."""
    try:
        check_header(header)
    except HeaderError as error:
        raise TraceImportError(f"{path}: {error}") from None


def read_whole(path: Path) -> bytes:
    """A (small) file's contents, gunzipped when it is gzip."""
    with open_trace(path) as (stream, _):
        return _read(path, stream, -1)


class ChromeTraceRows:
    """A Chrome trace's rows, piece by piece, times relative to the trace's base."""

    def __init__(self, stream: IO[bytes], first_id: int, chunk_bytes: int = CHUNK_BYTES) -> None:
        """Args:
        stream: the decompressed trace.
        first_id: the first slice id; the pieces number their slices on from it.
        chunk_bytes: bytes read at a time, about the size of a piece.
        """
        self._trace = ChunkedTrace(stream, chunk_bytes)
        self._first_id = first_id

    @property
    def header(self) -> dict[str, Any]:
        """Every top-level key but ``traceEvents``, once the pieces are exhausted."""
        return self._trace.header

    def __iter__(self) -> Iterator[tuple[KinetoTables, int]]:
        """Each piece's tables and how many events it held.

        Raises:
            TraceFormatError: not a Chrome trace, or damaged.
        """
        trace, parser, next_id = self._trace, EventParser(), self._first_id
        invalid = 0
        for events in trace.pieces(lambda piece: parser(piece, trace.layout, trace.indent)):
            tables = convert_events(events, KinetoOptions(id_base=next_id))
            next_id += tables.slices.num_rows
            if trace.invalid_events > invalid:  # events of this piece whose JSON was unreadable
                tables.dropped[str(Damage.INVALID_JSON)] = trace.invalid_events - invalid
                invalid = trace.invalid_events
            yield tables, events.num_rows + tables.dropped.get(str(Damage.INVALID_JSON), 0)


def _read(path: Path, stream: IO[bytes], size: int) -> bytes:
    try:
        return stream.read(size)
    except (EOFError, OSError, zlib.error) as error:
        raise TraceImportError(f"{path}: damaged or truncated gzip file ({error})") from None


def _leading_header(path: Path, start: bytes, stream: IO[bytes]) -> dict[str, Any]:
    """The keys before ``traceEvents`` (where Kineto states the rank), without reading events."""
    data = start
    while _EVENTS_KEY.search(data) is None and len(data) < (64 << 20):
        more = _read(path, stream, CHUNK_BYTES)
        if not more:
            break
        data += more
    match = _EVENTS_KEY.search(data)
    stripped = data.lstrip()
    if match is None or not stripped.startswith(b"{"):
        return {}  # a bare array, or an object whose events come later: nothing stated first
    try:
        value = orjson.loads(data[: match.start()] + b'"traceEvents": []}')
    except orjson.JSONDecodeError:
        return {}
    if isinstance(value, dict):
        value.pop("traceEvents", None)
        return value
    return {}


def _trailing_base(path: Path) -> int:
    """``baseTimeNanoseconds`` from the end of the file (where Kineto wrote it until 2024), or 0."""
    with open_trace(path) as (stream, file):
        if stream is file:
            size = file.seek(0, 2)
            file.seek(max(size - _TAIL_BYTES, 0))
            tail = _read(path, file, -1)
        else:
            tail = b""
            while block := _read(path, stream, CHUNK_BYTES):
                tail = (tail + block)[-_TAIL_BYTES:]
    found = list(_BASE_TIME.finditer(tail))
    try:
        return checked_base_time(orjson.loads(found[-1].group(1))) if found else 0
    except orjson.JSONDecodeError:
        raise TraceImportError(f"{path}: baseTimeNanoseconds is not a number") from None
    except HeaderError as error:
        raise TraceImportError(f"{path}: {error}") from None


__all__ = ["ChromeTraceRows", "TraceFormatError", "TraceImportError", "TraceInfo", "checked_header",
           "open_trace", "probe", "read_whole"]
