"""PyTorch profiler (Kineto) Chrome traces into the event store's tables.

The torch collector saves Kineto's own trace at the end of each profiling cycle (in C++, a few
microseconds per event) and converts it here, so a native run and an imported trace go through
one translation layer::

    trace = read_trace(Path("rank0.pt.trace.json.gz"))
    tables = convert_trace(trace, KinetoOptions(id_base=0))
"""

from __future__ import annotations

import gc
import gzip
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from dlprof.importers.flops import OPS_WITH_FLOPS, estimate_flops
from dlprof.keys import Kind

CLOCK_MARKER = "dlprof::clock_sync"
# Kineto's per-kernel counter ranges (CUPTI range profiler): their durations are placeholders.
PROFILER_RANGE = "cuda_profiler_range"
STEP_PREFIX = "ProfilerStep#"

_KIND_OF_CATEGORY: dict[str, str] = {
    "cpu_op": Kind.OP,
    "user_annotation": Kind.USER_ANNOTATION,
    "python_function": Kind.PYTHON,
    "kernel": Kind.KERNEL,
    "gpu_memcpy": Kind.MEMCPY,
    "gpu_memset": Kind.MEMSET,
    "cuda_runtime": Kind.RUNTIME,
    "cuda_driver": Kind.RUNTIME,
}
_COMM_PREFIXES = ("nccl:", "gloo:", "c10d::", "record_param_comms")
# Slices that describe the trace rather than the program.
_SKIPPED_CATEGORIES = frozenset({"Trace"})
_MEMORY_EVENT = "[memory]"


@dataclass(frozen=True)
class KinetoOptions:
    """How to translate one trace."""

    id_base: int  # the first slice id to hand out (see dlprof.store.ids)
    clock_offset_ns: int = 0  # subtracted from every timestamp to reach the run's clock
    # dlprof-clock epoch ns read just before and after the clock marker range; when set, the
    # offset is measured from the marker instead of taken from clock_offset_ns.
    marker_window_ns: tuple[int, int] | None = None
    region_names: frozenset[str] = frozenset()  # user annotations that were dlprof regions
    drop_steps: bool = False  # ProfilerStep#N ranges are recorded elsewhere (by the session)
    device_pid: int | None = None  # pid for device slices; None keeps the trace's


@dataclass
class KinetoTables:
    """One trace translated: rows per table, and the clock marker if the trace had one."""

    slices: pa.Table
    memory: pa.Table
    counters: pa.Table
    metrics: pa.Table  # counter values measured over one slice (cuda_profiler_range)
    clock_offset_ns: int = 0
    clock_bounds_ns: tuple[int, int] | None = None
    skipped: dict[str, int] = field(default_factory=dict)
    # The trace's deviceProperties (GPU name, SMs, memory...), as Kineto recorded them.
    devices: list[dict[str, Any]] = field(default_factory=list)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Hold off the cyclic garbage collector while building many objects that form no cycles.

    Parsing a trace allocates hundreds of thousands of dicts; in a process that already tracks
    many objects (a training program), each of them brings a full collection nearer, and the
    collections cost several times the parse itself.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def read_trace(path: Path) -> dict[str, Any]:
    """Parse a Chrome trace file, gzipped or not."""
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    with gc_paused():
        data = orjson.loads(raw)
    if isinstance(data, list):  # the bare-array form of the Chrome format
        return {"traceEvents": data}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a Chrome trace (top level is {type(data).__name__})")
    return data


def _as_int(value: Any) -> int:
    if isinstance(value, int):
        return value
    try:
        return int(value, 0) if isinstance(value, str) else int(value)
    except (TypeError, ValueError):
        # A name where a number belongs ("Spans"): the same number for it on every import.
        return zlib.crc32(str(value).encode()) & 0x7FFFFFFF


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return orjson.dumps(value).decode()


class _SliceColumns:
    """Growing Python lists, one per slice column, turned into Arrow once."""

    NAMES = (
        "pid tid device kind category name ts dur correlation_id external_id sequence_nr "
        "input_shapes input_dtypes flops bytes grid block registers shared_memory "
        "blocks_per_sm warps_per_sm occupancy stream"
    ).split()

    def __init__(self) -> None:
        self.columns: dict[str, list[Any]] = {name: [] for name in self.NAMES}
        # The lists' append methods in column order, bound once: one call per value per event.
        self.appenders = tuple(self.columns[name].append for name in self.NAMES)


