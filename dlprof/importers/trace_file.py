"""Trace files into a run directory: ``dlprof import``.

    manifest = import_traces([Path("rank0.json.gz"), Path("rank1.json.gz")], Path("runs/job"))

Each file is one rank (``distributedInfo.rank`` when the files say it and no two say the same,
else their order on the command line). Chrome traces are read in chunks (see
:mod:`dlprof.importers.chunked_json`) and translated by :mod:`dlprof.importers.kineto`, which
keeps every category it does not know as a kind of its own; torch's raw memory timelines go to
the memory table; TensorFlow's and JAX's profiles (``.xplane.pb``) go through
:mod:`dlprof.importers.xplane`. Files are streamed (:mod:`dlprof.importers.trace_stream`): each
piece's rows are written as a chunk before the next piece is read. Nesting, and what it had to
change, is decided once when each rank is compacted.

Hostile input: a file-level field of the wrong type or out of range refuses the file
(:mod:`dlprof.importers.trace_header`); a damaged event is dropped and counted per reason
(:mod:`dlprof.importers.kineto_events`), in the manifest's ``dropped``. A file from which nothing
could be imported is refused. A failed import removes what it wrote, so no run is left behind
marked ``running``.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from dlprof.importers.chunked_json import TraceFormatError, chunk_bytes_for
from dlprof.importers.kineto import KinetoTables
from dlprof.importers.memory_snapshot import SnapshotError, convert_snapshot, read_snapshot
from dlprof.importers.memory_timeline import convert_memory_timeline, is_memory_timeline
from dlprof.importers.plausible_times import within_plausible_times
from dlprof.importers.trace_header import device_list, world_size
from dlprof.importers.trace_stream import (
    ChromeTraceRows,
    TraceImportError,
    TraceInfo,
    checked_header,
    open_trace,
    probe,
    read_whole,
)
from dlprof.importers.xplane import XPlaneError, XPlaneOptions, convert_xspace, read_xspace
from dlprof.keys import RunStatus, StoreTable
from dlprof.store.ids import RANK_SHIFT, SLOT_IMPORT, id_base
from dlprof.store.manifest import ClockDomain, CollectorInfo, HostInfo, Manifest, dropped_text
from dlprof.store.save_jobs import XPLANE_SUFFIX
from dlprof.store.writer import RankWriter

# Bytes read so far and in all, for a progress display.
Progress = Callable[[int, int], None]

__all__ = ["TraceImportError", "dropped_text", "import_traces"]


@dataclass
class _Imported:
    """One file written into its rank: what the manifest says of it."""

    info: TraceInfo
    events: int = 0
    dropped: dict[str, int] = field(default_factory=dict)  # damaged events, per reason
    source: str = "chrome-trace"  # the format, as the manifest names the importer
    header: dict[str, Any] = field(default_factory=dict)  # the whole header, once read
    clocks: list[ClockDomain] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what of the file was not imported, and why


def import_traces(
    paths: list[Path], out_dir: Path, command: list[str] | None = None,
    progress: Progress | None = None,
) -> Manifest:
    """Import trace files as the ranks of one new run.

    Each file is read once more than it is streamed only to learn its rank and time base; its
    rows are written a piece at a time, so memory follows the piece, not the file.

    Args:
        paths: Chrome/Kineto traces (``.json``, ``.json.gz``), raw memory timelines, or XPlane
            profiles (``.xplane.pb``).
        out_dir: the run directory to create; removed again (or emptied, if it existed) if the
            import fails for any reason.
        command: the command line to record in the manifest.
        progress: told bytes done and bytes in all as the files are read.

    Returns:
        The run's manifest.

    Raises:
        TraceImportError: a file is missing, damaged, not a trace, or holds no events.
    """
    infos = [probe(path, path.name.endswith(XPLANE_SUFFIX)) for path in paths]
    ranks = _ranks(infos)
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        return _import(infos, ranks, out_dir, command, progress)
    except BaseException:  # a bug or ^C as well: never leave a half-written run marked running
        if created:
            shutil.rmtree(out_dir, ignore_errors=True)
        else:
            for child in out_dir.iterdir():  # it was empty: leave it so
                shutil.rmtree(child) if child.is_dir() else child.unlink()
        raise


def _import(infos: list[TraceInfo], ranks: list[int], out_dir: Path, command: list[str] | None,
            progress: Progress | None) -> Manifest:
    total = sum(info.path.stat().st_size for info in infos)
    manifest = _manifest(out_dir, [_Imported(info, header=info.header) for info in infos], ranks, command)
    manifest.write(out_dir)
    imported = []
    done = 0
    for rank, info in zip(ranks, infos, strict=True):
        writer = RankWriter(out_dir, rank)

        def advance(position: int, before: int = done) -> None:
            if progress is not None:
                progress(before + position, total)

        imported.append(_import_file(info, writer, advance))
        done += info.path.stat().st_size
        counts, report = writer.compact()
        for name, count in counts.items():
            manifest.counts[name] = manifest.counts.get(name, 0) + count
        for name, count in report.as_counts().items():
            manifest.normalised[name] = manifest.normalised.get(name, 0) + count
        if not any(counts.values()) and imported[-1].source == "chrome-trace":
            raise TraceImportError(f"{info.path}: nothing to import ({_nothing_kept(imported[-1])})")
    final = _manifest(out_dir, imported, ranks, command)
    final.start_ns, final.counts, final.normalised = manifest.start_ns, manifest.counts, manifest.normalised
    for item in imported:
        for reason, count in item.dropped.items():
            final.dropped[reason] = final.dropped.get(reason, 0) + count
    _set_span(final, out_dir)
    final.status = RunStatus.COMPLETE
    final.write(out_dir)
    return final


def _import_file(info: TraceInfo, writer: RankWriter, advance: Callable[[int], None]) -> _Imported:
    if info.kind == "xplane":
        return _import_xplane(info, writer, advance)
    if info.kind == "memory-timeline":
        raw = read_whole(info.path)
        try:
            rows = orjson.loads(raw)
        except orjson.JSONDecodeError as error:
            raise TraceImportError(f"{info.path}: not valid JSON ({error})") from None
        if not is_memory_timeline(rows):
            raise TraceImportError(f"{info.path}: neither a Chrome trace nor a raw memory timeline")
        _write(writer, StoreTable.MEMORY, convert_memory_timeline(rows), info.base_ns)
        advance(info.path.stat().st_size)
        return _Imported(info, events=len(rows), source="memory-timeline")
    if info.kind == "memory-snapshot":
        return _import_snapshot(info, writer, advance)
    item = _Imported(info)
    with open_trace(info.path) as (stream, file):
        rows = ChromeTraceRows(stream, id_base(0, SLOT_IMPORT), chunk_bytes_for(info.path))
        try:
            for piece, events in rows:
                tables = within_plausible_times(piece)
                _keep(writer, tables, info.base_ns)
                item.events += events
                for reason, count in tables.dropped.items():
                    item.dropped[reason] = item.dropped.get(reason, 0) + count
                advance(file.tell())
        except TraceFormatError as error:
            raise TraceImportError(f"{info.path}: {error}") from None
        checked_header(info.path, rows.header)  # with the keys written after the events
        item.header = rows.header
    if item.events == 0:
        raise TraceImportError(f"{info.path}: an empty trace (no events)")
    return item


def _nothing_kept(item: _Imported) -> str:
    """Why a trace with events gave no rows: they were all damaged, or none of a kind kept."""
    if item.dropped:
        return f"its {item.events} events dropped as damaged: {dropped_text(item.dropped)}"
    return f"none of its {item.events} events is a complete event, counter or memory event"


def _import_xplane(info: TraceInfo, writer: RankWriter, advance: Callable[[int], None]) -> _Imported:
    """A TensorFlow or JAX profile (see :mod:`dlprof.importers.xplane`); its times are epoch ns."""
    try:
        tables = convert_xspace(read_xspace(info.path), XPlaneOptions(id_base=id_base(0, SLOT_IMPORT)))
    except XPlaneError as error:
        raise TraceImportError(str(error)) from None
    except OverflowError:  # a time or a number stat past int64: refused, not stored wrapped
        raise TraceImportError(f"{info.path}: a time or number past int64, not an XPlane profile TensorFlow "
                               "writes") from None
    header = {"host_name": tables.hostnames[0] if tables.hostnames else "", "deviceProperties": tables.devices}
    for table, data in ((StoreTable.SLICES, tables.slices), (StoreTable.MEMORY, tables.memory)):
        _write(writer, table, data, 0)
    advance(info.path.stat().st_size)
    return _Imported(info, events=tables.events, source="xplane", header=header, clocks=[tables.clock],
                     dropped=dict(tables.dropped))


def _import_snapshot(info: TraceInfo, writer: RankWriter, advance: Callable[[int], None]) -> _Imported:
    """A PyTorch CUDA memory snapshot (see :mod:`dlprof.importers.memory_snapshot`); epoch times."""
    try:
        rows, skipped = convert_snapshot(read_snapshot(read_whole(info.path)))
    except SnapshotError as error:
        raise TraceImportError(f"{info.path}: {error}") from None
    _write(writer, StoreTable.MEMORY, rows, 0)
    advance(info.path.stat().st_size)
    return _Imported(info, events=rows.num_rows + sum(skipped.values()), source="memory-snapshot",
                     notes=[f"{count} {what} entries not imported" for what, count in sorted(skipped.items())])


def _keep(writer: RankWriter, tables: KinetoTables, base_ns: int) -> None:
    for table, data in (
        (StoreTable.SLICES, tables.slices),
        (StoreTable.MEMORY, tables.memory),
        (StoreTable.COUNTERS, tables.counters),
        (StoreTable.METRICS, tables.metrics),
    ):
        _write(writer, table, data, base_ns)


def _write(writer: RankWriter, table: StoreTable, data: pa.Table, base_ns: int) -> None:
    if data.num_rows:
        writer.write_chunk(table, _rebase(data, base_ns, writer.rank), "import")


def _ranks(infos: list[TraceInfo]) -> list[int]:
    stated = [info.stated_rank for info in infos]
    if all(rank is not None for rank in stated) and len(set(stated)) == len(stated):
        return [rank for rank in stated if rank is not None]
    return list(range(len(infos)))


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
    out_dir: Path, parsed: list[_Imported], ranks: list[int], command: list[str] | None
) -> Manifest:
    first = parsed[0].header  # checked: see trace_header
    world = world_size(first)
    notes = [f"rank {rank}: {item.info.path.name} ({item.events} events{_dropped_note(item)})"
             + "".join(f"; {n}" for n in item.notes)
             for rank, item in zip(ranks, parsed, strict=True)]
    return Manifest(
        name=out_dir.name,
        command=command or ["dlprof", "import", *(str(item.info.path) for item in parsed)],
        status=RunStatus.RUNNING,
        writer_pid=os.getpid(),
        start_ns=time.time_ns(),
        host=HostInfo(hostname=str(first.get("host_name", ""))),
        devices=device_list(first),
        collectors=[CollectorInfo(name=f"import:{source}", version=str(first.get("schemaVersion", "")), notes=notes)
                    for source in dict.fromkeys(item.source for item in parsed)],
        clocks=[clock for item in parsed for clock in item.clocks],
        ranks=sorted(ranks),
        world_size=world or max(len(ranks), max(ranks) + 1),
    )


def _dropped_note(item: _Imported) -> str:
    if not item.dropped:
        return ""
    return f"; dropped as damaged: {dropped_text(item.dropped)}"


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
