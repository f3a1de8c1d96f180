"""speedscope's JSON file format: one evented profile per CPU thread and per device stream.

Open the file at https://www.speedscope.app (or with ``speedscope FILE`` from npm); the format
is speedscope's own, https://www.speedscope.app/file-format-schema.json::

    SpeedscopeExporter().export(dlprof.load("runs/cnn"), Path("cnn.speedscope.json"))

Layout:

* ``shared.frames``: one frame per distinct slice name;
* ``profiles``: an ``evented`` profile, in nanoseconds, per CPU thread (rank, pid, thread) and
  per device stream (rank, device, stream). Each slice opens (``O``) its frame at its start and
  closes (``C``) it at its end. speedscope takes only properly nested events in time order: on a
  thread, slices nest as the store nested them (children end within their parent; a store that
  did not clip them is clipped here); work on a stream never nests, so a slice that starts before
  the previous one on its stream has ended goes to a profile of its own beside the stream,
  ``... (overlap 1)``, with its duration untouched;
* times count from the run's first slice, and every profile spans the whole run
  (``startValue`` 0, ``endValue`` the run's last end), so threads and streams line up in
  speedscope's time-order view and a stream's share of its profile is its busy fraction;
* ``activeProfileIndex`` is the CPU thread with the most slices (usually the main thread).

Counters and memory rows have no place in the format and are not written. The extension is
``.speedscope.json``, as speedscope names its own files, leaving ``.json`` to the Chrome exporter.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from dlprof.exporters.base import Exporter, Ticker, atomic_output
from dlprof.exporters.slice_walks import python_values, slices_of
from dlprof.keys import StoreTable
from dlprof.store.reader import Run

SCHEMA_URL = "https://www.speedscope.app/file-format-schema.json"
UNIT = "nanoseconds"
EXPORTER = "dlprof"

_TRACK = ["rank", "pid", "device", "tid", "lane"]
_COLUMNS = [*_TRACK, "name", "start_ns", "dur_ns"]

Profile = tuple[int, int, str, int, int]  # (rank, pid, device, tid, lane)


class SpeedscopeExporter(Exporter):
    """The run as one speedscope file, every rank's threads and streams in it."""

    format_name = "speedscope"
    file_extension = ".speedscope.json"
    binary = False
    description = "speedscope JSON, a profile per thread and stream (speedscope.app)"

    def write(self, run: Run, path: Path, ticker: Ticker) -> list[Path]:
        slices = with_lanes(slices_of(run))
        base = pc.min(slices.column("start_ns")).as_py()
        end = pc.max(pc.add(slices.column("start_ns"), slices.column("dur_ns"))).as_py()
        sizes = profile_sizes(slices)
        names = profile_names(list(sizes), several_ranks=len({p[0] for p in sizes}) > 1)
        header = {
            "$schema": SCHEMA_URL,
            "name": run.manifest.name or run.path.name,
            "exporter": EXPORTER,
            "activeProfileIndex": _main_thread(sizes),
        }
        with atomic_output(path) as file:
            # The header object left open: the profiles follow, then the frames they refer
            # to, which are all known only once every slice has been seen.
            file.write(orjson.dumps(header)[:-1] + b',"profiles":[\n')
            writer = _ProfileWriter(file, names, end - base)
            for batch in _batches(slices, self.batch_rows):
                writer.add(batch, base)
                ticker.advance(len(batch["name"]))
            writer.finish()
            frames = [{"name": name} for name in writer.frames]
            file.write(b'\n],"shared":' + orjson.dumps({"frames": frames}) + b"}\n")
        for table in (StoreTable.COUNTERS, StoreTable.MEMORY):
            ticker.advance(run.arrow(table).num_rows)  # read, but the format has no place for them
        return [path]


def with_lanes(slices: pa.Table) -> pa.Table:
    """The slices with a ``lane`` column: which profile of its stream each slice goes to.

    A CPU slice is in lane 0. A device slice takes the first lane of its stream that is free
    when it starts (every slice there has ended), in start order; lane 0 is the stream itself.

    Args:
        slices: the slices table as :func:`~dlprof.exporters.base.slices_of` gives it.

    Returns:
        The same rows with an ``int32`` column ``lane``.
    """
    lane = np.zeros(slices.num_rows, dtype=np.int32)
    on_device = np.flatnonzero(pc.not_equal(slices.column("device"), "cpu").to_numpy(zero_copy_only=False))
    if len(on_device):
        device = slices.take(pa.array(on_device))
        order = pc.sort_indices(device, sort_keys=[(k, "ascending") for k in
                                                  ("rank", "pid", "device", "tid", "start_ns")]).to_numpy()
        keys = list(zip(*(device.column(k).take(order).to_pylist() for k in ("rank", "pid", "device", "tid")),
                        strict=True))
        starts = device.column("start_ns").to_numpy()[order].tolist()
        ends = (device.column("start_ns").to_numpy() + device.column("dur_ns").to_numpy())[order].tolist()
        lanes = [0] * len(order)
        stream: tuple[Any, ...] | None = None
        free_at: list[int] = []  # per lane of the current stream: when its last slice ends
        for i, start in enumerate(starts):
            if keys[i] != stream:
                stream, free_at = keys[i], []
            k = next((k for k, free in enumerate(free_at) if free <= start), len(free_at))
            if k == len(free_at):
                free_at.append(0)
            free_at[k] = ends[i]
            lanes[i] = k
        lane[on_device[order]] = lanes
    return slices.append_column("lane", pa.array(lane))


