"""One saved TensorFlow profiler cycle into the store: read its XPlane, write chunks.

Runs in the profiled process or as a child (``python -m dlprof.importers.xplane_cycle JOB``),
which lowers its own priority so the program it profiles keeps the CPU. The XPlane files stay
in the run directory (``tensorflow/rank=R/cycle-NNNNN/plugins/profile/...``), where TensorBoard's
profiler opens them too (``tensorboard --logdir RUN/tensorflow/rank=0``).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlprof.importers.cycle_conversion import JsonJob, child_main
from dlprof.importers.kineto_cycle import CYCLE_ID_BITS
from dlprof.importers.xplane import (
    XPLANE_SUFFIX,
    EmptyProfileError,
    XPlaneError,
    XPlaneOptions,
    convert_xspace,
    read_xspace,
)
from dlprof.store.ids import SLOT_XPLANE, id_base
from dlprof.store.sink import Sink
from dlprof.store.writer import RankWriter


@dataclass(frozen=True)
class XPlaneJob(JsonJob):
    """Where one cycle's XPlane is and how its rows are placed."""

    PATHS = ("logdir", "run_dir")
    PAIRS = ("marker_window_ns",)

    logdir: Path  # what tf.profiler.experimental.start was given
    run_dir: Path
    rank: int
    cycle: int
    pid: int
    # dlprof-clock epoch ns just before and after the clock marker TraceMe, and its thread.
    marker_window_ns: tuple[int, int] | None
    marker_tid: int | None
    keep_from_ns: int | None  # the first recorded step's start: warm-up steps are left out

    def files(self) -> list[Path]:
        """The XPlane files TensorFlow wrote for this cycle (one per host)."""
        return sorted(self.logdir.glob(f"plugins/profile/*/*{XPLANE_SUFFIX}"))


def convert_cycle(job: XPlaneJob) -> dict[str, Any]:
    """Translate one cycle's XPlane files into chunks of the run's tables.

    Returns:
        What the collector records in the manifest: rows and events, the clock mapping, devices,
        what was skipped, and the seconds it took.
    """
    began = time.perf_counter()
    sink = Sink(RankWriter(job.run_dir, job.rank))
    next_id = id_base(job.rank, SLOT_XPLANE) + (job.cycle << CYCLE_ID_BITS)
    result: dict[str, Any] = {"slices": 0, "events": 0, "clocks": [], "devices": [], "skipped": {},
                              "problems": []}
    for path in job.files():
        try:
            space = read_xspace(path)
        except EmptyProfileError:  # a cycle in which TensorFlow ran nothing: nothing to say
            continue
        except XPlaneError as error:
            result["problems"].append(str(error))
            continue
        options = XPlaneOptions(id_base=next_id, pid=job.pid, marker_window_ns=job.marker_window_ns,
                                marker_tid=job.marker_tid, keep_from_ns=job.keep_from_ns)
        tables = convert_xspace(space, options)
        next_id += tables.slices.num_rows
        source = f"xplane{job.cycle:05d}"
        sink.append_slices(tables.slices, source)
        sink.append_memory(tables.memory, source)
        result["slices"] += tables.slices.num_rows
        result["events"] += tables.events
        result["clocks"].append(dataclasses.asdict(tables.clock))
        result["devices"].extend(tables.devices)
        for what, count in tables.skipped.items():
            result["skipped"][what] = result["skipped"].get(what, 0) + count
    result["seconds"] = time.perf_counter() - began
    return result


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:], XPlaneJob.from_json, convert_cycle))
