"""One saved torch.profiler cycle into rows of the store: parse Kineto's trace, translate it.

The torch collector hands each cycle to the session's finisher (:mod:`dlprof.recording.finisher`)
as a :class:`dlprof.store.save_jobs.CycleJob`; the finisher converts it with :func:`convert_cycle`, nests the rows with
the rest of the save, writes them, and then removes the trace.

A cycle is checked as ``dlprof import`` checks a trace: each event as it is read, then its times
against the others' (:mod:`dlprof.importers.plausible_times`: an event that starts or ends
implausibly far from the rest is dropped), what is dropped counted per reason for the
collector's notes.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from dlprof.importers.kineto import KinetoOptions, convert_file
from dlprof.importers.plausible_times import within_plausible_times
from dlprof.keys import StoreTable
from dlprof.store.ids import SLOT_KINETO, id_base
from dlprof.store.save_jobs import CycleJob

# Each cycle numbers its slices in its own range of the Kineto slot: 2**24 ids per cycle.
CYCLE_ID_BITS = 24


def convert_cycle(job: CycleJob) -> tuple[dict[StoreTable, list[pa.Table]], dict[str, Any]]:
    """Translate one saved cycle into rows of the run's tables.

    Returns:
        The rows per table, and what the collector keeps of the conversion (the clock mapping,
        the devices the trace describes, and the events dropped as damaged, per reason).
    """
    options = KinetoOptions(
        id_base=id_base(job.rank, SLOT_KINETO) + (job.cycle << CYCLE_ID_BITS),
        drop_steps=True,
        device_pid=job.pid,
        marker_window_ns=job.marker_window_ns,
    )
    # The file streamed (no dict per event), then its times judged against one another.
    tables = within_plausible_times(convert_file(job.trace, options))
    rows = {
        StoreTable.SLICES: [tables.slices],
        StoreTable.MEMORY: [tables.memory],
        StoreTable.COUNTERS: [tables.counters],
        StoreTable.METRICS: [tables.metrics],
    }
    return rows, {
        "slices": tables.slices.num_rows,
        "clock_offset_ns": tables.clock_offset_ns,
        "clock_bounds_ns": list(tables.clock_bounds_ns) if tables.clock_bounds_ns else None,
        "devices": tables.devices,
        "dropped": tables.dropped,
    }
