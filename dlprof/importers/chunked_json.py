"""A Chrome trace's events in pieces read from a stream, so no trace sits in memory whole.

The stream (a file, a gzip stream, bytes) is read a block at a time. The events array is cut at
event boundaries, as the file's layout shows them, into pieces of about ``chunk_bytes``; each
piece goes to a parser, which returns None when the piece does not end at an event's end (the
layout guessed wrong): the piece then grows until it parses. Memory follows the piece, never the
file: whitespace between events is dropped as it is read, blank lines and long runs of
indentation inside an event are squeezed out, and an event that is still longer than
``MAX_EVENT_BYTES`` is an error, not a reason to read the rest of the file into memory.

Layouts (:class:`Layout`): Kineto's (a field per line, each event closed by ``}`` at its ``{``'s
indentation), one event per line (torch's Python writer, dlprof's export), and everything on one
line (``json.dumps``), cut between ``}`` and ``{``.

One bad event costs one event: a piece that does not parse even at the file's end is taken
event by event (:mod:`dlprof.importers.json_repair`), bare quotes in a name mended, what cannot
be read dropped and counted (:attr:`ChunkedTrace.invalid_events`). A UTF-8 byte order mark
before the document is skipped; anything but whitespace after it is refused as trailing
data::

    trace = ChunkedTrace(gzip.open(path))
    for events in trace.chunks():          # lists of dicts, parsed with orjson
        ...
    trace.header  # every top-level key but traceEvents, known once the pieces are exhausted
"""

from __future__ import annotations

import errno
import gc
import gzip
import io
import re
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import IO, Any, TypeVar, cast

import orjson

from dlprof.importers.json_repair import salvage
from dlprof.store.safe_files import not_a_file

# Decompressed bytes read at a time, and the size pieces are cut at: large enough that the
# fixed cost of a piece (a query, a few hundred Arrow calls, a chunk file) vanishes.
CHUNK_BYTES = 16 << 20
# The smallest piece a file is cut into (see chunk_bytes_for): about 5 ms of fixed cost a piece.
MIN_CHUNK_BYTES = 2 << 20
# The longest event (or header) read into memory, after blank lines are squeezed out.
MAX_EVENT_BYTES = 64 << 20
# A buffer longer than this (and so than any piece) is squeezed of blank lines as it grows.
_SQUEEZE_BYTES = 2 * CHUNK_BYTES
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
# The first line that is only the events array's closing bracket (Kineto: "]," or "]}").
_CLOSING_LINE = re.compile(rb"(?:^|\n)[ \t]*(\])")
_SPACE = b" \t\r\n"
_GZIP_MAGIC = b"\x1f\x8b"
_BLANK_LINES = re.compile(rb"\n[ \t\r\n]*\n")
_LONG_INDENT = re.compile(rb"\n[ \t\r]{256,}")
_COMMA = re.compile(rb"[ \t\r\n]*,")
_BRACKET = re.compile(rb"\]")
_BOM = b"\xef\xbb\xbf"

Parsed = TypeVar("Parsed")


