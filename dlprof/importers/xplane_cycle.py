"""One saved TensorFlow profiler cycle into rows of the store: read its XPlane, translate it.

The tensorflow collector hands each cycle to the session's finisher
(:mod:`dlprof.recording.finisher`) as an :class:`dlprof.store.save_jobs.XPlaneJob`. The XPlane files stay in the run
directory (``tensorflow/rank=R/cycle-NNNNN/plugins/profile/...``), where TensorBoard's
profiler opens them too (``tensorboard --logdir RUN/tensorflow/rank=0``).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pyarrow as pa

from dlprof.importers.kineto_cycle import CYCLE_ID_BITS
from dlprof.importers.xplane import (
    EmptyProfileError,
    XPlaneError,
    XPlaneOptions,
    convert_xspace,
    read_xspace,
)
from dlprof.keys import StoreTable
from dlprof.store.ids import SLOT_XPLANE, id_base
from dlprof.store.save_jobs import XPlaneJob


def convert_cycle(job: XPlaneJob) -> tuple[dict[StoreTable, list[pa.Table]], dict[str, Any]]:
    """Translate one cycle's XPlane files into rows of the run's tables.

    Returns:
        The rows per table, and what the collector records in the manifest: rows and events,
        the clock mapping, devices, what was skipped, and the seconds it took.
    """
    began = time.perf_counter()
    rows: dict[StoreTable, list[pa.Table]] = {StoreTable.SLICES: [], StoreTable.MEMORY: []}
    next_id = id_base(job.rank, SLOT_XPLANE) + (job.cycle << CYCLE_ID_BITS)
    result: dict[str, Any] = {"slices": 0, "events": 0, "clocks": [], "devices": [], "skipped": {},
                              "dropped": {}, "problems": []}
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
        rows[StoreTable.SLICES].append(tables.slices)
        rows[StoreTable.MEMORY].append(tables.memory)
        result["slices"] += tables.slices.num_rows
        result["events"] += tables.events
        result["clocks"].append(dataclasses.asdict(tables.clock))
        result["devices"].extend(tables.devices)
        for what, count in tables.skipped.items():
            result["skipped"][what] = result["skipped"].get(what, 0) + count
        for reason, count in tables.dropped.items():
            result["dropped"][reason] = result["dropped"].get(reason, 0) + count
    result["seconds"] = time.perf_counter() - began
    return rows, result
