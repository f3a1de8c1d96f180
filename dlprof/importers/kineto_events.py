"""Chrome trace events into one typed Arrow table: the importer's boundary with the JSON.

Every field the Kineto translation reads becomes a column here, typed once, and nothing past
this module sees JSON again. The events of a piece of a trace become lines of JSON, one event a
line, and DuckDB's JSON reader (C++, yyjson) turns those lines into columns; no Python object is
made per event::

    parse = EventParser()
    events = parse(piece, Layout.BLOCKS, b"  ")   # a pa.Table, or None if the piece is not whole
    events = events_from_dicts(trace["traceEvents"])

Kineto's own layout (a field per line, each event closed by ``}`` at its indentation) and one
event per line become lines by replacing bytes (a raw newline is never inside a JSON string, so
newlines inside an event are spaces to a parser); any other layout is parsed with orjson and
written back one event a line. The columns are in :data:`COLUMNS`; integers that name a thread,
process or stream may be strings in a trace (``"Spans"``): those get a stable number
(:func:`as_int`), as before. A value of the wrong type reads as null. Where validation of a field
(ranges, counts of what was dropped) belongs, it belongs in :data:`_SELECT`.
"""

from __future__ import annotations

import threading
import zlib
from typing import Any

import duckdb
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from dlprof.importers.chunked_json import Layout, parse_events

# Kineto argument -> (column, DuckDB type). JSON columns keep the value's text (shapes, grids).
_ARGS: dict[str, tuple[str, str]] = {
    "External id": ("external_id", "BIGINT"),
    "Sequence number": ("sequence_nr", "BIGINT"),
    "correlation": ("correlation", "BIGINT"),
    "Input Dims": ("input_dims", "JSON"),
    "Input type": ("input_type", "JSON"),
    "Concrete Inputs": ("concrete_inputs", "JSON"),
    "flops": ("flops", "BIGINT"),
    "bytes": ("bytes", "BIGINT"),
    "In msg nelems": ("in_msg_nelems", "BIGINT"),
    "dtype": ("dtype", "VARCHAR"),
    "device": ("device", "BIGINT"),
    "stream": ("stream", "JSON"),
    "grid": ("grid", "JSON"),
    "block": ("block", "JSON"),
    "registers per thread": ("registers", "BIGINT"),
    "shared memory": ("shared_memory", "BIGINT"),
    "blocks per SM": ("blocks_per_sm", "DOUBLE"),
    "warps per SM": ("warps_per_sm", "DOUBLE"),
    "est. achieved occupancy %": ("occupancy", "DOUBLE"),
    # [memory] instants. Their "Bytes" differs from "bytes" only in case, which DuckDB's
    # structs cannot tell apart: it is read on its own (see _SELECT).
    "Total Allocated": ("total_allocated", "BIGINT"),
    "Total Reserved": ("total_reserved", "BIGINT"),
    "Addr": ("addr", "BIGINT"),
    "Device Id": ("device_id", "BIGINT"),
    "Device Type": ("device_type", "BIGINT"),
}
_TOP = {"ph": "VARCHAR", "cat": "VARCHAR", "name": "VARCHAR", "pid": "JSON", "tid": "JSON",
        "ts": "DOUBLE", "dur": "DOUBLE"}
_STRUCTURE = orjson.dumps({**_TOP, "args": {key: kind for key, (_, kind) in _ARGS.items()}}).decode()
# Numbers that may be written as names: the text of those that are not numbers, for as_int.
_NAMED_NUMBERS = ("pid", "tid", "stream")

_SELECT = f"""
SELECT e.ph AS ph, e.cat AS cat, e.name AS name,
       {", ".join(f"TRY_CAST(e.{c} AS BIGINT) AS {c}" for c in ("pid", "tid"))},
       e.ts AS ts, e.dur AS dur,
       {", ".join(f'e.args."{key}" AS {column}' for key, (column, _) in _ARGS.items() if column != "stream")},
       TRY_CAST(e.args.stream AS BIGINT) AS stream,
       e.args.stream IS NOT NULL AS has_stream,
       CASE WHEN e.name = '[memory]' THEN TRY_CAST(json_extract(line, '$.args.Bytes') AS BIGINT) END
           AS memory_bytes,
       -- events whose arguments are open-ended (counter series, range profiler metrics)
       CASE WHEN e.ph = 'C' OR e.cat = 'cuda_profiler_range' THEN line END AS raw,
       {", ".join(f"CASE WHEN TRY_CAST(e.{c} AS BIGINT) IS NULL THEN CAST(e.{c} AS VARCHAR) END AS {c}_text"
                  for c in ("pid", "tid"))},
       CASE WHEN TRY_CAST(e.args.stream AS BIGINT) IS NULL THEN CAST(e.args.stream AS VARCHAR) END
           AS stream_text
FROM (SELECT line, json_transform(line, '{_STRUCTURE.replace("'", "''")}') AS e FROM lines)
WHERE e IS NOT NULL
"""