def convert_trace(trace: dict[str, Any], options: KinetoOptions) -> KinetoTables:
    """Translate a parsed Kineto trace into slices, memory and counter rows.

    Args:
        trace: the parsed JSON object (see :func:`read_trace`).
        options: ids, clock offset and naming decisions for this trace.

    Returns:
        The rows, with epoch-nanosecond timestamps on the run's clock.
    """
    with gc_paused():
        return _convert(trace, options)


def _convert(trace: dict[str, Any], options: KinetoOptions) -> KinetoTables:
    base_ns = int(trace.get("baseTimeNanoseconds", 0))
    rows = _SliceColumns()
    memory: dict[str, list[Any]] = {k: [] for k in ("pid", "tid", "device", "ts", "bytes", "total_allocated", "total_reserved", "addr")}
    counters: dict[str, list[Any]] = {k: [] for k in ("pid", "track", "ts", "value")}
    # Per-kernel hardware counters that Kineto's CUPTI range profiler hangs on its ranges.
    metrics: dict[str, list[Any]] = {"slice": [], "metric": [], "value": []}
    skipped: dict[str, int] = {}
    marker: tuple[float, float] | None = None
    for event in trace.get("traceEvents", ()):
        phase = event.get("ph")
        if phase == "X":
            category = event.get("cat", "")
            name = event.get("name", "")
            if category in _SKIPPED_CATEGORIES:
                continue
            if category == "user_annotation":
                if name == CLOCK_MARKER:
                    marker = (event["ts"], event.get("dur", 0.0))
                    continue
                if options.drop_steps and name.startswith(STEP_PREFIX):
                    continue
            _add_slice(rows, event, category, name, options)
            if category == PROFILER_RANGE:
                index = len(rows.columns["ts"]) - 1
                for key, value in (event.get("args") or {}).items():
                    if isinstance(value, (int, float)) and not isinstance(value, bool):
                        metrics["slice"].append(index)
                        metrics["metric"].append(f"cupti:{key}")
                        metrics["value"].append(float(value))
        elif phase == "i" and event.get("name") == _MEMORY_EVENT:
            args = event.get("args", {})
            device_id = args.get("Device Id", -1)
            memory["pid"].append(_as_int(event.get("pid")))
            memory["tid"].append(_as_int(event.get("tid")))
            memory["device"].append("cpu" if args.get("Device Type", 0) == 0 else f"cuda:{device_id}")
            memory["ts"].append(event["ts"])
            memory["bytes"].append(args.get("Bytes"))
            memory["total_allocated"].append(args.get("Total Allocated"))
            memory["total_reserved"].append(args.get("Total Reserved"))
            memory["addr"].append(args.get("Addr"))
        elif phase == "C":
            for series, value in (event.get("args") or {}).items():
                counters["pid"].append(_as_int(event.get("pid")))
                counters["track"].append(f"{event.get('name', '')}.{series}")
                counters["ts"].append(event["ts"])
                counters["value"].append(float(value))
        elif phase not in ("M", "s", "f", "t", "i", "I"):
            skipped[str(phase)] = skipped.get(str(phase), 0) + 1

    offset, bounds = options.clock_offset_ns, None
    if marker is not None and options.marker_window_ns is not None:
        marker_start = base_ns + round(marker[0] * 1000)
        marker_ns = (marker_start, marker_start + round(marker[1] * 1000))
        offset, bounds = clock_offset(marker_ns, options.marker_window_ns)

    def to_ns(us: list[float]) -> np.ndarray:
        return _us_to_ns(us) + (base_ns - offset)

    columns = rows.columns
    n = len(columns["ts"])
    start = to_ns(columns["ts"]) if n else np.zeros(0, np.int64)
    dur = _us_to_ns(columns["dur"])
    ids = np.arange(n, dtype=np.int64) + options.id_base
    slices = _slices_table(columns, ids, start, dur)

    memory_ts = to_ns(memory["ts"]) if memory["ts"] else np.zeros(0, np.int64)
    memory_table = pa.table(
        {
            "pid": pa.array(memory["pid"], pa.int64()),
            "tid": pa.array(memory["tid"], pa.int64()),
            "device": pa.array(memory["device"], pa.string()).dictionary_encode(),
            "ts_ns": pa.array(memory_ts, pa.int64()),
            "bytes": pa.array(memory["bytes"], pa.int64()),
            "total_allocated": pa.array(memory["total_allocated"], pa.int64()),
            "total_reserved": pa.array(memory["total_reserved"], pa.int64()),
            "addr": pa.array(memory["addr"], pa.int64()),
            # The op that allocated is found when the run is compacted (dlprof.store.attribution).
            "slice_id": pa.nulls(len(memory_ts), pa.int64()),
        }
    )
    metric_slices = np.asarray(metrics["slice"], dtype=np.int64)
    metric_table = pa.table(
        {
            "slice_id": pa.array(ids[metric_slices] if len(metric_slices) else [], pa.int64()),
            "metric": pa.array(metrics["metric"], pa.string()).dictionary_encode(),
            "value": pa.array(metrics["value"], pa.float64()),
            "scope": pa.array(["kernel"] * len(metric_slices), pa.string()).dictionary_encode(),
            "method": pa.array(["exact"] * len(metric_slices), pa.string()).dictionary_encode(),
        }
    )
    counter_table = pa.table(
        {
            "pid": pa.array(counters["pid"], pa.int64()),
            "device": pa.array(["cpu"] * len(counters["pid"]), pa.string()).dictionary_encode(),
            "track": pa.array(counters["track"], pa.string()).dictionary_encode(),
            "ts_ns": pa.array(to_ns(counters["ts"]) if counters["ts"] else [], pa.int64()),
            "value": pa.array(counters["value"], pa.float64()),
        }
    )
    devices = [d for d in trace.get("deviceProperties", ()) if isinstance(d, dict)]
    return KinetoTables(
        slices, memory_table, counter_table, metric_table, offset, bounds, skipped, devices
    )


