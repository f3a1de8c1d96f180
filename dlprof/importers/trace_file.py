"""Trace files into a run directory: ``dlprof import``.

    manifest = import_traces([Path("rank0.json.gz"), Path("rank1.json.gz")], Path("runs/job"))

Each file is one rank (``distributedInfo.rank`` when the files say it and no two say the same,
else their order on the command line). Chrome traces are read in chunks (see
:mod:`dlprof.importers.chunked_json`) and translated by :mod:`dlprof.importers.kineto`, which
keeps every category it does not know as a kind of its own; torch's raw memory timelines go to
the memory table; TensorFlow's and JAX's profiles (``.xplane.pb``) go through
:mod:`dlprof.importers.xplane`. Nesting, and what it had to change, is decided once when each rank
is compacted.
"""

from __future__ import annotations

import gzip
import os
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from dlprof.importers.chunked_json import ChunkedTrace, TraceFormatError
from dlprof.importers.kineto import KinetoOptions, KinetoTables, convert_trace
from dlprof.importers.memory_timeline import convert_memory_timeline, is_memory_timeline
from dlprof.importers.xplane import XPLANE_SUFFIX, XPlaneError, XPlaneOptions, convert_xspace, read_xspace
from dlprof.keys import RunStatus, StoreTable
from dlprof.store.ids import RANK_SHIFT, SLOT_IMPORT, id_base
from dlprof.store.manifest import ClockDomain, CollectorInfo, HostInfo, Manifest
from dlprof.store.writer import RankWriter

# Bytes parsed so far and in all, for a progress display.
Progress = Callable[[int, int], None]


class TraceImportError(ValueError):
    """A file cannot be imported; the message is one line naming it and why."""


@dataclass
class _ParsedFile:
    """One file translated, its times relative to a base it may only state at its end."""

    path: Path
    header: dict[str, Any]
    tables: dict[StoreTable, list[pa.Table]] = field(default_factory=dict)
    events: int = 0
    source: str = "chrome-trace"  # the format, as the manifest names the importer
    clocks: list[ClockDomain] = field(default_factory=list)

    @property
    def stated_rank(self) -> int | None:
        info = self.header.get("distributedInfo")
        rank = info.get("rank") if isinstance(info, dict) else None
        return rank if isinstance(rank, int) and rank >= 0 else None


def read_bytes(path: Path) -> bytes:
    """A file's contents, gunzipped when it is gzip; a damaged file raises :class:`TraceImportError`."""
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise TraceImportError(f"{path}: cannot read ({error.strerror or error})") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as error:
            raise TraceImportError(f"{path}: damaged or truncated gzip file ({error})") from None
    return raw


def import_traces(
    paths: list[Path], out_dir: Path, command: list[str] | None = None,
    progress: Progress | None = None,
) -> Manifest:
    """Import trace files as the ranks of one new run.

    Args:
        paths: Chrome/Kineto traces (``.json``, ``.json.gz``), raw memory timelines, or XPlane
            profiles (``.xplane.pb``).
        out_dir: the run directory to create.
        command: the command line to record in the manifest.
        progress: told bytes done and bytes in all as the files are parsed.

    Returns:
        The run's manifest.

    Raises:
        TraceImportError: a file is missing, damaged, not a trace, or holds no events.
    """
    total = sum(p.stat().st_size for p in paths if p.is_file())
    done = 0
    parsed: list[_ParsedFile] = []
    for path in paths:
        if not path.is_file():
            raise TraceImportError(f"{path}: no such file")
        file_size = path.stat().st_size

        def advance(fraction: float, before: int = done, size: int = file_size) -> None:
            if progress is not None:
                progress(before + int(size * fraction), total)

        parsed.append(_parse_file(path, advance))
        done += file_size
    ranks = _ranks(parsed)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = _manifest(out_dir, parsed, ranks, command)
    manifest.write(out_dir)
    for rank, item in zip(ranks, parsed, strict=True):
        writer = RankWriter(out_dir, rank)
        shift = _time_base(item.header)
        for table, batches in item.tables.items():
            for batch in batches:
                writer.write_chunk(table, _rebase(batch, shift, rank), "import")
        counts, report = writer.compact()
        for name, count in counts.items():
            manifest.counts[name] = manifest.counts.get(name, 0) + count
        for name, count in report.as_counts().items():
            manifest.normalised[name] = manifest.normalised.get(name, 0) + count
    _set_span(manifest, out_dir)
    manifest.status = RunStatus.COMPLETE
    manifest.write(out_dir)
    return manifest


