"""PM samples in a run, and their attribution to kernels once a rank of the run is final.

The ``cupti_metrics`` collector writes each PM sample to the counters table, on device
``cuda:N`` at the sample's end: one row per metric on track ``cupti.<metric>`` and one on
:data:`DURATION_TRACK`, the sample's length in ns (so that its start is known exactly). When a
rank is made final (:meth:`dlprof.store.writer.RankWriter.compact` at the end of a session,
:func:`dlprof.recording.finisher.finish_pending` for a killed run), :func:`attribute_rank`
shares the samples among that rank's kernel slices on the same device, whichever collector
recorded them (cupti, torch) and in whatever save they came, by the method of
:mod:`dlprof.store.sample_attribution`, and writes the values as one more part of the metrics
table: ``cupti:<metric>`` per kernel, method ``sampled``. That part's footer holds what was done
(:func:`read_summary`), which the collector turns into its notes::

    summary = attribute_rank(run_dir, rank=0)   # RankSummary(devices={"cuda:0": ...}); None: nothing to do
    read_summary(run_dir, 0)                    # the same, read back from the part's footer

Memory: the rank's kernels (id, start, end, name) are held; the samples are read one file (one
save) at a time, and each file's share of every kernel is added up.
"""

from __future__ import annotations

import itertools
import json
import statistics
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dlprof.keys import Kind, StoreTable
from dlprof.store.layout import part_name, rank_dir, rank_files
from dlprof.store.sample_attribution import FloatArray, IntArray, own_shares, pool_short_kernels
from dlprof.store.schema import SCHEMAS, conform, write_parquet

TRACK_PREFIX = "cupti."  # counters: cupti.<metric>, a PM sample's count
DURATION_TRACK = "cupti.sample_duration"  # counters: each PM sample's length (ns), at its end
METRIC_PREFIX = "cupti:"  # metrics: cupti:<metric> of one kernel
SAMPLED = "sampled"
SUMMARY_KEY = "dlprof.pm_attribution"  # in the footer of the metrics part attribution wrote


@dataclass
class DeviceSummary:
    """What attribution did with one device's samples."""

    metrics: list[str]  # as sampled (Perfworks names)
    samples: int
    kernels: int  # kernel slices of the device in the rank
    attributed: int  # kernels a sample overlapped: those given values
    short: int  # of them, shorter than the sampling interval (given their name's pooled value)
    pooled_names: int
    interval_ns: int
    # Per metric, the share of the samples' counts that no kernel took (idle time, other processes).
    unattributed: dict[str, float] = field(default_factory=dict)
    # Samples left out, per reason: they overlapped the sample before, a metric had no value.
    dropped: dict[str, int] = field(default_factory=dict)

    def note(self, device: str) -> str:
        """One line for the collector's notes in the manifest."""
        dropped = "".join(f"; {count:,} samples left out ({why})" for why, count in self.dropped.items())
        if not self.kernels:
            return (f"{device}: no kernel slices to attribute {self.samples:,} samples to "
                    f"(collect them with the cupti or torch collector){dropped}")
        first = self.metrics[0] if self.metrics else ""
        idle = self.unattributed.get(first)
        outside = f"; {100 * idle:.0f} % of {first} fell outside every kernel" if idle is not None else ""
        pooled = (f", {self.short:,} shorter than the {self.interval_ns:,} ns sampling interval given their "
                  f"name's pooled value ({self.pooled_names} names)" if self.short else "")
        return (f"{device}: {self.samples:,} samples shared among {self.attributed:,} of its "
                f"{self.kernels:,} kernels{pooled}{outside}{dropped}")


@dataclass
class RankSummary:
    """What :func:`attribute_rank` did in one rank: per device, or why it could not."""

    devices: dict[str, DeviceSummary] = field(default_factory=dict)
    problem: str = ""  # why the samples found were not attributed; "" when they were

    def notes(self) -> list[str]:
        """Lines for the collector's notes."""
        return [summary.note(device) for device, summary in self.devices.items()] + (
            [self.problem] if self.problem else [])


