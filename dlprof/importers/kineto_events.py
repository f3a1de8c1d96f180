"""Chrome trace events into one typed Arrow table: the importer's boundary with the JSON.

Every field the Kineto translation reads becomes a column here, typed once, and nothing past
this module sees JSON again. The events of a piece of a trace become lines of JSON, one event a
line, and DuckDB's JSON reader (C++, yyjson) turns those lines into columns; no Python object is
made per event::

    parse = EventParser()
    events = parse(piece, Layout.BLOCKS, b"  ")   # a pa.Table, or None if the piece is not whole
    events = events_from_dicts(trace["traceEvents"])

The piece is cut into one string per event over its own bytes
(:mod:`dlprof.importers.event_split`: by newlines in Kineto's layout and one event per line, by
the JSON structure on one line); only a piece that neither cut reads (a bare value between
events) is parsed with orjson and written back one event a line. The columns are in
:data:`COLUMNS`; integers that name a thread, process or stream may be strings in a trace
(``"Spans"``): those get a stable number (:func:`as_int`), as before.

Each event is checked here, once, in the same query (:class:`Damage`): an event that is not an
object, has no phase, or of a phase that is read (``X``, ``C``, ``i``) has a name that is not a
string, a time that is not a number or lies outside :data:`MAX_TIME_NS`, a negative duration, or
arguments that are not an object, gets the reason in its ``damage`` column;
:func:`dlprof.importers.kineto.convert_events` drops it and counts it. Other values of the wrong
type inside ``args`` read as null.
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
from dlprof.importers.damage import MAX_TIME_NS, Damage
from dlprof.importers.event_split import event_strings, structural_strings

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
    "stream": ("stream", "BIGINT"),
    "grid": ("grid", "JSON"),
    "block": ("block", "JSON"),
    "registers per thread": ("registers", "BIGINT"),
    "shared memory": ("shared_memory", "BIGINT"),
    "blocks per SM": ("blocks_per_sm", "DOUBLE"),
    "warps per SM": ("warps_per_sm", "DOUBLE"),
    "est. achieved occupancy %": ("occupancy", "DOUBLE"),
    # [memory] instants. Their "Bytes" differs from "bytes" only in case, which DuckDB's
    # structs cannot tell apart: it is read on its own (see _SELECT), as is torch 1.8's
    # "external id".
    "Total Allocated": ("total_allocated", "BIGINT"),
    "Total Reserved": ("total_reserved", "BIGINT"),
    "Addr": ("addr", "BIGINT"),
    "Device Id": ("device_id", "BIGINT"),
    "Device Type": ("device_type", "BIGINT"),
}
_TOP = {"ph": "VARCHAR", "cat": "VARCHAR", "name": "VARCHAR", "pid": "BIGINT", "tid": "BIGINT",
        "ts": "DOUBLE", "dur": "DOUBLE"}

_MAX_TIME_US = MAX_TIME_NS // 1000
# Phases whose fields are read: complete events, counters, instants ([memory]).
_READ_PHASES = ("X", "C", "i", "I")


# JSON types of the event itself and of the fields checked, from one more parse of the line.
_TYPED_PATHS = ("$", "$.ph", "$.name", "$.cat", "$.args", "$.ts", "$.dur")
_NUMBER = "('BIGINT', 'UBIGINT', 'DOUBLE')"
# The first thing wrong with an event (t is its list of types, 1-based as _TYPED_PATHS), or NULL.
# A JSON null stands for an absent cat or args, which are optional.
_DAMAGE = f"""CASE
    WHEN t[1] IS DISTINCT FROM 'OBJECT' THEN '{Damage.NOT_AN_OBJECT}'
    WHEN t[2] IS DISTINCT FROM 'VARCHAR' THEN '{Damage.NO_PHASE}'
    WHEN e.ph NOT IN {_READ_PHASES} THEN NULL
    WHEN t[3] IS DISTINCT FROM 'VARCHAR' THEN '{Damage.NAME}'
    WHEN t[4] NOT IN ('VARCHAR', 'NULL') THEN '{Damage.CATEGORY}'
    WHEN t[5] NOT IN ('OBJECT', 'NULL') THEN '{Damage.ARGS}'
    WHEN t[6] IS NULL OR t[6] NOT IN {_NUMBER} THEN '{Damage.TS}'
    WHEN NOT abs(e.ts) <= {_MAX_TIME_US} THEN '{Damage.TS_RANGE}'
    WHEN e.ph <> 'X' THEN NULL
    WHEN t[7] IS NULL OR t[7] NOT IN {_NUMBER} THEN '{Damage.DUR}'
    WHEN e.dur < 0 THEN '{Damage.DUR_NEGATIVE}'
    WHEN NOT e.dur <= {_MAX_TIME_US} THEN '{Damage.DUR_RANGE}'
