"""One saved torch.profiler cycle into the store: parse Kineto's trace, write chunks, delete it.

Runs in the profiled process or as a child (``python -m dlprof.importers.kineto_cycle JOB``),
which lowers its own priority so the program it profiles keeps the CPU.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlprof.importers.cycle_conversion import JsonJob, child_main
from dlprof.importers.kineto import KinetoOptions, convert_file
from dlprof.store.ids import SLOT_KINETO, id_base
from dlprof.store.sink import Sink
from dlprof.store.writer import RankWriter

# Each cycle numbers its slices in its own range of the Kineto slot: 2**24 ids per cycle.
CYCLE_ID_BITS = 24


@dataclass(frozen=True)
class CycleJob(JsonJob):
    """Where one cycle's trace is and where its rows go."""

    PATHS = ("trace", "run_dir")
    PAIRS = ("marker_window_ns",)

    trace: Path
    run_dir: Path
    rank: int
    cycle: int
    pid: int
    # dlprof-clock epoch ns just before and after the clock marker range, if one was recorded.
    marker_window_ns: tuple[int, int] | None


def convert_cycle(job: CycleJob) -> dict[str, Any]:
    """Translate one saved cycle into chunks of the run's tables, then remove the trace."""
    options = KinetoOptions(
        id_base=id_base(job.rank, SLOT_KINETO) + (job.cycle << CYCLE_ID_BITS),
        drop_steps=True,
        device_pid=job.pid,
        marker_window_ns=job.marker_window_ns,
    )
    tables = convert_file(job.trace, options)  # the file streamed: no dict per event
    sink = Sink(RankWriter(job.run_dir, job.rank))
    source = f"kineto{job.cycle:05d}"
    sink.append_slices(tables.slices, source)
    sink.append_memory(tables.memory, source)
    sink.append_counters(tables.counters, source)
    sink.append_metrics(tables.metrics, source)
    job.trace.unlink()
    return {
        "slices": tables.slices.num_rows,
        "clock_offset_ns": tables.clock_offset_ns,
        "clock_bounds_ns": list(tables.clock_bounds_ns) if tables.clock_bounds_ns else None,
        "devices": tables.devices,
    }


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:], CycleJob.from_json, convert_cycle))
