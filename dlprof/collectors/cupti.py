"""The ``cupti`` collector: kernels, memcpy, memset and CUDA API calls from CUPTI's Activity API.

    dlprof run --collectors cupti,host train_cupy.py

For programs that drive the GPU without PyTorch (CuPy, Numba, JAX). Built on ``cupti-python``
(``dlprof[gpu]``): it enables the activity kinds CONCURRENT_KERNEL, MEMCPY, MEMSET, RUNTIME and
DRIVER while the schedule records, and CUPTI hands back full buffers through the
buffer-completed callback on CUPTI's own thread. That callback copies each record into a
fixed-shape :class:`Record` tuple and nothing more (STYLE: drain device buffers on a background
thread); :func:`records_to_slices`, a pure function, turns the tuples into slices at save time.

CUPTI allows one subscriber per process; the session decides which collector subscribes
(:func:`dlprof.collectors.registry.cupti_owner`). When the ``torch`` collector is on in the same session,
Kineto owns CUPTI and kernels come from it: this collector then does not subscribe and says so in
the manifest.

Kernel names are demangled (:mod:`dlprof.support.demangle`) as Kineto demangles them;
peer-to-peer copies (MEMCPY2) carry their source and destination devices in ``args`` under
Kineto's keys. Records CUPTI dropped for want of buffer space are counted in the manifest notes.

CUPTI timestamps are on CUPTI's own clock (``cupti.get_timestamp()``). They are mapped to epoch
nanoseconds by an offset sampled at start, ``(time_ns - get_timestamp)``, and checked again at
stop; both are recorded as the ``cupti`` clock domain of the manifest.

Not verified on GPU hardware yet (the development machines have no NVIDIA driver): the
translation is tested on records built from cupti-python's own record classes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib
import os
import threading
import time
from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple

import numpy as np
import orjson
import pyarrow as pa

from dlprof.collectors.base import Collector, CollectorContext
from dlprof.keys import Kind
from dlprof.schedule import Action
from dlprof.store.ids import SLOT_CUPTI, id_base
from dlprof.store.manifest import ClockDomain
from dlprof.support.demangle import demangle

ARBITRATION_NOTE = "Kineto (torch collector) owns CUPTI in this process; kernels come from it"
NO_DRIVER = "no CUDA driver (libcuda.so.1 not found)"

# CUpti_ActivityKind values (cupti_activity.h; stable across CUPTI versions, checked against
# cupti.cupti.ActivityKind by the tests) -> (dlprof kind, category as Kineto names it).
ACTIVITY_MEMCPY = 1
ACTIVITY_MEMSET = 2
ACTIVITY_KERNEL = 3
ACTIVITY_DRIVER = 4
ACTIVITY_RUNTIME = 5
ACTIVITY_CONCURRENT_KERNEL = 10
ACTIVITY_MEMCPY2 = 22  # peer-to-peer copies between devices (CUpti_ActivityMemcpyPtoP)
_KINDS: dict[int, tuple[str, str]] = {
    ACTIVITY_KERNEL: (Kind.KERNEL, "kernel"),
    ACTIVITY_CONCURRENT_KERNEL: (Kind.KERNEL, "kernel"),
    ACTIVITY_MEMCPY: (Kind.MEMCPY, "gpu_memcpy"),
    ACTIVITY_MEMCPY2: (Kind.MEMCPY, "gpu_memcpy"),
    ACTIVITY_MEMSET: (Kind.MEMSET, "gpu_memset"),
    ACTIVITY_RUNTIME: (Kind.RUNTIME, "cuda_runtime"),
    ACTIVITY_DRIVER: (Kind.RUNTIME, "cuda_driver"),
}
# What is enabled; KERNEL (serialising) is never enabled, CONCURRENT_KERNEL is.
ENABLED_KINDS = (
    ACTIVITY_CONCURRENT_KERNEL, ACTIVITY_MEMCPY, ACTIVITY_MEMCPY2, ACTIVITY_MEMSET, ACTIVITY_RUNTIME,
    ACTIVITY_DRIVER,
)

# CUpti_ActivityMemcpyKind and CUpti_ActivityMemoryKind values, in Kineto's spelling, so that a
# memcpy reads "Memcpy HtoD (Pageable -> Device)" whichever collector recorded it.
COPY_KINDS = ("Unknown", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA", "DtoD", "HtoH", "PtoP")
MEMORY_KINDS = ("Unknown", "Pageable", "Pinned", "Device", "Array", "Managed", "Device Static",
                "Managed Static")

_BUFFER_BYTES = 8 * 1024 * 1024


class Record(NamedTuple):
    """One CUPTI activity record, copied out of CUPTI's buffer; fields a kind lacks are 0."""

    kind: int  # CUpti_ActivityKind value
    name: str  # kernel name, or the API function's name ("" for memcpy/memset)
    start: int  # CUPTI clock, ns
    end: int
    device: int  # device id (0 for API calls)
    lane: int  # stream id for device work, thread id for API calls
    correlation_id: int
    grid: tuple[int, int, int] = (0, 0, 0)
    block: tuple[int, int, int] = (0, 0, 0)
    registers: int = 0
    static_shared: int = 0
    dynamic_shared: int = 0
    bytes: int = 0
    copy_kind: int = 0  # memcpy: CUpti_ActivityMemcpyKind
    src_kind: int = 0  # memcpy: CUpti_ActivityMemoryKind of the source; memset: of the target
    dst_kind: int = 0
    src_device: int = -1  # peer-to-peer memcpy: the devices copied from and to
    dst_device: int = -1