END"""
_STRUCTURE = orjson.dumps({**_TOP, "args": {key: kind for key, (_, kind) in _ARGS.items()}}).decode()
# Numbers that may be written as names: the text of those that are not numbers, for as_int.
_NAMED_NUMBERS = ("pid", "tid", "stream")

# A name where a number belongs reads as null from the typed struct; its JSON text is then taken
# from the line (rarely: "Spans", "Traces"), for as_int. Likewise a stream written as text.
_SELECT = f"""
SELECT {_DAMAGE} AS damage, e.ph AS ph, e.cat AS cat, e.name AS name, e.pid AS pid, e.tid AS tid, e.ts AS ts, e.dur AS dur,
       {", ".join(f'e.args."{key}" AS {column}' for key, (column, _) in _ARGS.items())},
       -- a CASE, not an OR: the line is searched only where the typed stream is null
       CASE WHEN e.args.stream IS NOT NULL THEN true
            WHEN strpos(line, '"stream"') > 0 THEN json_exists(line, '$.args.stream') ELSE false END
           AS has_stream,
       CASE WHEN e.name = '[memory]' THEN TRY_CAST(json_extract(line, '$.args.Bytes') AS BIGINT) END
           AS memory_bytes,
       -- torch 1.8 and 1.9 wrote "external id" on device work and runtime calls
       CASE WHEN e.args."External id" IS NULL AND strpos(line, '"external id"') > 0
            THEN TRY_CAST(json_extract(line, '$.args."external id"') AS BIGINT) END AS external_id_2021,
       -- events whose arguments are open-ended (counter series, range profiler metrics)
       CASE WHEN e.ph = 'C' OR e.cat = 'cuda_profiler_range' THEN line END AS raw,
       CASE WHEN e.pid IS NULL THEN CAST(json_extract(line, '$.pid') AS VARCHAR) END AS pid_text,
       CASE WHEN e.tid IS NULL THEN CAST(json_extract(line, '$.tid') AS VARCHAR) END AS tid_text,
       CASE WHEN e.args.stream IS NULL AND strpos(line, '"stream"') > 0
            THEN CAST(json_extract(line, '$.args.stream') AS VARCHAR) END AS stream_text
-- OFFSET 0 keeps the parse in its subquery: inlined, it would run once for each use of e
FROM (SELECT line, json_transform(line, '{_STRUCTURE.replace("'", "''")}') AS e,
             json_type(line, {list(_TYPED_PATHS)}) AS t FROM lines OFFSET 0)
"""

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


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
        lines = event_strings(piece, layout, indent)
        table = None if lines is None else self._query(lines)
        if table is None:  # the layout's cut does not read (a guess was wrong): cut by structure
            lines = structural_strings(piece)
            table = None if lines is None else self._query(lines)
        if table is not None:
            return table
        # Neither cut reads (a bare value between events, a damaged event): orjson decides.
        events = parse_events(piece)
        return None if events is None else self.table(_dumped(events))

    def table(self, lines: bytes) -> pa.Table | None:
        """Typed columns of events given one JSON object a line; None if a line is not one."""
        result = self._query(_line_array(lines or b"{}"))
        return result if result is None or lines else result.slice(0, 0)

    def _query(self, events: pa.StringArray) -> pa.Table | None:
        with self._lock:
            self._connection.register("lines", pa.table({"line": events}))
            try:
                result = self._connection.sql(_SELECT).to_arrow_table()
            except (duckdb.Error, UnicodeDecodeError):  # not one JSON object, or not UTF-8
                return None
            finally:
                self._connection.unregister("lines")
        return _named_numbers(result)


def events_from_dicts(events: list[dict[str, Any]], parser: EventParser | None = None) -> pa.Table:
    """Parsed events (``trace["traceEvents"]``) as the typed event table."""
    table = (parser or EventParser()).table(_dumped(events))
    if table is None:  # cannot happen: orjson wrote every line
        raise ValueError("events that orjson wrote did not read back")
    return table


def as_int(value: Any) -> int:
    """A number from a field that should hold one: the number, or a stable one for a name.

    A number outside int64 (``2**64``) is numbered as a name is, so it still fits its column.
    """
    try:
        number = value if isinstance(value, int) else int(value, 0) if isinstance(value, str) else int(value)
    except (TypeError, ValueError, OverflowError):
        number = None
    if number is not None and _INT64_MIN <= number <= _INT64_MAX:
        return number
    # A name where a number belongs ("Spans"): the same number for it on every import.
    return zlib.crc32(str(value).encode()) & 0x7FFFFFFF


def _dumped(events: list[dict[str, Any]] | Any) -> bytes:
    """Events written back one a line (what is not an object is kept, to be counted as damage)."""
    return b"\n".join(orjson.dumps(e) for e in events)


def _line_array(lines: bytes) -> pa.StringArray:
    """The lines as an Arrow string array over the same bytes, each with its newline."""
    ends = np.flatnonzero(np.frombuffer(lines, dtype=np.uint8) == 10) + 1
    offsets = np.concatenate(([0], ends, [] if lines.endswith(b"\n") else [len(lines)]))
    return pa.StringArray.from_buffers(len(offsets) - 1, pa.py_buffer(offsets.astype(np.int32)),
                                       pa.py_buffer(lines))


def _named_numbers(table: pa.Table) -> pa.Table:
    """Fill the numbers a trace wrote as names (``"pid": "Spans"``) with :func:`as_int`."""
    for column in _NAMED_NUMBERS:
        text = table.column(f"{column}_text").combine_chunks()
        if text.null_count < len(text):
            named = pc.is_valid(text)
            values = pa.array([as_int(orjson.loads(t)) for t in text.filter(named).to_pylist()], pa.int64())
            numbers = pc.replace_with_mask(table.column(column).combine_chunks(), named, values)
            table = table.set_column(table.schema.get_field_index(column), column, numbers)
        table = table.drop_columns([f"{column}_text"])
    return table