def read_summary(run_dir: Path, rank: int) -> RankSummary | None:
    """What :func:`attribute_rank` did in this rank, from its part's footer; None if it never ran."""
    for path in reversed(rank_files(rank_dir(run_dir, StoreTable.METRICS, rank)).parts):  # it is made last
        found = (pq.read_schema(path).metadata or {}).get(SUMMARY_KEY.encode())
        if found is not None:
            data = json.loads(found)
            return RankSummary({device: DeviceSummary(**fields) for device, fields in data["devices"].items()},
                               str(data.get("problem", "")))
    return None


def attribute_rank(run_dir: Path, rank: int, metadata: Mapping[str, str] | None = None) -> RankSummary | None:
    """Share a rank's PM samples among its kernels and write the values as a metrics part.

    Done once per rank: a rank whose attribution part exists is left alone. Once samples are
    found, a failure to read or share them is written down (the part holds no rows, its footer
    the reason) rather than raised: the rank's saves are final whatever happens here.

    Args:
        run_dir: the run.
        rank: the partition.
        metadata: footer entries for the part (rank, world size, host), as the writer's.

    Returns:
        What was done; None when the rank has no PM samples or was attributed before.
    """
    pieces = _pieces(run_dir, rank)
    first = next(pieces, None)
    if first is None or read_summary(run_dir, rank) is not None:
        return None
    rows = SCHEMAS[StoreTable.METRICS].empty_table()
    try:
        kernels = _kernels(run_dir, rank)
        devices: dict[str, _DeviceShares] = {}
        for piece in itertools.chain([first], pieces):
            shares = devices.get(piece.device)
            if shares is None:
                shares = devices[piece.device] = _DeviceShares(kernels.get(piece.device, _Kernels.none()))
            shares.add(piece)
        summary = RankSummary()
        tables = []
        for device, shares in devices.items():
            table, summary.devices[device] = shares.result()
            tables.append(table)
        rows = pa.concat_tables(tables)
    except (OSError, ValueError, pa.ArrowException) as error:
        summary = RankSummary(problem=f"PM samples not attributed to kernels: {type(error).__name__}: {error}")
    footer = {**(metadata or {}), SUMMARY_KEY: json.dumps(
        {"devices": {d: asdict(s) for d, s in summary.devices.items()}, "problem": summary.problem})}
    write_parquet(conform(rows, SCHEMAS[StoreTable.METRICS]).replace_schema_metadata(footer),
                  rank_dir(run_dir, StoreTable.METRICS, rank) / part_name(_next_part(run_dir, rank)))
    return summary


def kernel_metrics(slice_ids: IntArray, values: FloatArray, metrics: Sequence[str]) -> pa.Table:
    """Per-kernel values ((kernels, metrics)) as metrics-table rows ``cupti:<metric>``, ``sampled``."""
    n_kernels, n_metrics = len(slice_ids), len(metrics)
    n = n_kernels * n_metrics
    return pa.table({
        "slice_id": pa.array(np.tile(np.asarray(slice_ids, dtype=np.int64), n_metrics)),
        "metric": pa.DictionaryArray.from_arrays(
            pa.array(np.repeat(np.arange(n_metrics, dtype=np.int32), n_kernels)),
            pa.array([METRIC_PREFIX + m for m in metrics], pa.string())),
        "value": pa.array(np.asarray(values, dtype=np.float64).T.reshape(-1)),
        "scope": pa.array(["kernel"] * n, pa.string()).dictionary_encode(),
        "method": pa.array([SAMPLED] * n, pa.string()).dictionary_encode(),
    })