def _label(table: Sequence[str], value: int) -> str:
    return table[value] if 0 <= value < len(table) else table[0]


def record_from_activity(activity: Any, api_name: dict[tuple[int, int], str] | None = None) -> Record | None:
    """A :class:`Record` from one cupti-python activity object; None for kinds not kept.

    ``api_name`` maps (activity kind, cbid) to the API function's name; a call whose cbid is not
    in it is named ``cbid <n>`` (the collector fills the map through ``get_callback_name``).
    """
    kind = int(activity.kind)
    if kind in (ACTIVITY_KERNEL, ACTIVITY_CONCURRENT_KERNEL):
        return Record(
            kind, demangle(str(activity.name or "")), int(activity.start), int(activity.end),
            int(activity.device_id), int(activity.stream_id), int(activity.correlation_id),
            (int(activity.grid_x), int(activity.grid_y), int(activity.grid_z)),
            (int(activity.block_x), int(activity.block_y), int(activity.block_z)),
            registers=int(activity.registers_per_thread),
            static_shared=int(activity.static_shared_memory),
            dynamic_shared=int(activity.dynamic_shared_memory),
        )
    if kind == ACTIVITY_MEMCPY:
        return Record(
            kind, "", int(activity.start), int(activity.end), int(activity.device_id),
            int(activity.stream_id), int(activity.correlation_id), bytes=int(activity.bytes),
            copy_kind=int(activity.copy_kind), src_kind=int(activity.src_kind),
            dst_kind=int(activity.dst_kind),
        )
    if kind == ACTIVITY_MEMCPY2:
        return Record(
            kind, "", int(activity.start), int(activity.end), int(activity.device_id),
            int(activity.stream_id), int(activity.correlation_id), bytes=int(activity.bytes),
            copy_kind=int(activity.copy_kind), src_kind=int(activity.src_kind),
            dst_kind=int(activity.dst_kind), src_device=int(activity.src_device_id),
            dst_device=int(activity.dst_device_id),
        )
    if kind == ACTIVITY_MEMSET:
        return Record(
            kind, "", int(activity.start), int(activity.end), int(activity.device_id),
            int(activity.stream_id), int(activity.correlation_id), bytes=int(activity.bytes),
            src_kind=int(activity.memory_kind),
        )
    if kind in (ACTIVITY_RUNTIME, ACTIVITY_DRIVER):
        cbid = int(activity.cbid)
        name = (api_name or {}).get((kind, cbid), f"cbid {cbid}")
        return Record(kind, name, int(activity.start), int(activity.end), 0,
                      int(activity.thread_id), int(activity.correlation_id))
    return None


