"""Typed Kineto events into the store's rows, a column at a time.

:mod:`dlprof.importers.kineto_events` gives one typed table of events; the functions here turn
its columns into the slices, memory, counters and metrics tables with Arrow compute. Python runs
once per distinct value (a category, a shape to estimate FLOPs from), or once per event only for
the rare events whose arguments are open-ended (counter series, range-profiler metrics) and for
collectives (their byte counts)::

    slices = slice_rows(events, SliceNaming(id_base=0), shift_ns=base_ns)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from dlprof.importers.compile_phases import compile_kinds
from dlprof.importers.data_wait import data_wait_kinds
from dlprof.importers.flops import OPS_WITH_FLOPS, estimate_flops
from dlprof.importers.kineto_events import as_int
from dlprof.keys import PROFILER_RANGE, Kind

STEP_PREFIX = "ProfilerStep#"

# Kineto's categories of the kinds dlprof understands: libkineto's ActivityType names, the other
# accelerators' (device work counts as device work whatever it runs on), and the names Kineto
# wrote before its categories were ActivityType names (torch 1.8 and 1.9, 2021). Any other
# category is kept as a kind of its own.
KIND_OF_CATEGORY: dict[str, str] = {
    "cpu_op": Kind.OP,
    "user_annotation": Kind.USER_ANNOTATION,
    "python_function": Kind.PYTHON,
    "kernel": Kind.KERNEL,  # CUDA's, ROCm's (HIP's) and XPU's kernels alike
    "gpu_memcpy": Kind.MEMCPY,
    "gpu_memset": Kind.MEMSET,
    "cuda_runtime": Kind.RUNTIME,  # ROCm's HIP calls too (hipLaunchKernel...)
    "cuda_driver": Kind.RUNTIME,
    # Meta's MTIA: work on the accelerator's command processors, and the host calls launching it.
    "mtia_ccp_events": Kind.KERNEL,
    "mtia_runtime": Kind.RUNTIME,
    "xpu_runtime": Kind.RUNTIME,
    "xpu_driver": Kind.RUNTIME,
    "privateuse1_runtime": Kind.RUNTIME,
    "privateuse1_driver": Kind.RUNTIME,
    "hpu_op": Kind.RUNTIME,  # Gaudi's host-side runtime calls
    # The profiler's own overhead (dlprof's pauses in its Chrome export): never the user's time.
    "overhead": Kind.PROFILER,
    # torch 1.8/1.9: "Operator" for ops and steps, "Python" for Python functions.
    "Operator": Kind.OP,
    "Kernel": Kind.KERNEL,
    "Memcpy": Kind.MEMCPY,
    "Memset": Kind.MEMSET,
    "Runtime": Kind.RUNTIME,
    "Python": Kind.PYTHON,
}
# The device type of device work whose category names it; other device work is "cuda" (as torch
# calls ROCm's GPUs too).
DEVICE_TYPE_OF_CATEGORY: dict[str, str] = {"mtia_ccp_events": "mtia"}
# c10::DeviceType numbers of Kineto's [memory] events: 0 is the CPU, any other not named here cuda.
_DEVICE_TYPE_NAMES = {0: "cpu", 12: "xpu", 13: "mps", 19: "mtia"}
_COMM_PREFIXES = ("nccl:", "gloo:", "c10d::", "record_param_comms")
# Kinds that run on a device even when the event names no stream.
_RANGE_WITHOUT_NAME = "__missing__"
UNNAMED_RANGE = "(kernel name not recorded)"
_DEVICE_KINDS = (Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET, PROFILER_RANGE)
# JSON texts of values that are false to Python: an op recorded without shapes.
_EMPTY_JSON = ("[]", "{}", '""', "0", "false", "null")
_NONE_NUMBER = as_int(None)  # what a missing pid or tid has always numbered as

# Element sizes by the names torch's profiler gives dtypes: "Input type" of an op's tensor and
# record_param_comms' "dtype".
_DTYPE_BYTES = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4,
    "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1,
    "Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2,
    "Char": 1, "Byte": 1, "Bool": 1,
}


@dataclass(frozen=True)
class SliceNaming:
    """What the slices of one translation are numbered and called."""

    id_base: int  # the first slice id
    region_names: frozenset[str] = frozenset()  # user annotations that were dlprof regions
    device_pid: int | None = None  # pid for device slices; None keeps the trace's


def slice_rows(events: pa.Table, naming: SliceNaming, shift_ns: int) -> pa.Table:
    """The slices table of complete (``X``) events.

    Args:
        events: typed ``X`` events, in file order.
        naming: ids, regions and the device pid.
        shift_ns: added to every time (the trace's base minus the clock offset).
    """
    n = events.num_rows
    category = events.column("cat").fill_null("").combine_chunks()
    name = events.column("name").fill_null("").combine_chunks()
    # Kineto's range profiler names a range it found no kernel name for "__missing__".
    unnamed = pc.and_(pc.equal(category, PROFILER_RANGE), pc.equal(name, _RANGE_WITHOUT_NAME))
    name = pc.if_else(unnamed, UNNAMED_RANGE, name)
    kind = compile_kinds(data_wait_kinds(_kinds(category, name, naming.region_names), name), name)
    on_device = pc.and_(
        pc.not_equal(kind, str(Kind.RUNTIME)),
        pc.or_(events.column("has_stream").combine_chunks().fill_null(False),
               pc.is_in(kind, pa.array([str(k) for k in _DEVICE_KINDS]))))
    pid = events.column("pid").combine_chunks().fill_null(_NONE_NUMBER)
    tid = events.column("tid").combine_chunks().fill_null(_NONE_NUMBER)
    device_index = pc.cast(pc.coalesce(events.column("device").combine_chunks(), pid), pa.string())
    device_type = _by_category(category, DEVICE_TYPE_OF_CATEGORY, "cuda")
    device = pc.if_else(on_device, pc.binary_join_element_wise(device_type, device_index, ":"), "cpu")
    # Device work: the stream is its thread (the tid when the event names none).
    stream = pc.if_else(on_device, pc.coalesce(events.column("stream").combine_chunks(), tid),
                        pa.nulls(n, pa.int64()))
    tid = pc.if_else(on_device, stream, tid)
    if naming.device_pid is not None:
        pid = pc.if_else(on_device, naming.device_pid, pid)
    dims = events.column("input_dims").combine_chunks()
    shaped = pc.invert(pc.fill_null(pc.is_in(dims, pa.array(_EMPTY_JSON)), True))
    ids = np.arange(n, dtype=np.int64) + naming.id_base

    def device_only(column: str, kind_of: pa.DataType) -> pa.Array:
        return pc.if_else(on_device, pc.cast(events.column(column).combine_chunks(), kind_of),
                          pa.nulls(n, kind_of))

    columns: dict[str, pa.Array] = {
        "id": pa.array(ids),
        "pid": pid,
        "tid": tid,
        "device": device,
        "kind": kind,
        "category": category,
        "name": name,
        "start_ns": pa.array(us_to_ns(events.column("ts")) + shift_ns),
        "dur_ns": pa.array(us_to_ns(events.column("dur"))),
        "correlation_id": events.column("correlation"),
        "external_id": pc.coalesce(events.column("external_id"), events.column("external_id_2021")),
        "sequence_nr": events.column("sequence_nr"),
        "input_shapes": pc.if_else(shaped, dims, pa.nulls(n, pa.string())),
        "input_dtypes": pc.if_else(shaped, events.column("input_type").combine_chunks(),
                                   pa.nulls(n, pa.string())),
        "flops": _flops(events, name, dims),
        "bytes": _bytes(events, kind),
        "grid": device_only("grid", pa.string()),
        "block": device_only("block", pa.string()),
        "registers": device_only("registers", pa.int32()),
        "shared_memory": device_only("shared_memory", pa.int64()),
        "blocks_per_sm": device_only("blocks_per_sm", pa.float32()),
        "warps_per_sm": device_only("warps_per_sm", pa.float32()),
        "occupancy": device_only("occupancy", pa.float32()),
        "stream": stream,
    }
    strings = {"device", "kind", "category", "name", "input_shapes", "input_dtypes", "grid", "block"}
    return pa.table({key: _dictionary(value) if key in strings else value for key, value in columns.items()})


def memory_rows(events: pa.Table, shift_ns: int) -> pa.Table:
    """The memory table of Kineto's ``[memory]`` instants (the allocating op is found later)."""
    n = events.num_rows
    device_id = pc.cast(events.column("device_id").combine_chunks().fill_null(-1), pa.string())
    types = events.column("device_type").combine_chunks().fill_null(0)
    on_cpu = pc.equal(types, 0)
    type_name = _by_category(pc.cast(types, pa.string()), {str(k): v for k, v in _DEVICE_TYPE_NAMES.items()}, "cuda")
    return pa.table({
        "pid": events.column("pid").combine_chunks().fill_null(_NONE_NUMBER),
        "tid": events.column("tid").combine_chunks().fill_null(_NONE_NUMBER),
        "device": _dictionary(pc.if_else(on_cpu, "cpu", pc.binary_join_element_wise(type_name, device_id, ":"))),
        "ts_ns": pa.array(us_to_ns(events.column("ts")) + shift_ns),
        "bytes": events.column("memory_bytes"),
        "total_allocated": events.column("total_allocated"),
        "total_reserved": events.column("total_reserved"),
        "addr": events.column("addr"),
        "slice_id": pa.nulls(n, pa.int64()),  # found when the run is compacted
    })


def counter_rows(events: pa.Table, shift_ns: int) -> tuple[pa.Table, int]:
    """The counters table of ``C`` events: one row per series (``name.series``).

    Returns:
        The rows, and how many series values were left out for not being finite numbers.
    """
    pids, tracks, times, values = [], [], [], []
    left_out = 0
    ts_ns = us_to_ns(events.column("ts")) + shift_ns
    for i, (pid, name, raw) in enumerate(zip(events.column("pid").to_pylist(), events.column("name").to_pylist(),
                                             events.column("raw").to_pylist(), strict=True)):
        for series, value in open_args(raw).items():
            number = finite(value)
            if number is None:
                left_out += 1
                continue
            pids.append(_NONE_NUMBER if pid is None else pid)
            tracks.append(f"{name or ''}.{series}")
            times.append(int(ts_ns[i]))
            values.append(number)
    return pa.table({
        "pid": pa.array(pids, pa.int64()),
        "device": _dictionary(pa.array(["cpu"] * len(pids), pa.string())),
        "track": _dictionary(pa.array(tracks, pa.string())),
        "ts_ns": pa.array(times, pa.int64()),
        "value": pa.array(values, pa.float64()),
    }), left_out


def metric_rows(slices_events: pa.Table, slice_ids: pa.ChunkedArray | pa.Array) -> tuple[pa.Table, int]:
    """Per-kernel counters of Kineto's CUPTI range profiler, as metrics of their range's slice.

    Args:
        slices_events: the events that became slices, in slice order.
        slice_ids: the ids those slices were given.

    Returns:
        The rows, and how many numbers were left out for not being finite (1e400).
    """
    ranges = pc.fill_null(pc.equal(slices_events.column("cat"), PROFILER_RANGE), False)
    positions = np.flatnonzero(ranges.to_numpy(zero_copy_only=False))
    ids = np.asarray(slice_ids.to_numpy())
    owners, names, values = [], [], []
    left_out = 0
    raws = slices_events.column("raw").take(pa.array(positions, pa.int64())).to_pylist()
    for position, raw in zip(positions.tolist(), raws, strict=True):
        for key, value in open_args(raw).items():
            if not _is_number(value):
                continue  # a range's other arguments (its name, ids) are not metrics
            number = finite(value)
            if number is None:
                left_out += 1
                continue
            owners.append(int(ids[position]))
            names.append(f"cupti:{key}")
            values.append(number)
    count = len(owners)
    return pa.table({
        "slice_id": pa.array(owners, pa.int64()),
        "metric": _dictionary(pa.array(names, pa.string())),
        "value": pa.array(values, pa.float64()),
        "scope": _dictionary(pa.array(["kernel"] * count, pa.string())),
        "method": _dictionary(pa.array(["exact"] * count, pa.string())),
    }), left_out


def open_args(raw: str | None) -> dict[str, Any]:
    """The ``args`` of an event kept as its JSON text (counters, range metrics); {} if none."""
    if not raw:
        return {}
    try:
        event = orjson.loads(raw)
    except orjson.JSONDecodeError:  # a number orjson refuses (1e400): Python's reader takes it
        try:
            event = json.loads(raw)
        except ValueError:
            return {}
    args = event.get("args") if isinstance(event, dict) else None
    return args if isinstance(args, dict) else {}


def finite(value: Any) -> float | None:
    """A JSON number as a float, or None where it is not a number or not finite."""
    if not _is_number(value):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer past 1e308
        return None
    return number if math.isfinite(number) else None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def us_to_ns(us: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Microseconds (float) to integer nanoseconds, exact for whole microseconds at any size.

    Traces without ``baseTimeNanoseconds`` hold epoch microseconds (~1.7e15): multiplied by 1000
    as a float they would pass 2**53 and lose up to a few hundred nanoseconds. A missing time is 0.
    """
    values = np.asarray(pc.fill_null(us, 0.0).to_numpy(zero_copy_only=False), dtype=np.float64)
    whole = np.floor(values)
    return whole.astype(np.int64) * 1000 + np.rint((values - whole) * 1000.0).astype(np.int64)


def comm_bytes(args: dict[str, Any]) -> int | None:
    """The bytes a collective moves, from what torch recorded of it (None when it cannot tell).

    record_param_comms states its message size in elements and its dtype; the gloo and nccl
    annotations carry their tensor's shape and element type (with input shapes recorded).
    """
    nelems, dtype = args.get("In msg nelems"), args.get("dtype")
    if isinstance(nelems, int) and dtype in _DTYPE_BYTES:
        return nelems * _DTYPE_BYTES[dtype]
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not dims or not types or not isinstance(types, list) or types[0] not in _DTYPE_BYTES:
        return None  # a TensorList (c10d::allreduce_) does not say its element type
    shape = dims[0] if isinstance(dims, list) else None
    if not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
        return None
    return int(np.prod(shape, dtype=np.int64)) * _DTYPE_BYTES[types[0]]


def _by_category(values: pa.Array, table: dict[str, str], default: str | None = None) -> pa.Array:
    """``table[value]`` for each value (the value itself, or ``default``, where it has none)."""
    encoded = pc.dictionary_encode(values)
    words = [table.get(v, v if default is None else default) for v in encoded.dictionary.to_pylist()]
    return pa.array([str(w) for w in words], pa.string()).take(encoded.indices)


def _kinds(category: pa.Array, name: pa.Array, region_names: frozenset[str]) -> pa.Array:
    """Each slice's kind: its category's, then regions, steps and collectives by name."""
    kind = _by_category(category, KIND_OF_CATEGORY)
    annotation = pc.equal(kind, str(Kind.USER_ANNOTATION))
    region = pc.and_(annotation, pc.is_in(name, pa.array(sorted(region_names), pa.string())))
    # Steps are user annotations, or ops where torch 1.8 recorded them as "Operator".
    stepping = pc.or_(annotation, pc.equal(category, "Operator"))
    step = pc.and_(pc.and_(stepping, pc.invert(region)), pc.starts_with(name, STEP_PREFIX))
    comm = pc.and_(pc.and_(pc.or_(annotation, pc.equal(kind, str(Kind.OP))), pc.invert(pc.or_(region, step))),
                   _starts_with_any(name, _COMM_PREFIXES))
    kind = pc.if_else(region, str(Kind.REGION), kind)
    kind = pc.if_else(step, str(Kind.STEP), kind)
    return pc.if_else(comm, str(Kind.COMM), kind)


def _starts_with_any(values: pa.Array, prefixes: tuple[str, ...]) -> pa.Array:
    found = pc.starts_with(values, prefixes[0])
    for prefix in prefixes[1:]:
        found = pc.or_(found, pc.starts_with(values, prefix))
    return found


def _flops(events: pa.Table, name: pa.Array, dims: pa.Array) -> pa.Array:
    """The trace's own FLOPs, else an estimate from the shapes of ops torch has a formula for."""
    flops = events.column("flops").combine_chunks()
    wanted = pc.and_(pc.and_(pc.is_null(flops), pc.is_valid(dims)),
                     pc.is_in(name, pa.array(sorted(OPS_WITH_FLOPS), pa.string())))
    positions = np.flatnonzero(pc.fill_null(wanted, False).to_numpy(zero_copy_only=False))
    if len(positions) == 0:
        return flops
    take = pa.array(positions, pa.int64())
    concrete = events.column("concrete_inputs").take(take).to_pylist()
    estimates: dict[tuple[str, str, str | None], int | None] = {}
    values = []
    for key in zip(name.take(take).to_pylist(), dims.take(take).to_pylist(), concrete, strict=True):
        if key not in estimates:
            op, shape_text, concrete_text = key
            inputs = orjson.loads(concrete_text) if concrete_text else ()
            estimates[key] = _int64(estimate_flops(op, orjson.loads(shape_text), inputs if inputs is not None else ()))
        values.append(estimates[key])
    mask = np.zeros(len(flops), dtype=bool)
    mask[positions] = True
    return pc.replace_with_mask(flops, pa.array(mask), pa.array(values, pa.int64()))


def _bytes(events: pa.Table, kind: pa.Array) -> pa.Array:
    """Bytes moved: the trace's ``bytes``, or for a collective what :func:`comm_bytes` finds."""
    moved = events.column("bytes").combine_chunks()
    positions = np.flatnonzero(pc.equal(kind, str(Kind.COMM)).to_numpy(zero_copy_only=False))
    if len(positions) == 0:
        return moved
    take = pa.array(positions, pa.int64())
    rows = zip(*(events.column(c).take(take).to_pylist()
                 for c in ("in_msg_nelems", "dtype", "input_dims", "input_type")), strict=True)
    values = [_int64(comm_bytes({"In msg nelems": nelems, "dtype": dtype,
                                 "Input Dims": orjson.loads(dims) if dims else None,
                                 "Input type": orjson.loads(types) if types else None}))
              for nelems, dtype, dims, types in rows]
    mask = np.zeros(len(moved), dtype=bool)
    mask[positions] = True
    return pc.replace_with_mask(moved, pa.array(mask), pa.array(values, pa.int64()))


def _int64(value: float | None) -> int | None:
    """An estimate as the column keeps it: a count past int64 (shapes of 10**30 elements in a
    damaged trace) reads as absent, as a wrong argument does."""
    if value is None or not 0 <= value <= _INT64_MAX:  # nan compares false: absent too
        return None
    return int(value)


_INT64_MAX = (1 << 63) - 1


def _dictionary(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    return pc.dictionary_encode(values.cast(pa.string()))
