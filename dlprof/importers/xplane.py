"""TensorFlow's and JAX's profiles (XPlane protobuf) into the event store's tables.

``tf.profiler.experimental.stop()`` (and JAX's profiler) writes
``plugins/profile/<time>/<host>.xplane.pb``: an ``XSpace`` of planes (``/host:CPU``,
``/device:GPU:0``, ``/host:metadata``, ``Task Environment``), each of lines (a thread or a
stream) of events, each event an ``XEventMetadata`` id, an offset and a duration in picoseconds::

    tables = convert_xspace(read_xspace(Path("host.xplane.pb")), XPlaneOptions(id_base=0))

What each event becomes:

- ``name:Type`` (on ``tf_Compute``, tf.data's thread pools, any thread): an ``op`` slice named
  by the node, its raw type (``_MklMatMul``) as category, its logical type (``MatMul``) and its
  name scope; Keras layers around ops become ``module`` slices (:mod:`dlprof.importers.xplane_rows`).
- an XLA instruction (an event with ``hlo_op``/``hlo_module`` stats): an ``op`` slice of the
  TensorFlow op it was compiled from, found in the module's ``HloProto`` on ``/host:metadata``.
- ``MemoryAllocation``/``MemoryDeallocation`` (TensorFlow's BFC allocators): memory rows.
- ``$file:line function`` (a Python tracer's events): ``python`` slices; any other TraceMe:
  ``user_annotation`` slices. Instants (no duration) are counted and left out.
- on a device plane: ``kernel``, ``memcpy`` and ``memset`` slices on their stream, with
  correlation ids that link them to the ``runtime`` calls on ``/host:CUPTI``
  (:mod:`dlprof.importers.xplane_devices`).

Time: event times are ``line.timestamp_ns + offset_ps / 1000``, relative to the
``profile_start_time`` stat of the ``Task Environment`` plane (when line times are smaller than
it; older profiles hold epoch times already). A ``dlprof::clock_sync`` TraceMe timed by dlprof
too (the tensorflow collector's) measures the remaining shift onto dlprof's clock.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from dlprof.importers.hlo import HloFormatError, HloOp, hlo_ops
from dlprof.importers.kineto import clock_offset, gc_paused
from dlprof.importers.tf_ops import TfOp, parse_op_event, tf_op
from dlprof.importers.xplane_devices import DEVICE_PLANE, device_plane
from dlprof.importers.xplane_rows import EventClass, MemoryRows, SliceRows, Track, event_damage
from dlprof.importers.xplane_stats import DERIVED_LINES, StatNames, as_int64, fold_id, scalar
from dlprof.keys import CLOCK_MARKER, Kind
from dlprof.store.manifest import ClockDomain

HOST_PLANE = "/host:CPU"
METADATA_PLANE = "/host:metadata"
TASK_PLANE = "Task Environment"
CUPTI_PLANE = "/host:CUPTI"
_MEMORY_EVENTS = {"MemoryAllocation": 1, "MemoryDeallocation": -1}
_GPU_ALLOCATOR = re.compile(r"GPU_(\d+)_bfc")
TRACEME_CATEGORY = "TraceMe"
# Where the generated XPlane protobuf module lives, newest first.
_XPLANE_MODULES = (
    "tensorflow.tsl.profiler.protobuf.xplane_pb2",
    "tsl.profiler.protobuf.xplane_pb2",
    "tensorflow.core.profiler.protobuf.xplane_pb2",
    "xprof.protobuf.xplane_pb2",
    "tensorboard_plugin_profile.protobuf.xplane_pb2",
)


class XPlaneError(ValueError):
    """A file that cannot be read as an XPlane profile; the message is one line."""


class EmptyProfileError(XPlaneError):
    """A well-formed profile without a single event (a cycle in which nothing ran)."""


@dataclass(frozen=True)
class XPlaneOptions:
    """How to translate one XSpace."""

    id_base: int  # the first slice id to hand out (see dlprof.store.ids)
    pid: int = 0  # the process every row belongs to
    # dlprof-clock epoch ns read just before and after the clock marker TraceMe, and the thread
    # that made it; when set, the shift onto dlprof's clock is measured from the marker.
    marker_window_ns: tuple[int, int] | None = None
    marker_tid: int | None = None
    keep_from_ns: int | None = None  # leave out events that start earlier (warm-up steps)


@dataclass
class XPlaneTables:
    """One XSpace translated: rows per table and how its clock was mapped."""

    slices: pa.Table
    memory: pa.Table
    clock: ClockDomain
    events: int  # events read (instants and skipped ones included)
    hostnames: list[str] = field(default_factory=list)
    devices: list[dict[str, Any]] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)  # damaged events, per reason (as Kineto's)


@functools.cache
def xplane_module() -> ModuleType:
    """TensorFlow's generated XPlane protobuf module.

    Where TensorFlow is installed but not imported, the generated module is loaded from its file
    alone: it needs only ``protobuf``, while ``import tensorflow`` takes seconds and starts
    TensorFlow's runtime in a process that only reads a file.
    """
    if "tensorflow" not in sys.modules:
        spec = importlib.util.find_spec("tensorflow")
        for root in (spec.submodule_search_locations or []) if spec is not None else []:
            for relative in ("tsl/profiler/protobuf/xplane_pb2.py", "core/profiler/protobuf/xplane_pb2.py"):
                path = Path(root) / relative
                if path.is_file():
                    return _load_file("dlprof._xplane_pb2", path)
    for name in _XPLANE_MODULES:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise XPlaneError("reading XPlane needs TensorFlow's protobuf definitions: pip install 'dlprof[tf]'")


def _load_file(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise XPlaneError(f"{path}: cannot load")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def read_xspace(path: Path) -> Any:
    """Parse an ``.xplane.pb`` file into an ``XSpace``.

    Raises:
        XPlaneError: the file cannot be read or is not an XPlane protobuf;
            :class:`EmptyProfileError` when it holds no events.
    """
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise XPlaneError(f"{path}: cannot read ({error.strerror or error})") from None
    try:
        space = xplane_module().XSpace()
    except XPlaneError as error:
        raise XPlaneError(f"{path}: {error}") from None
    try:
        space.ParseFromString(raw)
    except Exception as error:  # noqa: BLE001  protobuf's DecodeError differs between its backends
        raise XPlaneError(f"{path}: not an XPlane profile (protobuf: {error})") from None
    if not any(len(line.events) for plane in space.planes for line in plane.lines):
        what = "an empty file" if not raw else "no planes with events"
        raise EmptyProfileError(f"{path}: not an XPlane profile, or an empty one ({what})")
    return space


def convert_xspace(space: Any, options: XPlaneOptions) -> XPlaneTables:
    """Translate a parsed XSpace into slices and memory rows.

    Args:
        space: an ``XSpace`` (see :func:`read_xspace`).
        options: ids, process and clock decisions for this profile.

    Returns:
        The rows, with epoch-nanosecond timestamps on the run's clock.
    """
    with gc_paused():
        return _Converter(space, options).run()


@dataclass(frozen=True)
class _Marker:
    """An event metadata whose events are not slices."""

    what: str  # "clock", "memory", "hlo" (decided per event), "instant"
    sign: int = 0


class _Converter:
    def __init__(self, space: Any, options: XPlaneOptions) -> None:
        self.space = space
        self.options = options
        self.rows = SliceRows()
        self.memory = MemoryRows()
        self.skipped: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()
        self.events = 0
        self.marker: tuple[int, int] | None = None
        self.marker_tid: int | None = None
        self.hlo: dict[str, dict[str, HloOp]] = {}
        self.devices: list[dict[str, Any]] = []

    def run(self) -> XPlaneTables:
        planes = list(self.space.planes)
        base, method = _time_base(planes)
        for plane in planes:
            if plane.name == METADATA_PLANE:
                self._read_modules(plane)
        for plane in planes:
            device = DEVICE_PLANE.fullmatch(plane.name)
            if plane.name in (HOST_PLANE, CUPTI_PLANE):
                self._host_plane(plane, base, Kind.RUNTIME if plane.name == CUPTI_PLANE else None)
            elif device is not None:
                info, events, instants = device_plane(plane, base, device, self.rows, self.dropped)
                self.devices.append(info)
                self.events += events
                self.skipped["instant"] += instants
            elif plane.name not in (METADATA_PLANE, TASK_PLANE):
                self.skipped[f"plane {plane.name}"] += sum(len(line.events) for line in plane.lines)
        shift, bounds = 0, None
        if self.marker is not None and self.options.marker_window_ns is not None:
            shift, bounds = clock_offset(self.marker, self.options.marker_window_ns)
            method += f"; shifted onto dlprof's clock by TraceMe '{CLOCK_MARKER}' timed on both"
        start = np.frombuffer(self.rows.start, dtype=np.int64) - shift
        keep = start >= self.options.keep_from_ns if self.options.keep_from_ns is not None else np.ones(len(start), bool)
        retag = None
        if self.marker_tid is not None and self.options.marker_tid is not None:
            retag = (self.marker_tid, self.options.marker_tid)
        slices = self.rows.table(keep, self.options.id_base, self.options.pid, shift, retag)
        memory = self.memory.table(self.options.keep_from_ns, self.options.pid, shift, retag)
        clock = ClockDomain(name="xplane", method=method, offset_ns=shift, bounds_ns=bounds)
        return XPlaneTables(slices, memory, clock, self.events, list(self.space.hostnames),
                            self.devices, dict(self.skipped), dict(self.dropped))

    # --- planes -------------------------------------------------------------------------

    def _read_modules(self, plane: Any) -> None:
        """The HLO modules XLA compiled: instruction name -> framework op, per module name."""
        for metadata in plane.event_metadata.values():
            for stat in metadata.stats:
                if stat.WhichOneof("value") != "bytes_value":
                    continue
                try:
                    name, ops = hlo_ops(stat.bytes_value)
                except HloFormatError:
                    self.skipped["unreadable HLO module"] += 1
                    continue
                self.hlo[name] = ops

    def _host_plane(self, plane: Any, base: int, kind: Kind | None) -> None:
        stats = StatNames(plane)
        classes: dict[int, int | _Marker] = {}  # event metadata id -> class code
        hlo_classes: dict[tuple[int, int], int] = {}
        rows = self.rows
        add_cls, add_track, add_start, add_dur = rows.cls.append, rows.track.append, rows.start.append, rows.dur.append
        for line in plane.lines:
            if line.name in DERIVED_LINES:
                continue
            tid = fold_id(line.id)
            track = rows.add_track(Track("cpu", tid, host=kind is None))
            line_ps = (base + line.timestamp_ns) * 1000
            for event in line.events:
                self.events += 1
                metadata_id = event.metadata_id
                code = classes.get(metadata_id)
                if code is None:
                    found = self._classify(plane, metadata_id, event, stats, kind)
                    code = classes[metadata_id] = found if isinstance(found, _Marker) else rows.code(found)
                start_ps = line_ps + event.offset_ps
                if isinstance(code, _Marker):
                    if code.what != "hlo":
                        self._marked(code, event, start_ps, tid, stats)
                        continue
                    code = self._hlo_class(plane, event, stats, hlo_classes)
                if event.duration_ps == 0:
                    self.skipped["instant"] += 1
                    continue
                damage = event_damage(start_ps, event.duration_ps)
                if damage is not None:
                    self.dropped[damage] += 1
                    continue
                add_cls(code)
                add_track(track)
                start = start_ps // 1000
                add_start(start)
                add_dur((start_ps + event.duration_ps) // 1000 - start)
                if kind is Kind.RUNTIME:
                    correlation = stats.value(event, "correlation_id")
                    if correlation is not None:
                        rows.sparse["correlation_id"][len(rows) - 1] = as_int64(correlation)

    def _classify(self, plane: Any, metadata_id: int, event: Any, stats: StatNames,
                  kind: Kind | None) -> EventClass | _Marker:
        metadata = plane.event_metadata[metadata_id]
        name = metadata.name
        if kind is not None:  # CUPTI's API calls
            return EventClass(kind, name, "cupti_api")
        if name == CLOCK_MARKER:
            return _Marker("clock")
        if name in _MEMORY_EVENTS:
            return _Marker("memory", _MEMORY_EVENTS[name])
        op = parse_op_event(name)
        if op is not None:
            return _op_class(op, op.raw_type)
        if stats.has(event, "hlo_op"):
            return _Marker("hlo")
        if name.startswith("$"):
            return EventClass(Kind.PYTHON, name[1:], "python")
        return EventClass(Kind.USER_ANNOTATION, name, TRACEME_CATEGORY)

    def _hlo_class(self, plane: Any, event: Any, stats: StatNames, cache: dict[tuple[int, int], int]) -> int:
        """The class code of an XLA instruction's event: the op it came from, per module."""
        module_ref = stats.ref(event, "hlo_module")
        key = (event.metadata_id, module_ref)
        code = cache.get(key)
        if code is None:
            instruction = plane.event_metadata[event.metadata_id].name
            module = plane.stat_metadata[module_ref].name if module_ref >= 0 else ""
            code = cache[key] = self.rows.code(self._compiled_op(instruction, module))
        return code

    def _compiled_op(self, instruction: str, module: str) -> EventClass:
        hlo = self.hlo.get(module, {}).get(instruction)
        args = orjson.dumps({"hlo_op": instruction, "hlo_module": module}).decode()
        category = f"xla:{hlo.opcode}" if hlo is not None else "xla"
        if hlo is None or not hlo.tf_name:
            opcode = hlo.opcode if hlo is not None else None
            return EventClass(Kind.OP, instruction, category, op_type=opcode, args=args)
        return _op_class(tf_op(hlo.tf_name, hlo.tf_type), category, args)

    def _marked(self, marker: _Marker, event: Any, start_ps: int, tid: int, stats: StatNames) -> None:
        if marker.what == "clock":
            self.marker = (start_ps // 1000, (start_ps + event.duration_ps) // 1000)
            self.marker_tid = tid
            return
        allocator = stats.text(event, "allocator_name") or ""
        gpu = _GPU_ALLOCATOR.fullmatch(allocator)
        self.memory.add(
            f"cuda:{gpu.group(1)}" if gpu else "cpu",
            tid=tid,
            ts=start_ps // 1000,
            bytes=marker.sign * (as_int64(stats.value(event, "allocation_bytes")) or 0),
            total_allocated=as_int64(stats.value(event, "bytes_allocated")) or 0,
            total_reserved=as_int64(stats.value(event, "bytes_reserved")) or 0,
            addr=as_int64(stats.value(event, "addr")) or 0,
        )

def _op_class(op: TfOp, category: str, args: str | None = None) -> EventClass:
    return EventClass(op.kind, op.name, category, op.op_type, op.scope, op.layers, args)


def _time_base(planes: list[Any]) -> tuple[int, str]:
    """What line timestamps are relative to, and how that was decided, in words."""
    task = next((p for p in planes if p.name == TASK_PLANE), None)
    start = 0
    if task is not None:
        names = {m.id: m.name for m in task.stat_metadata.values()}
        for stat in task.stats:
            if names.get(stat.metadata_id) == "profile_start_time":
                start = as_int64(scalar(stat, task)) or 0
    latest = max((line.timestamp_ns for p in planes for line in p.lines), default=0)
    if start and latest < start // 2:
        return start, "line timestamp_ns + offset_ps/1000 + profile_start_time of the Task Environment plane"
    return 0, "line timestamp_ns + offset_ps/1000, epoch nanoseconds as recorded"


