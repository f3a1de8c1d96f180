"""What the tests expect, worked out without dlprof: from the raw JSON of recorded traces, from
hand-built rows, by the slow and obvious way.

- ``raw_trace(name)``: HTA's trace_diff control or test trace, summed per (category, name).
- ``reference(path)`` and ``union_length``: a trace's GPU breakdown rows and device work.
- ``Walk`` and ``expected_costs(run)``: a run's nesting as dictionaries, and each op's costs.
- ``expected``, ``raw_ranges``, ``raw_flops``: derived metrics from their documented formulas.
- ``expected_scores(path)``: each kernel's launch-configuration score from the raw trace.
- ``recorded_devices(folder)``: the deviceProperties a recorded trace carries.
- ``expected_rates(run, kind)``: counter deltas per second of each counted slice.
- ``EXPECTED_CATEGORY``: the Kineto category each slice kind is exported as.
- ``stack_self_ns``: what a stack profile's flat time of a row should be.
"""

from __future__ import annotations

import functools
import gzip
import json
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pandas as pd

import dlprof
from dlprof.analysis.gpu import ALL
from dlprof.importers.kineto_rows import UNNAMED_RANGE
from dlprof.keys import DEVICE_KINDS, Kind
from dlprof.store.reader import Run
from tests.builders import CYCLES, DRAM, GLD, INST, SASS, US, WARPS, Kernel, cupti_profiler_trace
from tests.conftest import KINETO_TRACES

# What each kind must be called in Kineto's layout; written out here, not taken from the module.
EXPECTED_CATEGORY = {
    "op": "cpu_op",
    "module": "python_function",
    "region": "user_annotation",
    "step": "user_annotation",
    "user_annotation": "user_annotation",
    "data_wait": "user_annotation",  # the loop waiting for a batch: a range, as torch records it
    "kernel": "kernel",
    "memcpy": "gpu_memcpy",
    "memset": "gpu_memset",
    "runtime": "cuda_runtime",
    "profiler": "overhead",  # dlprof's own pauses: Kineto's category for the profiler's overhead
    "cuda_sync": "cuda_sync",  # not a dlprof kind: the recorded trace's own Kineto category
}


def expected_rates(run: Run, kind: str) -> dict[str, list[tuple[int, float]]]:
    """Per metric: (slice start, delta per second of the slice) for each counted ``kind`` slice."""
    rows = run.metrics.merge(run.slices, left_on="slice_id", right_on="id")
    rows = rows[rows["kind"] == kind].sort_values("start_ns")
    return {
        str(metric): [(int(r.start_ns), r.value * 1e9 / r.dur_ns) for r in group.itertuples()]
        for metric, group in rows.groupby(rows["metric"].astype(str))
    }


@dataclass(frozen=True)
class RawTrace:
    """What one trace file says, summed with nothing but ``json``."""

    steps: int  # ProfilerStep#N ranges
    calls: dict[tuple[str, str], int]  # (category, name) -> events
    time_ns: dict[tuple[str, str], int]  # (category, name) -> summed durations
    events: list[dict[str, object]]  # the complete ("X") events


@functools.cache
def raw_trace(name: str) -> RawTrace:
    """The control or test trace of tests/data/kineto-traces/trace_diff, summed per name."""
    (path,) = (KINETO_TRACES / "trace_diff" / name).glob("*.json.gz")
    with gzip.open(path, "rt") as file:
        events = [e for e in json.load(file)["traceEvents"] if e.get("ph") == "X"]
    calls: dict[tuple[str, str], int] = defaultdict(int)
    time_ns: dict[tuple[str, str], int] = defaultdict(int)
    for event in events:
        key = (event["cat"], event["name"])
        calls[key] += 1
        time_ns[key] += event["dur"] * 1000  # whole microseconds in these files
    steps = sum(1 for e in events if e["cat"] == "user_annotation" and e["name"].startswith("ProfilerStep#"))
    return RawTrace(steps, dict(calls), dict(time_ns), events)


_DEVICE_CATEGORIES = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}


@dataclass
class Work:
    kind: str
    device: str
    start: int
    end: int
    launch: int | None
    stream: int = 0
    queue: int | None = None  # of the delay (start - launch), the wait behind earlier work on the stream