@contextmanager
def gc_paused() -> Iterator[None]:
    """Hold off the cyclic garbage collector while building many objects that form no cycles.

    Parsing a trace allocates hundreds of thousands of dicts; in a process that already tracks
    many objects (a training program), each of them brings a full collection nearer, and the
    collections cost several times the parse itself.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextmanager
def open_stream(path: Path) -> Iterator[tuple[IO[bytes], IO[bytes]]]:
    """A file's bytes as a stream, decompressed a block at a time when it is gzip.

    Yields:
        (the decompressed stream, the file itself: its position is the progress made).

    Raises:
        OSError: the file cannot be opened, or is not a regular file (a FIFO would wait for a
            writer for ever, a device never end).
    """
    what = not_a_file(path)
    if what is not None:
        raise OSError(errno.EINVAL if what != "no such file" else errno.ENOENT, what, str(path))
    with path.open("rb") as file:
        gzipped = file.read(2) == _GZIP_MAGIC
        file.seek(0)
        yield (cast(IO[bytes], gzip.GzipFile(fileobj=file, mode="rb")) if gzipped else file), file


def chunk_bytes_for(path: Path) -> int:
    """The piece size for a file: a quarter of its JSON, from 2 to 16 MB.

    Converting a piece takes several times its bytes at once (its event strings, the parsed
    columns, the rows), so a file of a few MB cut into 16 MB pieces would pay that for the whole
    file; four pieces or more keep it to a fraction. The JSON's size is the file's, or for gzip
    the size its trailer states (modulo 4 GiB: a hint, never trusted further).

    Raises:
        OSError: the file cannot be read.
    """
    size = path.stat().st_size
    with path.open("rb") as file:
        if file.read(2) == _GZIP_MAGIC and size >= 18:
            file.seek(-4, io.SEEK_END)
            size = max(size, int.from_bytes(file.read(4), "little"))
    return min(CHUNK_BYTES, max(MIN_CHUNK_BYTES, size // 4))


class TraceFormatError(ValueError):
    """The bytes are not a Chrome trace (JSON object with traceEvents, or a bare event array)."""


class Layout(Enum):
    """How events follow one another in a file."""

    LINES = "lines"  # one event per line
    BLOCKS = "blocks"  # Kineto's: a field per line, the event closed by "}" at its indentation
    INLINE = "inline"  # no newline between events


class ChunkedTrace:
    """Iterates a Chrome trace's events in pieces of about ``chunk_bytes``."""

    def __init__(self, source: bytes | IO[bytes], chunk_bytes: int = CHUNK_BYTES) -> None:
        """Args:
        source: the trace's bytes, or a binary stream of them (already decompressed).
        chunk_bytes: bytes read at a time and the size pieces are cut at.
        """
        self._source: IO[bytes] = io.BytesIO(source) if isinstance(source, bytes) else source
        self._chunk_bytes = chunk_bytes
        self._eof = False
        self.header: dict[str, Any] = {}
        self.layout = Layout.LINES
        self.indent = b""  # the events' indentation in the BLOCKS layout
        self.consumed = 0  # decompressed bytes read so far
        self.invalid_events = 0  # events dropped because their JSON could not be read
        self.repaired_events = 0  # events read once bare quotes in their strings were escaped

    def chunks(self) -> Iterator[list[dict[str, Any]]]:
        """The events, a list per piece, parsed with orjson; fills :attr:`header` when done."""
        return self.pieces(parse_events)

    def pieces(self, parse: Callable[[bytes], Parsed | None]) -> Iterator[Parsed]:
        """Each piece of events as ``parse`` makes it.

        Args:
            parse: called with a piece (events separated as in the file, without the array's
                brackets); returns None if the piece does not hold whole events.

        Raises:
            TraceFormatError: not a Chrome trace, truncated, or an event too long.
        """
        buffer = self._read_until(lambda data: bool(data.lstrip(_SPACE).removeprefix(_BOM)), b"")
        buffer = buffer.lstrip(_SPACE).removeprefix(_BOM).lstrip(_SPACE)
        if buffer[:1] == b"[":  # the bare-array form
            yield from self._events(buffer[1:], parse, header_prefix=None)
            return
        if buffer[:1] != b"{":
            raise TraceFormatError("not JSON: a Chrome trace starts with { or [")
        buffer = self._read_until(lambda data: _EVENTS_KEY.search(data) is not None, buffer)
        match = _EVENTS_KEY.search(buffer)
        if match is None:  # an object without events: an empty trace, or not a trace at all
            self.header = _parse_object(buffer)
            if "traceEvents" not in self.header:
                raise TraceFormatError("not a Chrome trace: no traceEvents")
            if not isinstance(self.header.pop("traceEvents"), list):
                raise TraceFormatError("not a Chrome trace: traceEvents is not an array")
            return
        yield from self._events(buffer[match.end():], parse, header_prefix=buffer[: match.start()])

    # --- reading -----------------------------------------------------------------------------

    def _read(self) -> bytes:
        if self._eof:
            return b""
        try:
            block = self._source.read(self._chunk_bytes)
        except (EOFError, OSError, zlib.error) as error:
            raise TraceFormatError(f"damaged or truncated gzip file ({error})") from None
        if not block:
            self._eof = True
        self.consumed += len(block)
        return block

    def _read_until(self, done: Callable[[bytes], bool], buffer: bytes) -> bytes:
        """Read blocks onto ``buffer`` until ``done(buffer)`` or the end, squeezing as it grows."""
        while not done(buffer) and not self._eof:
            block = self._read()
            buffer = buffer + block if buffer.strip(_SPACE) else block.lstrip(_SPACE)
            buffer = _bounded(buffer, self.consumed)
        return buffer

    # --- the events array --------------------------------------------------------------------

    def _events(self, buffer: bytes, parse: Callable[[bytes], Parsed | None],
                header_prefix: bytes | None) -> Iterator[Parsed]:
        buffer = self._read_until(
            lambda data: b"\n" in data.lstrip(_SPACE + b",") or len(data) >= self._chunk_bytes, buffer)
        self._detect_layout(buffer)
        grown = 0  # a piece this long did not parse: cut further on
        while True:
            buffer = buffer.lstrip(_SPACE + b",")
            if buffer[:1] == b"]":
                self._finish(buffer[1:], header_prefix)
                return
            cut = self._last_boundary(buffer)
            if cut > grown:
                piece = buffer[:cut].rstrip(_SPACE)
                parsed = parse(piece)
                if parsed is not None:
                    yield parsed
                    buffer, grown = buffer[cut:], 0
                    continue
                closed = self._before_closing(piece, parse)
                if closed is not None:
                    end, parsed = closed
                    yield parsed
                    buffer, grown = buffer[end:], 0
                    continue
                parsed = self._salvaged(piece, parse, final=False)
                if parsed is not None:
                    yield parsed
                    buffer, grown = buffer[cut:], 0
                    continue
                grown = cut
            if self._eof:
                closed = self._before_closing(buffer, parse)
                if closed is None:  # a broken event, or the file cut short
                    closed = self._before_closing(buffer, lambda head: self._salvaged(head, parse, final=True),
                                                  last_first=True)
                if closed is None:
                    raise TraceFormatError("truncated: the events array never ends")
                end, parsed = closed
                yield parsed
                buffer, grown = buffer[end:], 0
                continue
            buffer = _bounded(buffer + self._read(), self.consumed)

    def _detect_layout(self, events: bytes) -> None:
        """Decide how events end, from the first event's first line."""
        opening = events.find(b"{")
        line_end = events.find(b"\n", opening) if opening >= 0 else -1
        if opening < 0 or line_end < 0:
            self.layout = Layout.INLINE
            return
        first_line = events[opening:line_end].rstrip(b" \t\r,")
        if first_line.endswith(b"}"):
            self.layout = Layout.LINES
            return
        self.layout = Layout.BLOCKS
        self.indent = events[events.rfind(b"\n", 0, opening) + 1 : opening]

    def _last_boundary(self, buffer: bytes) -> int:
        """The end of the last whole event in ``buffer`` as the layout shows it, or 0."""
        if self.layout is Layout.LINES:
            return max(buffer.rfind(b"\n"), 0)
        if self.layout is Layout.BLOCKS:
            closing = b"\n" + self.indent + b"}"
            at = len(buffer)
            while (at := buffer.rfind(closing, 0, at)) >= 0:
                end = at + len(closing)
                line_end = buffer.find(b"\n", end)
                if line_end >= 0 and not buffer[end:line_end].strip(b" \t\r,"):
                    return end
            return 0
        at = len(buffer)
        while (at := buffer.rfind(b"}", 0, at)) >= 0:
            if _COMMA.match(buffer, at + 1):
                return at + 1
        return 0

    def _before_closing(self, piece: bytes, parse: Callable[[bytes], Parsed | None],
                        last_first: bool = False) -> tuple[int, Parsed] | None:
        """The events before the array's closing bracket, where ``piece`` holds it.

        A line that starts with ``]`` may also close an array inside a multi-line event, so each
        is tried in turn (on one line, each ``]`` from the last; with ``last_first``, every
        layout from the last: a broken event's salvage takes the nearest to the file's end).
        """
        if self.layout is Layout.INLINE:
            # Any "]" may close the array; the last one that leaves whole events before it does.
            candidates = [m.start() for m in _BRACKET.finditer(piece)][::-1]
        else:
            candidates = [m.start(1) for m in _CLOSING_LINE.finditer(piece)]
            if last_first:
                candidates.reverse()
        for end in candidates:
            head = piece[:end].rstrip(_SPACE + b",")
            if not head.strip(_SPACE):
                continue
            parsed = parse(head)
            if parsed is not None:
                return end, parsed
        return None

    def _salvaged(self, piece: bytes, parse: Callable[[bytes], Parsed | None], final: bool) -> Parsed | None:
        """The events of a piece that does not parse whole, read one by one (see
        :func:`~dlprof.importers.json_repair.salvage`); None when it may only be cut short."""
        kept = salvage(self._split_events(piece), final)
        if kept is None:
            return None
        if not kept.events:
            raise TraceFormatError(f"no event could be read: the JSON of its {kept.dropped} event(s) is invalid")
        separator = b",\n" + self.indent if self.layout is Layout.BLOCKS else b",\n"
        parsed = parse(separator.join(kept.events))
        if parsed is None:
            return None
        self.invalid_events += kept.dropped
        self.repaired_events += kept.repaired
        return parsed

    def _split_events(self, piece: bytes) -> list[bytes]:
        """A piece cut into its events at every boundary its layout shows (see _last_boundary)."""
        if self.layout is Layout.LINES:
            return piece.split(b"\n")
        if self.layout is Layout.BLOCKS:
            closing = re.compile(rb"\n" + re.escape(self.indent) + rb"\}[ \t\r]*,?[ \t\r]*(?=\n|$)")
            ends = [m.start() + len(self.indent) + 2 for m in closing.finditer(piece)]
        else:
            ends = [at + 1 for at in (m.start() for m in re.finditer(rb"\}", piece)) if _COMMA.match(piece, at + 1)]
        starts = [0, *ends]
        return [piece[a:b] for a, b in zip(starts, [*ends, len(piece)], strict=True)]

    def _finish(self, after_array: bytes, header_prefix: bytes | None) -> None:
        """Read the rest of the file: the header's keys that follow the events."""
        rest = self._read_until(lambda _: False, after_array)
        if header_prefix is None:
            if rest.strip(_SPACE):
                raise TraceFormatError(f"trailing data after the events array ({_shown(rest.strip(_SPACE))})")
            return
        self.header = _parse_object(header_prefix + b'"traceEvents": []' + rest)
        self.header.pop("traceEvents")