def records_to_slices(records: Sequence[Record], id_base: int, clock_offset_ns: int, pid: int) -> pa.Table:
    """CUPTI records as slices-table rows, ids ``id_base, id_base + 1, ...`` in record order.

    Device work (kernel, memcpy, memset) goes on device ``cuda:<device>`` with ``tid`` and
    ``stream`` the CUDA stream; API calls on ``cpu`` with ``tid`` the calling thread. Both keep
    CUPTI's correlation id, which joins a launch to the work it launched. ``clock_offset_ns`` is
    added to CUPTI timestamps to reach epoch nanoseconds. Records of other kinds are skipped.
    """
    kept = [r for r in records if r.kind in _KINDS]
    n = len(kept)
    kinds: list[str] = []
    categories: list[str] = []
    names: list[str] = []
    devices: list[str] = []
    streams: list[int | None] = []
    grids: list[str | None] = []
    blocks: list[str | None] = []
    registers: list[int | None] = []
    shared: list[int | None] = []
    sizes: list[int | None] = []
    args: list[str | None] = []
    for r in kept:
        kind, category = _KINDS[r.kind]
        kinds.append(kind)
        is_kernel = kind == Kind.KERNEL
        device_work = kind != Kind.RUNTIME
        if kind == Kind.MEMCPY:
            copy = _label(COPY_KINDS, r.copy_kind)
            category = f"Memcpy {copy}"
            name = (f"Memcpy {copy} ({_label(MEMORY_KINDS, r.src_kind)} -> "
                    f"{_label(MEMORY_KINDS, r.dst_kind)})")
        elif kind == Kind.MEMSET:
            name = f"Memset ({_label(MEMORY_KINDS, r.src_kind)})"
        else:
            name = r.name
        categories.append(category)
        names.append(name)
        devices.append(f"cuda:{r.device}" if device_work else "cpu")
        streams.append(r.lane if device_work else None)
        # The same JSON text Kineto's "grid"/"block" args become in the store: "[x,y,z]".
        grids.append("[{},{},{}]".format(*r.grid) if is_kernel else None)
        blocks.append("[{},{},{}]".format(*r.block) if is_kernel else None)
        registers.append(r.registers if is_kernel else None)
        shared.append(r.static_shared + r.dynamic_shared if is_kernel else None)
        sizes.append(r.bytes if kind in (Kind.MEMCPY, Kind.MEMSET) else None)
        # Kineto's keys for a peer-to-peer copy's devices: the store has no columns for them.
        args.append(orjson.dumps({"fromDevice": r.src_device, "inDevice": r.device,
                                  "toDevice": r.dst_device}).decode()
                    if r.kind == ACTIVITY_MEMCPY2 else None)
    start = np.fromiter((r.start for r in kept), dtype=np.int64, count=n)
    end = np.fromiter((r.end for r in kept), dtype=np.int64, count=n)

    def dictionary(values: list[str | None] | list[str]) -> pa.Array:
        return pa.array(values, pa.string()).dictionary_encode()

    return pa.table(
        {
            "id": pa.array(np.arange(id_base, id_base + n, dtype=np.int64)),
            "pid": pa.array(np.full(n, pid, dtype=np.int64)),
            "tid": pa.array([r.lane for r in kept], pa.int64()),
            "device": dictionary(devices),
            "kind": dictionary(kinds),
            "category": dictionary(categories),
            "name": dictionary(names),
            "start_ns": pa.array(start + clock_offset_ns),
            "dur_ns": pa.array(np.maximum(end - start, 0)),
            "correlation_id": pa.array([r.correlation_id for r in kept], pa.int64()),
            "bytes": pa.array(sizes, pa.int64()),
            "grid": dictionary(grids),
            "block": dictionary(blocks),
            "registers": pa.array(registers, pa.int32()),
            "shared_memory": pa.array(shared, pa.int64()),
            "stream": pa.array(streams, pa.int64()),
            "args": pa.array(args, pa.string()),
        }
    )


