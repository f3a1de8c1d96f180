"""Chrome Trace Event JSON in the PyTorch profiler's (Kineto's) layout, one file per rank.

Holistic Trace Analysis, Perfetto, chrome://tracing and :mod:`dlprof.importers.kineto` read it
as they read ``torch.profiler``'s own traces::

    ChromeExporter().export(dlprof.load("runs/cnn"), Path("cnn.json"))
    # a run of several ranks: cnn.rank0.json, cnn.rank1.json, ...

Layout, as Kineto writes it:

* ``X`` slices with Kineto's categories (:func:`kineto_category`) and argument names
  (``External id``, ``Input Dims``, ``correlation``, ``grid``, ...). Device slices go under the
  pid of their device index with the stream as tid; CPU slices keep their pid and thread. Two
  arguments are dlprof's, not Kineto's: ``flops`` and ``bytes`` on ops and layers (Kineto
  readers ignore them; dlprof's importer reads them back).
* ``s``/``f`` flows named ``ac2g`` from each runtime call to the device work it launched.
* ``C`` counters, ``i`` ``[memory]`` instants, ``M`` process and thread names.
* CPU counters per step (and per region) as ``C`` events named after the metric
  (``perf:task-clock``, ``perf:task-clock (regions)``) with one ``value``: the counter's delta
  over the step as a rate per second, set at the step's start (see
  :mod:`dlprof.exporters.counter_rates`).
* The header as Kineto writes it: one key per line, in Kineto's order, a space after each colon
  (Holistic Trace Analysis finds each file's rank by that spacing; see :func:`kineto_header`).
* Times are microseconds (three decimals at most) after ``baseTimeNanoseconds``. Kineto floors
  the profiler's start to a 7,889,238-second interval; this exporter floors the run's earliest
  timestamp to a whole second instead, so that ``ts`` stays small enough for a double to carry
  every nanosecond and a round trip gives back the same integers. One base serves every rank,
  so the ranks' files line up.

Events are written in batches as they are made, each rank's slices streamed from the store a row
group at a time (:mod:`dlprof.exporters.chrome_rank`): memory follows the batch, not the run.
With ``merged``, every rank goes into one file: rank r's processes are numbered
``r * RANK_PID_STRIDE + pid`` and labelled ``rank r``, and its flows ``flow_key(r, correlation)``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dlprof.exporters.base import OUTPUT_BUFFER, Exporter, Ticker
from dlprof.exporters.chrome_rank import RANK_PID_STRIDE, ChromeRankEvents, EventWriter, RankNaming
from dlprof.exporters.counter_rates import counter_rate_tracks
from dlprof.exporters.kineto_layout import (  # noqa: F401 (the layout's names, where they were)
    CATEGORY_OF_KIND,
    KINETO_CATEGORIES,
    SLICE_COLUMNS,
    kineto_category,
    slice_args,
)
from dlprof.keys import StoreTable
from dlprof.store import scan
from dlprof.store.reader import Run
from dlprof.store.safe_files import atomic_files


def base_time_ns(run: Run) -> int:
    """The time base of every rank's file.

    Args:
        run: the run to export.

    Returns:
        The run's earliest timestamp (any rank, any table) floored to a whole second, in epoch
        nanoseconds; 0 for a run with no timestamps at all.
    """
    earliest = [
        scan.column_min(run, table, column)
        for table, column in (
            (StoreTable.SLICES, "start_ns"),
            (StoreTable.COUNTERS, "ts_ns"),
            (StoreTable.MEMORY, "ts_ns"),
        )
    ]
    known = [value for value in earliest if value is not None]
    return (min(known) // 1_000_000_000) * 1_000_000_000 if known else 0


def kineto_header(devices: list[dict[str, Any]], rank: int | None, world_size: int, base_ns: int) -> bytes:
    """The trace's opening, up to and with the ``traceEvents`` array's bracket, as Kineto writes it.

    Kineto writes one key per line in this order, and the ``distributedInfo`` object as torch's
    ``json.dumps`` makes it, a space after each colon. Holistic Trace Analysis finds a file's
    rank with the pattern ``"rank":\\s+(\\d+)`` on the first line that has it: without the space
    every rank reads as rank 0.

    Args:
        devices: the manifest's device properties.
        rank: the rank this file holds; None for a file of every rank (no ``distributedInfo``).
        world_size: the job's number of ranks.
        base_ns: the file's time base (see :func:`base_time_ns`).

    Returns:
        The header's bytes, ending in a newline after ``"traceEvents": [``.
    """
    fields = (
        ("schemaVersion", 1),
        ("deviceProperties", devices),
        *([] if rank is None else [("distributedInfo", {"rank": rank, "world_size": world_size})]),
        ("displayTimeUnit", "ms"),
        ("baseTimeNanoseconds", base_ns),
    )
    lines = [f"  {json.dumps(key)}: {json.dumps(value)}," for key, value in fields]
    return ("{\n" + "\n".join(lines) + '\n  "traceEvents": [\n').encode()


def program_name(run: Run) -> str:
    """What Kineto calls the process: the file name of the program the run recorded.

    Args:
        run: the run to export.

    Returns:
        The manifest command's first word without its directory, or ``python``.
    """
    return Path(run.manifest.command[0]).name if run.manifest.command else "python"


class ChromeExporter(Exporter):
    """Kineto-layout Chrome Trace Event JSON, one file per rank (or one for all, ``merged``)."""

    format_name = "chrome"
    file_extension = ".json"
    binary = False
    description = "Chrome trace JSON in PyTorch profiler layout (HTA, Perfetto)"

    def __init__(self, batch_rows: int | None = None, merged: bool = False) -> None:
        """Args:
        batch_rows: rows turned into events at a time (see :class:`Exporter`).
        merged: every rank in one file, each rank's processes apart (see RANK_PID_STRIDE),
            instead of a file per rank.
        """
        super().__init__(*([] if batch_rows is None else [batch_rows]))
        self.merged = merged

    def output_paths(self, run: Run, path: Path) -> list[Path]:
        ranks = scan.ranks(run, StoreTable.SLICES)
        if self.merged or (len(ranks) == 1 and run.manifest.world_size <= 1):
            return [path]
        return [path.with_name(f"{path.stem}.rank{rank}{path.suffix}") for rank in ranks]

    def write(self, run: Run, path: Path, ticker: Ticker) -> list[Path]:
        base = base_time_ns(run)
        rates = counter_rate_tracks(run)
        ranks = scan.ranks(run, StoreTable.SLICES)
        paths = self.output_paths(run, path)
        program = program_name(run)
        manifest = run.manifest
        groups = [ranks] if self.merged else [[r] for r in ranks]
        # One file per rank, all or none: a rank refused (its target a link) or failing leaves
        # no other rank's file written.
        with atomic_files(paths) as partials:
            for out, partial, file_ranks in zip(paths, partials, groups, strict=True):
                with partial.open("wb", buffering=OUTPUT_BUFFER) as file:
                    several = self.merged and len(ranks) > 1
                    stated = None if several else file_ranks[0]
                    file.write(kineto_header(manifest.devices, stated, manifest.world_size, base))
                    writer = EventWriter(file)
                    for rank in file_ranks:
                        naming = RankNaming(program, rank * RANK_PID_STRIDE if several else 0,
                                            f"rank {rank} " if several else "", flows_by_rank=several)
                        events = ChromeRankEvents(writer, run, rank, base, ticker, self.batch_rows, naming)
                        events.write([t for t in rates if t.rank == rank])
                    file.write(b'\n  ],\n  "traceName": ' + json.dumps(out.name).encode() + b"\n}\n")
        return paths