def _bounded(buffer: bytes, position: int) -> bytes:
    """``buffer`` squeezed of blank lines and long indentation once it is longer than a piece.

    A raw newline is never inside a JSON string, so what follows one up to the next
    non-whitespace character is whitespace between tokens, which a parser skips anyway.

    Raises:
        TraceFormatError: still longer than :data:`MAX_EVENT_BYTES`.
    """
    if len(buffer) <= _SQUEEZE_BYTES:
        return buffer
    buffer = _LONG_INDENT.sub(b"\n ", _BLANK_LINES.sub(b"\n", buffer))
    if len(buffer) > MAX_EVENT_BYTES:
        raise TraceFormatError(
            f"an event (or header) longer than {MAX_EVENT_BYTES >> 20} MB before byte {position}")
    return buffer


def parse_events(piece: bytes) -> list[dict[str, Any]] | None:
    """A piece of events parsed with orjson, or None if it does not hold whole events."""
    with gc_paused():
        try:
            parsed = orjson.loads(b"[" + piece.strip(_SPACE + b",") + b"]")
        except orjson.JSONDecodeError:
            return None
    return parsed if isinstance(parsed, list) else None


def _parse_object(raw: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        if "after document" in str(error) or "trailing" in str(error):
            raise TraceFormatError(f"trailing data after the JSON document ({error})") from None
        raise TraceFormatError(f"truncated or malformed JSON ({error})") from None
    if not isinstance(value, dict):
        raise TraceFormatError("not a Chrome trace: the top level is not an object")
    return value


def _shown(data: bytes) -> str:
    """The first bytes of ``data``, for a message."""
    return repr(data[:40])[2:-1] + ("..." if len(data) > 40 else "")