def clock_offset(
    marker_ns: tuple[int, int], window_ns: tuple[int, int]
) -> tuple[int, tuple[int, int]]:
    """The shift from Kineto's clock to dlprof's, from one range timed on both.

    The marker's start and end on Kineto's clock lie inside the window dlprof read around it;
    every offset that keeps them inside is consistent. Zero is kept when it is one of them.

    Returns:
        The offset to subtract from Kineto times, and the consistent bounds.
    """
    low = marker_ns[1] - window_ns[1]
    high = marker_ns[0] - window_ns[0]
    if low > high:  # inconsistent readings: take the middle
        return (low + high) // 2, (low, high)
    offset = 0 if low <= 0 <= high else (low if low > 0 else high)
    return offset, (low, high)


# Element sizes by the names torch's profiler gives dtypes: "Input type" of an op's tensor and
# record_param_comms' "dtype".
_DTYPE_BYTES = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4,
    "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1,
    "Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2,
    "Char": 1, "Byte": 1, "Bool": 1,
}


def comm_bytes(args: dict[str, Any]) -> int | None:
    """The bytes a collective moves, from what torch recorded of it (None when it cannot tell).

    record_param_comms states its message size in elements and its dtype; the gloo and nccl
    annotations carry their tensor's shape and element type (with input shapes recorded).
    """
    nelems, dtype = args.get("In msg nelems"), args.get("dtype")
    if isinstance(nelems, int) and dtype in _DTYPE_BYTES:
        return nelems * _DTYPE_BYTES[dtype]
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not dims or not types or types[0] not in _DTYPE_BYTES:
        return None  # a TensorList (c10d::allreduce_) does not say its element type
    shape = dims[0]
    if not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
        return None
    return int(np.prod(shape, dtype=np.int64)) * _DTYPE_BYTES[types[0]]


def _us_to_ns(us: list[float]) -> np.ndarray:
    """Microseconds (float) to integer nanoseconds, exact for whole microseconds at any size.

    Traces without ``baseTimeNanoseconds`` hold epoch microseconds (~1.7e15): multiplied by 1000
    as a float they would pass 2**53 and lose up to a few hundred nanoseconds.
    """
    values = np.asarray(us, dtype=np.float64)
    whole = np.floor(values)
    return whole.astype(np.int64) * 1000 + np.rint((values - whole) * 1000.0).astype(np.int64)