def profile_sizes(slices: pa.Table) -> dict[Profile, int]:
    """The profiles of a run, in the order they are written, with their numbers of slices.

    Args:
        slices: the slices, with the ``lane`` column of :func:`with_lanes`.

    Returns:
        ``{(rank, pid, device, tid, lane): slices}``, in (rank, pid, device, tid, lane) order.
    """
    counted = slices.select(_TRACK).group_by(_TRACK).aggregate([([], "count_all")])
    rows = counted.sort_by([(k, "ascending") for k in _TRACK]).to_pylist()
    return {tuple(r[k] for k in _TRACK): r["count_all"] for r in rows}


def profile_names(profiles: list[Profile], several_ranks: bool) -> dict[Profile, str]:
    """What speedscope's profile menu shows for each profile.

    Args:
        profiles: the profiles, as :func:`profile_sizes` gives them.
        several_ranks: whether to say which rank each is on.

    Returns:
        ``thread TID (pid PID)`` for a CPU thread, ``DEVICE stream TID`` for a device stream
        (and ``... (overlap N)`` for its lanes), after ``rank R: `` when the run has several ranks.
    """
    names = {}
    for profile in profiles:
        rank, pid, device, tid, lane = profile
        name = f"thread {tid} (pid {pid})" if device == "cpu" else f"{device} stream {tid}"
        if lane:
            name += f" (overlap {lane})"
        names[profile] = f"rank {rank}: {name}" if several_ranks else name
    return names


def _main_thread(sizes: dict[Profile, int]) -> int:
    """The index of the CPU profile with the most slices (of the largest one if none is on a CPU)."""
    order = list(sizes)
    on_cpu = [p for p in order if p[2] == "cpu"] or order
    return order.index(max(on_cpu, key=lambda p: sizes[p]))


def _batches(slices: pa.Table, batch_rows: int) -> Iterator[dict[str, list[Any]]]:
    """Slices by profile, then start, then depth (a parent before the children starting with it)."""
    keys = [*_TRACK, "start_ns", "depth"]
    order = pc.sort_indices(slices.select(keys), sort_keys=[(k, "ascending") for k in keys])
    wanted = slices.select(_COLUMNS)
    for offset in range(0, len(order), batch_rows):
        batch = wanted.take(order[offset : offset + batch_rows])
        yield {name: python_values(batch.column(name)) for name in _COLUMNS}


@dataclass
class _ProfileWriter:
    """Evented profiles, written as the sorted slices come, a batch at a time."""

    file: IO[bytes]
    names: dict[Profile, str]
    end_value: int  # the run's last end, after the base
    frames: dict[str, int] = field(default_factory=dict)
    _profile: Profile | None = None
    _open: list[tuple[int, int]] = field(default_factory=list)  # (frame, end), innermost last
    _events: list[dict[str, Any]] = field(default_factory=list)
    _written: int = 0  # profiles begun
    _first_event: bool = True

    def add(self, batch: dict[str, list[Any]], base: int) -> None:
        """Open and close the frames of a batch of slices."""
        for i, name in enumerate(batch["name"]):
            profile = tuple(batch[k][i] for k in _TRACK)
            if profile != self._profile:
                self._end_profile()
                self._begin_profile(profile)
            start = batch["start_ns"][i] - base
            end = start + batch["dur_ns"][i]
            # A slice that ended by this start is not this slice's parent (the store's rule).
            self._close(until=start)
            if self._open:
                end = min(end, self._open[-1][1])  # the store clips; an unnested store is not
            frame = self.frames.get(name)
            if frame is None:
                frame = self.frames[name] = len(self.frames)
            self._events.append({"type": "O", "frame": frame, "at": start})
            self._open.append((frame, end))
        self._flush()

    def finish(self) -> None:
        """Close the last profile."""
        self._end_profile()

    def _close(self, until: int | None) -> None:
        """Close the open frames that end by ``until`` (all of them for None), innermost first."""
        while self._open and (until is None or self._open[-1][1] <= until):
            frame, end = self._open.pop()
            self._events.append({"type": "C", "frame": frame, "at": end})

    def _begin_profile(self, profile: Profile) -> None:
        header = {"type": "evented", "name": self.names[profile], "unit": UNIT, "startValue": 0,
                  "endValue": self.end_value}
        if self._written:
            self.file.write(b",\n")
        self.file.write(orjson.dumps(header)[:-1] + b',"events":[\n')
        self._profile = profile
        self._written += 1
        self._first_event = True

    def _end_profile(self) -> None:
        if self._profile is None:
            return
        self._close(until=None)
        self._flush()
        self.file.write(b"\n]}")
        self._profile = None

    def _flush(self) -> None:
        if not self._events:
            return
        if not self._first_event:
            self.file.write(b",\n")
        self._first_event = False
        self.file.write(b",\n".join(map(orjson.dumps, self._events)))
        self._events.clear()