_SPACE = b" \t\r\n"


class EventParser:
    """Pieces of a trace into typed event tables, on one DuckDB connection of one thread."""

    def __init__(self) -> None:
        self._connection = duckdb.connect(config={"threads": 1})
        self._lock = threading.Lock()

    def __call__(self, piece: bytes, layout: Layout, indent: bytes = b"") -> pa.Table | None:
        """The events of a piece, or None if the piece does not hold whole events.

        Args:
            piece: events as the file separates them, without the array's brackets.
            layout: how the file lays them out.
            indent: the events' indentation, in Kineto's layout.
        """
        lines = _as_lines(piece, layout, indent)
        if lines is not None:
            table = self.table(lines)
            if table is not None:
                return table
        events = parse_events(piece)  # another layout, or the guess was wrong
        return None if events is None else self.table(_dumped(events))

    def table(self, lines: bytes) -> pa.Table | None:
        """Typed columns of events given one JSON object a line; None if a line is not one."""
        with self._lock:
            self._connection.register("lines", pa.table({"line": _line_array(lines or b"{}")}))
            try:
                result = self._connection.sql(_SELECT).to_arrow_table()
            except duckdb.Error:  # a line that is not one JSON object
                return None
            finally:
                self._connection.unregister("lines")
        return _named_numbers(result if lines else result.slice(0, 0))


def events_from_dicts(events: list[dict[str, Any]], parser: EventParser | None = None) -> pa.Table:
    """Parsed events (``trace["traceEvents"]``) as the typed event table."""
    table = (parser or EventParser()).table(_dumped(events))
    if table is None:  # cannot happen: orjson wrote every line
        raise ValueError("events that orjson wrote did not read back")
    return table


def as_int(value: Any) -> int:
    """A number from a field that should hold one: the number, or a stable one for a name."""
    if isinstance(value, int):
        return value
    try:
        return int(value, 0) if isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        # A name where a number belongs ("Spans"): the same number for it on every import.
        return zlib.crc32(str(value).encode()) & 0x7FFFFFFF


def _as_lines(piece: bytes, layout: Layout, indent: bytes) -> bytes | None:
    """The piece's events one per line, or None when the layout cannot be cut by bytes alone."""
    if b"\x00" in piece or b"\r" in piece:
        return None
    if layout is Layout.LINES:
        return piece.replace(b",\n", b"\n")
    if layout is Layout.BLOCKS:
        closing = b"\n" + indent + b"}"
        body = piece.rstrip(_SPACE + b",")
        if not body.endswith(closing):
            return None
        # The last event's closing line, then each one between events, becomes the line's end.
        body = body[: -len(closing)].replace(closing + b",\n", b"}\x00").replace(closing + b"\n", b"}\x00")
        return body.replace(b"\n", b" ").replace(b"\x00", b"\n") + b"}"
    return None


def _dumped(events: list[dict[str, Any]] | Any) -> bytes:
    """Events written back one a line; anything but an object becomes an empty one."""
    return b"\n".join(orjson.dumps(e) if isinstance(e, dict) else b"{}" for e in events)


def _line_array(lines: bytes) -> pa.StringArray:
    """The lines as an Arrow string array over the same bytes, each with its newline."""
    ends = np.flatnonzero(np.frombuffer(lines, dtype=np.uint8) == 10) + 1
    offsets = np.concatenate(([0], ends, [] if lines.endswith(b"\n") else [len(lines)]))
    return pa.StringArray.from_buffers(len(offsets) - 1, pa.py_buffer(offsets.astype(np.int32)),
                                       pa.py_buffer(lines))


def _named_numbers(table: pa.Table) -> pa.Table:
    """Fill the numbers a trace wrote as names (``"pid": "Spans"``) with :func:`as_int`."""
    for column in _NAMED_NUMBERS:
        text = table.column(f"{column}_text")
        if text.null_count < len(text):
            numbers = table.column(column)
            named = pc.is_valid(text)
            values = [as_int(orjson.loads(t)) for t in text.filter(named).to_pylist()]
            filled = numbers.to_numpy(zero_copy_only=False)
            filled = np.where(named.to_numpy(zero_copy_only=False), 0, np.nan_to_num(filled.astype(float))).astype(np.int64)
            filled[np.flatnonzero(named.to_numpy(zero_copy_only=False))] = values
            mask = pc.and_(pc.is_null(numbers), pc.invert(named)).to_numpy(zero_copy_only=False)
            table = table.set_column(table.schema.get_field_index(column), column, pa.array(filled, mask=mask))
        table = table.drop_columns([f"{column}_text"])
    return table