def _add_slice(
    rows: _SliceColumns, event: dict[str, Any], category: str, name: str, options: KinetoOptions
) -> None:
    args = event.get("args") or {}
    kind = _KIND_OF_CATEGORY.get(category, category)
    if kind == Kind.USER_ANNOTATION and name in options.region_names:
        kind = Kind.REGION
    elif kind == Kind.USER_ANNOTATION and name.startswith(STEP_PREFIX):
        kind = Kind.STEP
    elif kind in (Kind.OP, Kind.USER_ANNOTATION) and name.startswith(_COMM_PREFIXES):
        kind = Kind.COMM  # c10d::allreduce_ enqueues; gloo:all_reduce (an annotation) does it
    device = "cpu"
    pid = _as_int(event.get("pid"))
    tid = _as_int(event.get("tid"))
    stream = None
    # Runtime calls are CPU work even when they name a stream (ROCm's hipLaunchKernel does).
    if kind != Kind.RUNTIME and (
        "stream" in args or kind in (Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET, PROFILER_RANGE)
    ):
        device = f"cuda:{args.get('device', pid)}"
        stream = _as_int(args.get("stream", tid))
        tid = stream
        if options.device_pid is not None:
            pid = options.device_pid
    dims = args.get("Input Dims")
    flops = args.get("flops")  # a trace's own figure wins over the estimate from shapes
    if flops is None and dims is not None and name in OPS_WITH_FLOPS:
        flops = estimate_flops(name, dims, args.get("Concrete Inputs", ()))
    (
        add_pid, add_tid, add_device, add_kind, add_category, add_name, add_ts, add_dur,
        add_correlation, add_external, add_sequence, add_shapes, add_dtypes, add_flops,
        add_bytes, add_grid, add_block, add_registers, add_shared, add_blocks, add_warps,
        add_occupancy, add_stream,
    ) = rows.appenders
    add_pid(pid)
    add_tid(tid)
    add_device(device)
    add_kind(str(kind))
    add_category(category)
    add_name(name)
    add_ts(event.get("ts", 0.0))
    add_dur(event.get("dur", 0.0))
    add_correlation(args.get("correlation"))
    add_external(args.get("External id"))
    add_sequence(args.get("Sequence number"))
    add_shapes(_text(dims) if dims else None)
    add_dtypes(_text(args.get("Input type")) if dims else None)
    add_flops(flops)
    add_bytes(args.get("bytes") if kind != Kind.COMM else comm_bytes(args))
    add_stream(stream)
    if stream is None:  # CPU work: no launch configuration to look for
        for add in (add_grid, add_block, add_registers, add_shared, add_blocks, add_warps, add_occupancy):
            add(None)
        return
    add_grid(_text(args.get("grid")))
    add_block(_text(args.get("block")))
    add_registers(args.get("registers per thread"))
    add_shared(args.get("shared memory"))
    add_blocks(args.get("blocks per SM"))
    add_warps(args.get("warps per SM"))
    add_occupancy(args.get("est. achieved occupancy %"))


def _slices_table(
    columns: dict[str, list[Any]], ids: np.ndarray, start: np.ndarray, dur: np.ndarray
) -> pa.Table:
    def dictionary(name: str) -> pa.Array:
        return pa.array(columns[name], pa.string()).dictionary_encode()

    return pa.table(
        {
            "id": pa.array(ids),
            "pid": pa.array(columns["pid"], pa.int64()),
            "tid": pa.array(columns["tid"], pa.int64()),
            "device": dictionary("device"),
            "kind": dictionary("kind"),
            "category": dictionary("category"),
            "name": dictionary("name"),
            "start_ns": pa.array(start),
            "dur_ns": pa.array(dur),
            "correlation_id": pa.array(columns["correlation_id"], pa.int64()),
            "external_id": pa.array(columns["external_id"], pa.int64()),
            "sequence_nr": pa.array(columns["sequence_nr"], pa.int64()),
            "input_shapes": dictionary("input_shapes"),
            "input_dtypes": dictionary("input_dtypes"),
            "flops": pa.array(columns["flops"], pa.int64()),
            "bytes": pa.array(columns["bytes"], pa.int64()),
            "grid": dictionary("grid"),
            "block": dictionary("block"),
            "registers": pa.array(columns["registers"], pa.int32()),
            "shared_memory": pa.array(columns["shared_memory"], pa.int64()),
            "blocks_per_sm": pa.array(columns["blocks_per_sm"], pa.float32()),
            "warps_per_sm": pa.array(columns["warps_per_sm"], pa.float32()),
            "occupancy": pa.array(columns["occupancy"], pa.float32()),
            "stream": pa.array(columns["stream"], pa.int64()),
        }
    )