@dataclass(frozen=True)
class _Kernels:
    """One device's kernel slices, sorted by start."""

    ids: IntArray
    start: IntArray
    end: IntArray
    names: list[str]

    @classmethod
    def none(cls) -> _Kernels:
        empty = np.zeros(0, dtype=np.int64)
        return cls(empty, empty, empty, [])

    @property
    def longest_ns(self) -> int:
        return int((self.end - self.start).max()) if self.ids.size else 0


@dataclass(frozen=True)
class _Piece:
    """One device's samples from one file: sorted by start, not overlapping."""

    device: str
    metrics: list[str]
    start: IntArray
    end: IntArray
    values: FloatArray  # (samples, metrics)
    dropped: dict[str, int]


class _DeviceShares:
    """One device's kernels' shares, added up piece by piece."""

    def __init__(self, kernels: _Kernels) -> None:
        self.kernels = kernels
        self.own: dict[str, FloatArray] = {}
        self.totals: dict[str, float] = {}
        self.covered = np.zeros(kernels.ids.size, dtype=bool)
        self.samples = 0
        self.medians: list[int] = []
        self.dropped: dict[str, int] = {}

    def add(self, piece: _Piece) -> None:
        for why, count in piece.dropped.items():
            self.dropped[why] = self.dropped.get(why, 0) + count
        if piece.start.size == 0:
            return
        self.samples += piece.start.size
        self.medians.append(int(np.median(piece.end - piece.start)))
        k = self.kernels
        # The kernels that can overlap these samples: started before the last ends, and no
        # earlier than the longest kernel before the first starts.
        low = int(np.searchsorted(k.start, piece.start[0] - k.longest_ns, side="left"))
        high = int(np.searchsorted(k.start, piece.end[-1], side="left"))
        own, covered = own_shares(piece.start, piece.end, piece.values, k.start[low:high], k.end[low:high])
        self.covered[low:high] |= covered
        for column, metric in enumerate(piece.metrics):
            self.totals[metric] = self.totals.get(metric, 0.0) + float(piece.values[:, column].sum())
            self.own.setdefault(metric, np.zeros(k.ids.size))[low:high] += own[:, column]

    def result(self) -> tuple[pa.Table, DeviceSummary]:
        k, metrics = self.kernels, list(self.own)
        own = np.column_stack([self.own[m] for m in metrics]) if metrics else np.zeros((k.ids.size, 0))
        interval = int(statistics.median(self.medians)) if self.medians else 0
        unattributed = np.array([self.totals[m] for m in metrics]) - own.sum(axis=0)
        attribution = pool_short_kernels(own, self.covered, k.end - k.start, k.names, interval, unattributed)
        taken = attribution.covered
        summary = DeviceSummary(
            metrics=metrics, samples=self.samples, kernels=int(k.ids.size), attributed=int(taken.sum()),
            short=int(attribution.short.sum()), pooled_names=len(attribution.names), interval_ns=interval,
            unattributed={m: float(unattributed[i] / self.totals[m]) if self.totals[m] else 0.0
                          for i, m in enumerate(metrics)},
            dropped=self.dropped)
        return kernel_metrics(k.ids[taken], attribution.kernel_values[taken], metrics), summary


def _files(run_dir: Path, table: StoreTable, rank: int) -> list[Path]:
    files = rank_files(rank_dir(run_dir, table, rank))
    return [*files.parts, *files.loose_chunks]


def _read(path: Path, columns: list[str]) -> pa.Table:
    """Some columns of one file, dictionary columns as plain strings (each file has its own)."""
    table = pq.read_table(path, columns=columns)
    return pa.table({name: table[name].cast(pa.string()) if pa.types.is_dictionary(table[name].type)
                     else table[name] for name in columns})