def _parse_file(path: Path, advance: Callable[[float], None]) -> _ParsedFile:
    if path.name.endswith(XPLANE_SUFFIX):
        return _parse_xplane(path, advance)
    raw = read_bytes(path)
    if raw.lstrip()[:2] == b"[[":  # a raw memory timeline is an array of arrays
        try:
            rows = orjson.loads(raw)
        except orjson.JSONDecodeError as error:
            raise TraceImportError(f"{path}: not valid JSON ({error})") from None
        if not is_memory_timeline(rows):
            raise TraceImportError(f"{path}: neither a Chrome trace nor a raw memory timeline")
        item = _ParsedFile(path, header={})
        item.tables[StoreTable.MEMORY] = [convert_memory_timeline(rows)]
        item.events = len(rows)
        advance(1.0)
        return item
    trace = ChunkedTrace(raw)
    item = _ParsedFile(path, header={})
    next_id = id_base(0, SLOT_IMPORT)
    try:
        for events in trace.chunks():
            tables = convert_trace({"traceEvents": events}, KinetoOptions(id_base=next_id))
            next_id += tables.slices.num_rows
            _keep(item, tables)
            item.events += len(events)
            advance(trace.consumed / max(trace.total, 1))
    except TraceFormatError as error:
        raise TraceImportError(f"{path}: {error}") from None
    item.header = trace.header
    if item.events == 0:
        raise TraceImportError(f"{path}: an empty trace (no events)")
    advance(1.0)
    return item


def _parse_xplane(path: Path, advance: Callable[[float], None]) -> _ParsedFile:
    """A TensorFlow or JAX profile (see :mod:`dlprof.importers.xplane`); its times are epoch ns."""
    try:
        tables = convert_xspace(read_xspace(path), XPlaneOptions(id_base=id_base(0, SLOT_IMPORT)))
    except XPlaneError as error:
        raise TraceImportError(str(error)) from None
    header = {"host_name": tables.hostnames[0] if tables.hostnames else "", "deviceProperties": tables.devices}
    item = _ParsedFile(path, header=header, events=tables.events, source="xplane", clocks=[tables.clock])
    for table, data in ((StoreTable.SLICES, tables.slices), (StoreTable.MEMORY, tables.memory)):
        if data.num_rows:
            item.tables[table] = [data]
    advance(1.0)
    return item


def _keep(item: _ParsedFile, tables: KinetoTables) -> None:
    for table, data in (
        (StoreTable.SLICES, tables.slices),
        (StoreTable.MEMORY, tables.memory),
        (StoreTable.COUNTERS, tables.counters),
        (StoreTable.METRICS, tables.metrics),
    ):
        if data.num_rows:
            item.tables.setdefault(table, []).append(data)


def _ranks(parsed: list[_ParsedFile]) -> list[int]:
    stated = [item.stated_rank for item in parsed]
    if all(rank is not None for rank in stated) and len(set(stated)) == len(stated):
        return [rank for rank in stated if rank is not None]
    return list(range(len(parsed)))


def _time_base(header: dict[str, Any]) -> int:
    base = header.get("baseTimeNanoseconds", 0)
    return int(base) if isinstance(base, (int, float)) else 0


def _rebase(batch: pa.Table, base_ns: int, rank: int) -> pa.Table:
    """Move a chunk onto epoch time (the base a trace may state only after its events) and rank."""
    for column in ("start_ns", "ts_ns"):
        if column in batch.column_names and base_ns:
            index = batch.schema.get_field_index(column)
            batch = batch.set_column(index, column, pc.add(batch.column(column), base_ns))
    for column in ("id", "slice_id"):
        if column in batch.column_names and rank:
            index = batch.schema.get_field_index(column)
            batch = batch.set_column(index, column, pc.add(batch.column(column), rank << RANK_SHIFT))
    return batch


def _manifest(
    out_dir: Path, parsed: list[_ParsedFile], ranks: list[int], command: list[str] | None
) -> Manifest:
    first = parsed[0].header
    devices = [d for d in first.get("deviceProperties", ()) if isinstance(d, dict)]
    info = first.get("distributedInfo") if isinstance(first.get("distributedInfo"), dict) else {}
    world = info.get("world_size") if isinstance(info, dict) else None
    notes = [f"rank {rank}: {item.path.name} ({item.events} events)" for rank, item in zip(ranks, parsed, strict=True)]
    return Manifest(
        name=out_dir.name,
        command=command or ["dlprof", "import", *(str(item.path) for item in parsed)],
        status=RunStatus.RUNNING,
        writer_pid=os.getpid(),
        start_ns=time.time_ns(),
        host=HostInfo(hostname=str(first.get("host_name", ""))),
        devices=devices,
        collectors=[CollectorInfo(name=f"import:{source}", version=str(first.get("schemaVersion", "")), notes=notes)
                    for source in dict.fromkeys(item.source for item in parsed)],
        clocks=[clock for item in parsed for clock in item.clocks],
        ranks=sorted(ranks),
        world_size=world if isinstance(world, int) and world > 0 else max(len(ranks), max(ranks) + 1),
    )


def _set_span(manifest: Manifest, out_dir: Path) -> None:
    """Start and end of the run: the first and last instant any rank recorded."""
    import pyarrow.dataset as ds

    slices = out_dir / str(StoreTable.SLICES)
    if not slices.is_dir():
        return
    table = ds.dataset(slices, partitioning="hive").to_table(columns=["start_ns", "dur_ns"])
    if table.num_rows:
        ends = pc.add(table.column("start_ns"), table.column("dur_ns"))
        manifest.start_ns = pc.min(table.column("start_ns")).as_py()
        manifest.end_ns = pc.max(ends).as_py()
