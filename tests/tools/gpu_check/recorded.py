"""Both sides of the GPU check's comparisons, built from real recorded A100 traces.

dlprof's side is the trace imported into a run and read back as the check reads a live run;
the reference side is computed from the raw JSON by brute force (each launch's innermost
enclosing op found by scanning every op of its thread), sharing no code with dlprof.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import dlprof
from dlprof.importers.trace_file import import_traces
from dlprof.store.reader import Run
from tests.conftest import KINETO_TRACES
from tools.gpu_check.compare import Work

ALEXNET = KINETO_TRACES / "critical_path" / "alexnet" / "benchmark_result_2869224_1695835535_trace.json.gz"
SAMPLED = KINETO_TRACES / "timeline_analysis" / "sampled_rank-0.json.gz"
DEVICE_CATEGORIES = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
CALL_CATEGORIES = ("cuda_runtime", "cuda_driver")
ENCLOSING_CATEGORIES = ("cpu_op", "user_annotation")


def raw_events(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path) as file:
        return [e for e in json.load(file)["traceEvents"] if e.get("ph") == "X"]


def ns(value: float) -> int:
    return round(float(value) * 1000)


def innermost_op(call: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The op of the call's thread that encloses it and starts last; of ops that start and end
    together (microsecond timestamps), the shortest, then the one written later (Kineto writes an
    op before the ops it encloses)."""
    start, end = ns(call["ts"]), ns(call["ts"]) + ns(call["dur"])
    enclosing = [(position, op) for position, op in enumerate(ops)
                 if op["pid"] == call["pid"] and op["tid"] == call["tid"]
                 and ns(op["ts"]) <= start and ns(op["ts"]) + ns(op["dur"]) >= end]
    best = max(enclosing, key=lambda item: (ns(item[1]["ts"]), -ns(item[1]["dur"]), item[0]), default=None)
    return best[1] if best else None


def launches(events: list[dict[str, Any]]) -> dict[int, tuple[dict[str, Any], dict[str, Any] | None]]:
    """correlation id -> (the runtime or driver call, the op it ran in)."""
    ops = [e for e in events if e.get("cat") in ENCLOSING_CATEGORIES]
    found = {}
    for call in events:
        if call.get("cat") in CALL_CATEGORIES and "correlation" in call.get("args", {}):
            found.setdefault(int(call["args"]["correlation"]), (call, innermost_op(call, ops)))
    return found


def reference_work(events: list[dict[str, Any]]) -> list[Work]:
    """The trace's kernels, copies and memsets with the op that launched each, from the raw JSON."""
    linked = launches(events)
    work = []
    for event in events:
        kind = DEVICE_CATEGORIES.get(event.get("cat", ""))
        if kind is None:
            continue
        call = linked.get(int(event.get("args", {}).get("correlation", -1)))
        op = call[1] if call else None
        work.append(Work(kind, event["name"], ns(event["dur"]), op["name"] if op else None))
    return work


def imported_run(path: Path, directory: Path) -> Run:
    run_dir = directory / path.name.split(".")[0]
    if not run_dir.exists():
        import_traces([path], run_dir)
    return dlprof.load(run_dir)