def _kernels(run_dir: Path, rank: int) -> dict[str, _Kernels]:
    """The rank's kernel slices per device, each device's sorted by start."""
    tables = []
    for path in _files(run_dir, StoreTable.SLICES, rank):
        table = _read(path, ["id", "kind", "device", "name", "start_ns", "dur_ns"])
        tables.append(table.filter(pc.equal(table["kind"], str(Kind.KERNEL))))
    if not tables:
        return {}
    kernels = pa.concat_tables(tables).sort_by([("device", "ascending"), ("start_ns", "ascending")])
    found = {}
    for device in pc.unique(kernels["device"]).to_pylist():
        one = kernels.filter(pc.equal(kernels["device"], device))
        start = one["start_ns"].to_numpy().astype(np.int64)
        found[str(device)] = _Kernels(one["id"].to_numpy().astype(np.int64), start,
                                      start + np.maximum(one["dur_ns"].fill_null(0).to_numpy(), 0),
                                      [str(n) for n in one["name"].to_pylist()])
    return found


def _pieces(run_dir: Path, rank: int) -> Iterator[_Piece]:
    """Each counters file's PM samples, one piece per device."""
    for path in _files(run_dir, StoreTable.COUNTERS, rank):
        if not _holds_samples(path):
            continue
        table = _read(path, ["device", "track", "ts_ns", "value"])
        table = table.filter(pc.starts_with(table["track"], TRACK_PREFIX))
        for device in pc.unique(table["device"]).to_pylist():
            yield _piece(str(device), table.filter(pc.equal(table["device"], device)))


def _holds_samples(path: Path) -> bool:
    """Whether a counters file has PM sample tracks, from its track names alone (an imported
    trace's counters, or a sampler's, are not read further)."""
    for chunk in pq.read_table(path, columns=["track"])["track"].chunks:
        names = chunk.dictionary if pa.types.is_dictionary(chunk.type) else chunk
        if pc.any(pc.starts_with(names, TRACK_PREFIX)).as_py():
            return True
    return False


def _piece(device: str, rows: pa.Table) -> _Piece:
    """One device's samples from its counter rows: a value per metric track, the length on
    :data:`DURATION_TRACK`, all at the sample's end."""
    track = rows["track"]
    lengths = rows.filter(pc.equal(track, DURATION_TRACK)).sort_by("ts_ns")
    end = lengths["ts_ns"].to_numpy().astype(np.int64)
    start = end - lengths["value"].to_numpy().astype(np.int64)
    metrics = sorted(set(track.to_pylist()) - {DURATION_TRACK})
    values = np.full((end.size, len(metrics)), np.nan)
    dropped: dict[str, int] = {}
    for column, name in enumerate(metrics):
        one = rows.filter(pc.equal(track, name))
        ends = one["ts_ns"].to_numpy()
        at = np.searchsorted(end, ends)
        matched = np.zeros(ends.size, dtype=bool)
        if end.size:
            matched = (at < end.size) & (end[np.minimum(at, end.size - 1)] == ends)
        if not matched.all():
            why = "a count with no sample length"
            dropped[why] = dropped.get(why, 0) + int((~matched).sum())
        values[at[matched], column] = one["value"].to_numpy()[matched]
    keep = ~np.isnan(values).any(axis=1)
    if not keep.all():
        dropped["a metric had no value"] = int((~keep).sum())
    start, end, values = start[keep], end[keep], values[keep]
    order = np.argsort(start, kind="stable")
    start, end, values = start[order], end[order], values[order]
    # Samples are consecutive; one that begins before the previous one ended cannot be shared
    # without counting twice, and is left out (counted).
    fits = np.ones(start.size, dtype=bool)
    if start.size > 1:
        fits[1:] = start[1:] >= np.maximum.accumulate(end)[:-1]
    if not fits.all():
        dropped["it overlapped the sample before"] = int((~fits).sum())
    return _Piece(device, [name.removeprefix(TRACK_PREFIX) for name in metrics],
                  start[fits], end[fits], values[fits], dropped)


def _next_part(run_dir: Path, rank: int) -> int:
    """The number after every part of the rank, in any table."""
    numbers = [int(path.stem.partition("-")[2]) for table in StoreTable
               for path in rank_files(rank_dir(run_dir, table, rank)).parts]
    return max(numbers, default=-1) + 1