def add_queueing(work: list[Work]) -> None:
    """Set each launched piece's queueing: from its launch until the work started before it on
    its stream had ended, at most the whole delay (nothing when the delay is negative)."""
    streams: dict[tuple[str, int], list[Work]] = defaultdict(list)
    for w in work:
        streams[(w.device, w.stream)].append(w)
    for pieces in streams.values():
        pieces.sort(key=lambda w: (w.start, w.end - w.start))
        free: int | None = None
        for w in pieces:
            if w.launch is not None:
                waited = 0 if free is None else free - w.launch
                w.queue = min(max(waited, 0), max(w.start - w.launch, 0))
            free = w.end if free is None else max(free, w.end)


def union_length(intervals: list[tuple[int, int]]) -> int:
    """Length of a union by sweeping boundaries: covered wherever the open count is positive."""
    edges = sorted([(s, 1) for s, e in intervals if e > s] + [(e, -1) for s, e in intervals if e > s])
    total, open_count, since = 0, 0, 0
    for at, step in edges:
        if open_count > 0:
            total += at - since
        open_count += step
        since = at
    return total


def clipped(work: list[Work], low: int, high: int, kinds: set[str]) -> list[tuple[int, int]]:
    return [(max(w.start, low), min(w.end, high)) for w in work if w.kind in kinds]


def quantile(values: list[int], percent: int) -> float:
    """Linear interpolation between order statistics (``inclusive``: numpy's default)."""
    if len(values) == 1:
        return float(values[0])
    return statistics.quantiles(values, n=100, method="inclusive")[percent - 1]


def expected_row(work: list[Work], owned: list[Work], low: int, high: int) -> dict[str, Any]:
    busy = union_length(clipped(work, low, high, {"kernel", "memcpy", "memset"}))
    kernel = union_length(clipped(work, low, high, {"kernel"}))
    with_copies = union_length(clipped(work, low, high, {"kernel", "memcpy"}))
    launched = [w for w in owned if w.kind == "kernel" and w.launch is not None]
    delays = [w.start - w.launch for w in launched if w.launch is not None]
    queues = [w.queue or 0 for w in launched]
    costs = [delay - queue for delay, queue in zip(delays, queues, strict=True)]
    row: dict[str, Any] = {
        "start_ns": low, "span_ns": high - low, "busy_ns": busy, "idle_ns": high - low - busy,
        "kernel_ns": kernel, "memcpy_ns": with_copies - kernel, "memset_ns": busy - with_copies,
        "kernels": sum(w.kind == "kernel" for w in owned),
        "memcpys": sum(w.kind == "memcpy" for w in owned),
        "memsets": sum(w.kind == "memset" for w in owned), "launches": len(delays),
        "queued": sum(queue > 0 for queue in queues),
    }
    for prefix, values in (("delay", delays), ("queue", queues), ("launch", costs)):
        if values:
            row.update({f"{prefix}_mean_ns": statistics.fmean(values), f"{prefix}_p50_ns": quantile(values, 50),
                        f"{prefix}_p95_ns": quantile(values, 95), f"{prefix}_max_ns": float(max(values))})
    return row


def reference(path: Path) -> tuple[list[dict[str, Any]], list[Work]]:
    """The breakdown rows of one trace, and its device work, computed from the raw JSON."""
    trace = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)
    base = int(trace.get("baseTimeNanoseconds", 0))

    def ns(us: int | Decimal) -> int:  # exact: the JSON's decimals were never floats
        return int(Decimal(us) * 1000)

    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    launches: dict[int, int] = {}
    for e in spans:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            launches.setdefault(e["args"]["correlation"], base + ns(e["ts"]))
    work = [
        Work(_DEVICE_CATEGORIES[e["cat"]], f"cuda:{e['args']['device']}", base + ns(e["ts"]),
             base + ns(e["ts"]) + ns(e["dur"]), launches.get(e["args"].get("correlation")),
             int(e["args"].get("stream", e["tid"])))
        for e in spans if e.get("cat") in _DEVICE_CATEGORIES
    ]
    add_queueing(work)
    steps = sorted(
        (base + ns(e["ts"]), base + ns(e["ts"]) + ns(e["dur"]), e["name"]) for e in spans
        if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")
    )

    def owner(w: Work) -> int | None:
        at = w.launch if w.launch is not None else w.start
        return next((i for i, (s, e, _) in enumerate(steps) if s <= at < e), None)

    rows: list[dict[str, Any]] = []
    for device in sorted({w.device for w in work}):
        mine = [w for w in work if w.device == device]
        previous_end: int | None = None
        for i, (step_start, step_end, name) in enumerate(steps):
            owned = [w for w in mine if owner(w) == i]
            end = max([step_end] + [w.end for w in owned])
            start = step_start if previous_end is None else max(step_start, previous_end)
            previous_end = end if previous_end is None else max(previous_end, end)
            rows.append({"device": device, "step": name, **expected_row(mine, owned, min(start, end), end)})
        first, last = min(w.start for w in mine), max(w.end for w in mine)
        rows.append({"device": device, "step": ALL, **expected_row(mine, mine, first, last)})
    return rows, work


