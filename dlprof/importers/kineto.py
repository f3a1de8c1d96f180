"""PyTorch profiler (Kineto) Chrome traces into the event store's tables.

The torch collector saves Kineto's own trace at the end of each profiling cycle (in C++, a few
microseconds per event) and converts it here, so a native run and an imported trace go through
one translation layer::

    trace = read_trace(Path("rank0.pt.trace.json.gz"))
    tables = convert_trace(trace, KinetoOptions(id_base=0))

A trace is first read into one typed table of events (:mod:`dlprof.importers.kineto_events`),
then translated column by column (:mod:`dlprof.importers.kineto_rows`): no Python code runs per
event. :func:`convert_trace` takes a parsed trace; ``dlprof import`` streams files through
:func:`convert_events` a piece at a time (:mod:`dlprof.importers.trace_file`).
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from dlprof.importers.chunked_json import ChunkedTrace, chunk_bytes_for, gc_paused, open_stream
from dlprof.importers.damage import Damage
from dlprof.importers.kineto_events import EventParser, events_from_dicts
from dlprof.importers.kineto_rows import (
    STEP_PREFIX,
    SliceNaming,
    counter_rows,
    memory_rows,
    metric_rows,
    slice_rows,
)
from dlprof.importers.trace_header import base_time_ns, device_list
from dlprof.keys import CLOCK_MARKER

__all__ = ["STEP_PREFIX", "KinetoOptions", "KinetoTables", "clock_offset", "convert_events",
           "convert_file", "convert_trace", "drop_damaged", "gc_paused", "read_trace"]

# Slices that describe the trace rather than the program.
_SKIPPED_CATEGORIES = frozenset({"Trace"})
_MEMORY_EVENT = "[memory]"
# Phases read (X, C, i) or knowingly left out (metadata, flows, other instants).
_KNOWN_PHASES = frozenset({"X", "C", "M", "s", "f", "t", "i", "I"})


@dataclass(frozen=True)
class KinetoOptions:
    """How to translate one trace."""

    id_base: int  # the first slice id to hand out (see dlprof.store.ids)
    clock_offset_ns: int = 0  # subtracted from every timestamp to reach the run's clock
    # dlprof-clock epoch ns read just before and after the clock marker range; when set, the
    # offset is measured from the marker instead of taken from clock_offset_ns.
    marker_window_ns: tuple[int, int] | None = None
    region_names: frozenset[str] = frozenset()  # user annotations that were dlprof regions
    drop_steps: bool = False  # ProfilerStep#N ranges are recorded elsewhere (by the session)
    device_pid: int | None = None  # pid for device slices; None keeps the trace's


@dataclass
class KinetoTables:
    """One trace translated: rows per table, and the clock marker if the trace had one."""

    slices: pa.Table
    memory: pa.Table
    counters: pa.Table
    metrics: pa.Table  # counter values measured over one slice (cuda_profiler_range)
    clock_offset_ns: int = 0
    clock_bounds_ns: tuple[int, int] | None = None
    skipped: dict[str, int] = field(default_factory=dict)
    # Events dropped as damaged, per reason (a Damage value): see dlprof.importers.kineto_events.
    dropped: dict[str, int] = field(default_factory=dict)
    # The trace's deviceProperties (GPU name, SMs, memory...), as Kineto recorded them.
    devices: list[dict[str, Any]] = field(default_factory=list)


def read_trace(path: Path) -> dict[str, Any]:
    """Parse a Chrome trace file, gzipped or not."""
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    with gc_paused():
        data = orjson.loads(raw)
    if isinstance(data, list):  # the bare-array form of the Chrome format
        return {"traceEvents": data}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a Chrome trace (top level is {type(data).__name__})")
    return data


def convert_trace(trace: dict[str, Any], options: KinetoOptions) -> KinetoTables:
    """Translate a parsed Kineto trace into slices, memory and counter rows.

    Args:
        trace: the parsed JSON object (see :func:`read_trace`).
        options: ids, clock offset and naming decisions for this trace.

    Returns:
        The rows, with epoch-nanosecond timestamps on the run's clock.

    Raises:
        HeaderError: ``baseTimeNanoseconds`` or ``deviceProperties`` is wrong.
    """
    events = trace.get("traceEvents", ())
    tables = convert_events(events_from_dicts(events if isinstance(events, list) else []), options,
                            base_time_ns(trace))
    tables.devices = device_list(trace)
    return tables


def convert_file(path: Path, options: KinetoOptions) -> KinetoTables:
    """:func:`convert_trace` of :func:`read_trace` of a file, without a Python object per event.

    The file is streamed through the same typed event table the import uses; the rows are those
    of ``convert_trace(read_trace(path), options)``.

    Raises:
        OSError: the file cannot be read.
        TraceFormatError: it is not a Chrome trace.
        HeaderError: ``baseTimeNanoseconds`` or ``deviceProperties`` is wrong.
    """
    parser = EventParser()
    with open_stream(path) as (stream, _):
        trace = ChunkedTrace(stream, chunk_bytes_for(path))
        pieces = list(trace.pieces(lambda piece: parser(piece, trace.layout, trace.indent)))
    events = pa.concat_tables(pieces) if pieces else parser.table(b"")
    assert events is not None
    tables = convert_events(events, options, base_time_ns(trace.header))
    tables.devices = device_list(trace.header)
    if trace.invalid_events:  # read past, one by one (see dlprof.importers.json_repair)
        tables.dropped[str(Damage.INVALID_JSON)] = trace.invalid_events
    return tables


def convert_events(events: pa.Table, options: KinetoOptions, base_ns: int = 0) -> KinetoTables:
    """Translate typed events (see :mod:`dlprof.importers.kineto_events`) into the store's rows.

    Args:
        events: the events of a trace, or of a piece of one, in file order.
        options: ids, clock offset and naming decisions; slice ids are handed out in file order.
        base_ns: the trace's ``baseTimeNanoseconds`` (0 where it is added later).

    Returns:
        The rows, with epoch-nanosecond timestamps on the run's clock.
    """
    events, damaged = drop_damaged(events)
    phase = events.column("ph")
    category = events.column("cat").fill_null("")
    name = events.column("name").fill_null("")
    complete = pc.fill_null(pc.equal(phase, "X"), False)
    annotation = pc.and_(complete, pc.equal(category, "user_annotation"))
    marker_rows = pc.and_(annotation, pc.equal(name, CLOCK_MARKER))
    dropped = pc.or_(pc.is_in(category, pa.array(sorted(_SKIPPED_CATEGORIES))), marker_rows)
    if options.drop_steps:
        dropped = pc.or_(dropped, pc.and_(annotation, pc.starts_with(name, STEP_PREFIX)))
    kept = events.filter(pc.and_(complete, pc.invert(dropped)))

    offset, bounds = options.clock_offset_ns, None
    marker = events.filter(marker_rows)
    if marker.num_rows and options.marker_window_ns is not None:
        ts, dur = (marker.column(c)[0].as_py() or 0.0 for c in ("ts", "dur"))
        marker_start = base_ns + round(ts * 1000)
        offset, bounds = clock_offset((marker_start, marker_start + round(dur * 1000)), options.marker_window_ns)
    shift = base_ns - offset

    naming = SliceNaming(options.id_base, options.region_names, options.device_pid)
    slices = slice_rows(kept, naming, shift)
    is_memory = pc.fill_null(pc.and_(pc.equal(phase, "i"), pc.equal(name, _MEMORY_EVENT)), False)
    memory = memory_rows(events.filter(is_memory), shift)
    counters, counter_values_left_out = counter_rows(events.filter(pc.fill_null(pc.equal(phase, "C"), False)), shift)
    metrics, metric_values_left_out = metric_rows(kept, slices.column("id"))
    if counter_values_left_out + metric_values_left_out:
        damaged[str(Damage.VALUE)] = counter_values_left_out + metric_values_left_out
    known = pc.fill_null(pc.is_in(phase, pa.array(sorted(_KNOWN_PHASES))), False)
    skipped: dict[str, int] = {}
    for value in phase.filter(pc.invert(known)).to_pylist():
        skipped[str(value)] = skipped.get(str(value), 0) + 1
    return KinetoTables(slices, memory, counters, metrics, offset, bounds, skipped, damaged)


def drop_damaged(events: pa.Table) -> tuple[pa.Table, dict[str, int]]:
    """The events whose fields passed the checks, and how many others were dropped, per reason.

    Args:
        events: typed events with their ``damage`` column (see :class:`Damage`).

    Returns:
        The sound events, and ``{reason: count}`` for the rest.
    """
    damage = events.column("damage")
    if damage.null_count == len(damage):
        return events, {}
    counts = pc.value_counts(damage.drop_null()).to_pylist()
    dropped = {str(Damage(row["values"])): row["counts"] for row in counts}
    return events.filter(pc.is_null(damage)), dropped


def clock_offset(
    marker_ns: tuple[int, int], window_ns: tuple[int, int]
) -> tuple[int, tuple[int, int]]:
    """The shift from Kineto's clock to dlprof's, from one range timed on both.

    The marker's start and end on Kineto's clock lie inside the window dlprof read around it;
    every offset that keeps them inside is consistent. Zero is kept when it is one of them.

    Returns:
        The offset to subtract from Kineto times, and the consistent bounds.
    """
    low = marker_ns[1] - window_ns[1]
    high = marker_ns[0] - window_ns[0]
    if low > high:  # inconsistent readings: take the middle
        return (low + high) // 2, (low, high)
    offset = 0 if low <= 0 <= high else (low if low > 0 else high)
    return offset, (low, high)