def sample_cupti_clock(get_timestamp: Any, tries: int = 5) -> tuple[int, int]:
    """(offset, uncertainty): ``time_ns - get_timestamp()`` from the tightest of a few readings."""
    best: tuple[int, int] | None = None
    for _ in range(tries):
        before = time.time_ns()
        cupti_ns = int(get_timestamp())
        after = time.time_ns()
        pair = ((before + after) // 2 - cupti_ns, after - before)
        if best is None or pair[1] < best[1]:
            best = pair
    assert best is not None
    return best


def dropped_records(cupti: Any) -> int:
    """Activity records CUPTI dropped since the last call, for want of buffer space (global queue)."""
    count = np.zeros(1, dtype=np.uint64)  # a size_t CUPTI writes through the pointer
    cupti.activity_get_num_dropped_records(0, 0, count.ctypes.data)
    return int(count[0])


def driver_missing() -> str:
    """Why the CUDA driver cannot be loaded here, or "" when it can."""
    if ctypes.util.find_library("cuda") is None:
        try:
            ctypes.CDLL("libcuda.so.1")
        except OSError:
            return NO_DRIVER
    return ""


class CuptiBacked(Collector):
    """A collector built on cupti-python: available where it is installed, a CUDA driver loads
    and its module ``cupti_module`` imports."""

    requires = ("cupti", "gpu")
    distribution = "cupti-python"
    cupti_module: ClassVar[str]

    @classmethod
    def available(cls) -> tuple[bool, str]:
        ok, reason = super().available()
        if not ok:
            return False, reason.replace("cupti is not installed", "cupti-python is not installed")
        missing = driver_missing()
        if missing:
            return False, missing
        try:
            importlib.import_module(cls.cupti_module)
        except Exception as error:  # noqa: BLE001  a broken install is the reason
            return False, f"{cls.cupti_module} does not import: {type(error).__name__}: {error}"
        return True, ""


class CuptiCollector(CuptiBacked):
    name = "cupti"
    description = "CUPTI Activity API: kernels, memcpy, memset, CUDA API calls (no PyTorch needed)"
    cupti_module = "cupti.cupti"
    cupti_priority = 1

    def start(self, context: CollectorContext) -> None:
        self._context = context
        self._subscribed = False
        self._enabled = False
        self._records: list[Record] = []
        self._lock = threading.Lock()
        self._api_names: dict[tuple[int, int], str] = {}
        self._next_id = id_base(context.config.rank, SLOT_CUPTI)
        self._failed_callbacks = 0
        self._dropped = 0
        if context.cupti_owner != self.name:
            # One CUPTI subscriber per process: a second one fails or steals Kineto's records.
            self.notes.append(ARBITRATION_NOTE)
            self.active = False
            return
        self._cupti: Any = importlib.import_module("cupti.cupti")
        offset, uncertainty = sample_cupti_clock(self._cupti.get_timestamp)
        self._offset_ns = offset
        self._clock = ClockDomain(
            name="cupti",
            method="cupti.get_timestamp() + (time_ns - get_timestamp) sampled at start",
            offset_ns=offset,
            bounds_ns=(offset - uncertainty, offset + uncertainty),
        )
        context.clocks.append(self._clock)
        self._cupti.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
        self._subscribed = True
        if context.action.records:
            self._enable()

    # --- CUPTI's callbacks (its own thread, or the flushing thread) -------------------------

    def _buffer_requested(self) -> tuple[int, int]:
        """An empty buffer's size for CUPTI; 0 records means as many as fit."""
        return _BUFFER_BYTES, 0

    def _buffer_completed(self, activities: Sequence[Any]) -> None:
        """Copy a full buffer's records out; nothing here may raise into CUPTI."""
        try:
            taken: list[Record] = []
            for activity in activities:
                kind = int(activity.kind)
                if kind in (ACTIVITY_RUNTIME, ACTIVITY_DRIVER):
                    self._name_api(kind, int(activity.cbid))
                record = record_from_activity(activity, self._api_names)
                if record is not None:
                    taken.append(record)
            with self._lock:
                self._records.extend(taken)
        except Exception:  # noqa: BLE001  CUPTI's thread must go on; counted, noted at stop
            self._failed_callbacks += 1

    def _name_api(self, kind: int, cbid: int) -> None:
        if (kind, cbid) in self._api_names:
            return
        domain = (self._cupti.CallbackDomain.RUNTIME_API if kind == ACTIVITY_RUNTIME
                  else self._cupti.CallbackDomain.DRIVER_API)
        try:
            self._api_names[(kind, cbid)] = str(self._cupti.get_callback_name(domain, cbid))
        except Exception:  # noqa: BLE001  an unnamed call keeps its number
            self._api_names[(kind, cbid)] = f"cbid {cbid}"

    # --- schedule ---------------------------------------------------------------------------

    def _enable(self) -> None:
        for kind in ENABLED_KINDS:
            self._cupti.activity_enable(kind)
        self._enabled = True

    def _disable(self) -> None:
        for kind in ENABLED_KINDS:
            self._cupti.activity_disable(kind)
        self._enabled = False

    def on_step(self, step: int, previous: Action, action: Action) -> None:
        """Record only in the schedule's recording steps: CUPTI costs per launch while enabled."""
        if not self._subscribed:
            return
        if action.records and not self._enabled:
            self._enable()
        elif not action.records and self._enabled:
            self._disable()

    def save(self) -> None:
        """Flush CUPTI's partly filled buffers and write every record so far as slices."""
        if not self._subscribed:
            return
        self._cupti.activity_flush_all(1)  # 1: CUPTI_ACTIVITY_FLAG_FLUSH_FORCED
        self._dropped += dropped_records(self._cupti)
        with self._lock:
            records, self._records = self._records, []
        if not records:
            return
        table = records_to_slices(records, self._next_id, self._offset_ns, os.getpid())
        self._next_id += table.num_rows
        self._context.sink.append_slices(table, "cupti")

    def stop(self) -> None:
        if not self._subscribed:
            return
        if self._enabled:
            self._disable()
        self.save()
        offset, uncertainty = sample_cupti_clock(self._cupti.get_timestamp)
        low, high = self._clock.bounds_ns or (self._offset_ns, self._offset_ns)
        # Timestamps use the start offset; the bounds cover both readings, so drift shows.
        self._clock.bounds_ns = (min(low, offset - uncertainty), max(high, offset + uncertainty))
        self._clock.method = ("cupti.get_timestamp() + (time_ns - get_timestamp) sampled at start; "
                              f"at stop it was {offset - self._offset_ns:+d} ns different")
        if self._failed_callbacks:
            self.notes.append(f"{self._failed_callbacks} CUPTI buffers could not be read")
        if self._dropped:
            self.notes.append(f"CUPTI dropped {self._dropped} activity records (its buffers were full)")


COLLECTOR = CuptiCollector