class Walk:
    """The run's nesting as plain dictionaries, walked one parent at a time (the view walks it
    vectorised; this is the slow, obvious way)."""

    def __init__(self, run: dlprof.Run) -> None:
        rows = run.slices[["id", "parent_id", "kind", "name", "dur_ns"]].to_dict("records")
        self.rows: dict[int, dict[str, Any]] = {int(r["id"]): r for r in rows}

    def parent(self, slice_id: int) -> int | None:
        parent = self.rows[slice_id]["parent_id"]
        return None if pd.isna(parent) or int(parent) not in self.rows else int(parent)

    def enclosing(self, slice_id: int, kind: str, include_self: bool = False) -> int | None:
        current: int | None = slice_id if include_self else self.parent(slice_id)
        while current is not None and self.rows[current]["kind"] != kind:
            current = self.parent(current)
        return current

    def ancestors(self, slice_id: int) -> list[int]:
        """From the outermost slice down to the direct parent."""
        chain = []
        current = self.parent(slice_id)
        while current is not None:
            chain.append(current)
            current = self.parent(current)
        return chain[::-1]

    def ops(self) -> list[int]:
        return [i for i, r in self.rows.items() if r["kind"] == Kind.OP]


def expected_costs(run: dlprof.Run) -> dict[int, dict[str, int]]:
    """Per op id: cpu (its duration less the ops directly nested in it), device (kernels,
    memcpy, memset linked to it through their runtime call) and requested bytes."""
    walk = Walk(run)
    costs = {i: {"cpu": int(walk.rows[i]["dur_ns"]), "device": 0, "bytes": 0} for i in walk.ops()}
    for i in walk.ops():
        outer = walk.enclosing(i, Kind.OP)
        if outer is not None:
            costs[outer]["cpu"] -= int(walk.rows[i]["dur_ns"])
    slices = run.slices
    runtime = slices[(slices["kind"] == Kind.RUNTIME) & slices["correlation_id"].notna()]
    caller = {(r, c): p for r, c, p in zip(runtime["rank"], runtime["correlation_id"], runtime["parent_id"], strict=True)}
    device = slices[slices["kind"].isin([str(k) for k in DEVICE_KINDS])]
    for rank, correlation, dur in zip(device["rank"], device["correlation_id"], device["dur_ns"], strict=True):
        launcher = caller.get((rank, correlation))
        if launcher is not None and not pd.isna(launcher):
            owner = walk.enclosing(int(launcher), Kind.OP, include_self=True)
            if owner is not None:
                costs[owner]["device"] += int(dur)
    memory = run.memory
    for slice_id, size in zip(memory["slice_id"], memory["bytes"], strict=True):
        if size > 0 and not pd.isna(slice_id) and int(slice_id) in walk.rows:
            owner = walk.enclosing(int(slice_id), Kind.OP, include_self=True)
            if owner is not None:
                costs[owner]["bytes"] += int(size)
    return costs


def expected(kernels: list[Kernel]) -> dict[str, float]:
    """Each built-in over ``kernels`` taken together (sums first), from its documented formula."""
    def total(metric: str) -> float:
        return sum(k.counters[metric] for k in kernels)

    flop = sum(total(SASS.format(f"{p}add")) + total(SASS.format(f"{p}mul"))
               + 2 * total(SASS.format(f"{p}fma")) for p in "dfh")
    seconds = sum(k.dur_us for k in kernels) * US / 1e9
    return {
        "ipc": total(INST) / total(CYCLES),
        "warps_per_inst": total(WARPS) / total(INST),
        "gld_per_inst": total(GLD) / total(INST),
        "achieved_occupancy": 100 * total(WARPS) / total(CYCLES) / (2048 / 32),
        "flop_count": flop,
        "flop_rate": flop / seconds,
        "arithmetic_intensity": flop / total(DRAM),
    }


def raw_ranges() -> list[dict[str, Any]]:
    """The trace's cuda_profiler_range events, read here without dlprof, in time order; a range
    Kineto found no kernel name for ("__missing__") named as the store names it."""
    with gzip.open(cupti_profiler_trace()) as file:
        events = json.load(file)["traceEvents"]
    ranges = [e for e in events if e.get("cat") == "cuda_profiler_range"]
    for event in ranges:
        if event["name"] == "__missing__":
            event["name"] = UNNAMED_RANGE
    return sorted(ranges, key=lambda e: e["ts"])


def raw_flops(event: dict[str, Any]) -> float:
    args = event["args"]
    key = "smsp__sass_thread_inst_executed_op_{}_pred_on.sum"
    return float(sum(args[key.format(f"{p}add")] + args[key.format(f"{p}mul")]
                     + 2 * args[key.format(f"{p}fma")] for p in "dfh"))


def expected_scores(path: Path) -> dict[str, float]:
    """Each kernel name's launch-configuration score, from the raw trace and the documented rules.

    Occupancy is Kineto's estimate time-weighted over the calls it made one for, else the
    theoretical one of the launch configuration (the longest call's block, the most registers and
    shared memory); registers the most of any call, the grid the median blocks, the launch the
    shortest runtime call with the kernel's correlation id; the device is an A100 (108 SMs, 2048
    threads, 65536 registers and 164 KiB of shared memory per SM).
    """
    with gzip.open(path) as file:
        events = json.load(file)["traceEvents"]
    launches: dict[int, float] = {}
    for event in events:
        if event.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in event.get("args", {}):
            launches[event["args"]["correlation"]] = event["dur"]
    calls: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        if event.get("cat") == "kernel":
            calls.setdefault(event["name"], []).append(event)
    scores = {}
    for name, found in calls.items():
        time_us = sum(e["dur"] for e in found)
        weight = 0.0
        estimated = [e for e in found if e["args"]["est. achieved occupancy %"] > 0]
        registers = max(e["args"]["registers per thread"] for e in found)
        if estimated:
            occupancy = (sum(e["args"]["est. achieved occupancy %"] * e["dur"] for e in estimated)
                         / sum(e["dur"] for e in estimated))
        else:  # Kineto made no estimate: the launch configuration's theoretical occupancy
            longest = max(found, key=lambda e: e["dur"])
            warps = math.ceil(math.prod(longest["args"]["block"]) / 32)
            shared = max(e["args"]["shared memory"] for e in found)
            blocks = min(2048 // 32 // warps, 32, 65536 // (math.ceil(registers * 32 / 256) * 256 * warps),
                         167936 // shared if shared else 32)
            occupancy = 100 * max(blocks, 1) * warps / 64
        if occupancy < 50:
            weight += (50 - occupancy) / 50
        if registers > 64:
            weight += 1 - min(1.0, math.floor(65536 / (registers * 32)) * 32 / 2048)
        blocks = statistics.median(math.prod(e["args"]["grid"]) for e in found)
        if blocks < 108:
            weight += (108 - blocks) / 108
        threshold = max(5.0, min(launches[e["args"]["correlation"]] for e in found))
        if time_us / len(found) < threshold:
            weight += 1 - time_us / len(found) / threshold
        if weight:
            scores[name] = weight * time_us / 1000
    return scores


def recorded_devices(folder: str) -> list[dict[str, object]]:
    """The deviceProperties a recorded Kineto trace carries."""
    (path,) = (KINETO_TRACES / folder).glob("*.json.gz")
    with gzip.open(path, "rt") as trace:
        properties: list[dict[str, object]] = json.load(trace)["deviceProperties"]
    return properties




def stack_self_ns(run: Run, kind: str, row: Any) -> int:
    """A row's time with no frame above it on the stack: top's self time, except for layers.

    top's self time of a layer is its time outside inner layers (its ops count as its own), while
    a profile's flat time of a frame is its time outside every frame it called.
    """
    if kind != "module":
        return int(row.self_ns)
    return int(run.slices.loc[(run.slices["kind"] == kind) & (run.slices["name"] == row.name), "self_ns"].sum())
