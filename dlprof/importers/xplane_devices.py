"""An XPlane's device planes (``/device:GPU:0``): kernels, copies and sets on their streams.

TensorFlow's CUPTI tracer (and JAX's) write one line per stream; each event is a kernel, a
memcpy or a memset, with stats: ``correlation_id`` (the runtime call on ``/host:CUPTI`` that
launched it), ``kernel_details`` (``regs:32 static_shared:0 dynamic_shared:0 grid:1,1,1
block:64,1,1``), ``memcpy_details`` (``kind_src:pageable size:4096 ...``), ``tf_op`` (the op
that launched it, ``name:Type``). They become slices as Kineto's do for PyTorch.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from dlprof.importers.tf_ops import parse_op_event
from dlprof.importers.xplane_rows import EventClass, SliceRows, Track, event_damage
from dlprof.importers.xplane_stats import DERIVED_LINES, StatNames, as_int64, fold_id, scalar
from dlprof.keys import Kind

DEVICE_PLANE = re.compile(r"/device:(?P<type>[A-Z]+):(?P<index>\d+)")


def device_plane(plane: Any, base_ns: int, device: re.Match[str], rows: SliceRows,
                 dropped: Counter[str]) -> tuple[dict[str, Any], int, int]:
    """Append a device plane's work to ``rows``.

    Args:
        plane: the ``XPlane``.
        base_ns: what its line timestamps are relative to.
        device: ``DEVICE_PLANE`` matched on its name.
        rows: where its slices go.
        dropped: damaged events counted here per reason (:func:`event_damage`).

    Returns:
        The device as the plane describes it, the events read, and the instants left out.
    """
    stats = StatNames(plane)
    kind_of_device = "cuda" if device["type"] == "GPU" else device["type"].lower()
    name = f"{kind_of_device}:{device['index']}"
    info: dict[str, Any] = {"id": name, "plane": plane.name}
    for stat in plane.stats:
        info[stats.name(stat.metadata_id)] = scalar(stat, plane)
    sparse = rows.sparse
    events = instants = 0
    for line in plane.lines:
        if line.name in DERIVED_LINES:
            continue
        stream = fold_id(line.id)
        track = rows.add_track(Track(name, stream, host=False))
        line_ps = (base_ns + line.timestamp_ns) * 1000
        for event in line.events:
            events += 1
            if event.duration_ps == 0:
                instants += 1
                continue
            start_ps = line_ps + event.offset_ps
            damage = event_damage(start_ps, event.duration_ps)
            if damage is not None:
                dropped[damage] += 1
                continue
            metadata = plane.event_metadata[event.metadata_id]
            values = stats.all(event)
            row = len(rows)
            rows.cls.append(rows.code(_device_class(metadata.display_name or metadata.name, values)))
            rows.track.append(track)
            rows.start.append(start_ps // 1000)
            rows.dur.append((start_ps + event.duration_ps) // 1000 - start_ps // 1000)
            sparse["stream"][row] = stream
            if "correlation_id" in values:
                sparse["correlation_id"][row] = as_int64(values["correlation_id"])
            for key, value in _launch_details(values).items():
                sparse[key][row] = value
    return info, events, instants


def _device_class(name: str, values: dict[str, Any]) -> EventClass:
    if "memcpy_details" in values or name.lower().startswith("memcpy"):
        kind = Kind.MEMCPY
    elif "memset_details" in values or name.lower().startswith("memset"):
        kind = Kind.MEMSET
    else:
        kind = Kind.KERNEL
    op = parse_op_event(str(values["tf_op"])) if "tf_op" in values else None
    if op is None:
        return EventClass(kind, name, str(kind))
    return EventClass(kind, name, str(kind), op.op_type, op.scope)


def _launch_details(values: dict[str, Any]) -> dict[str, Any]:
    """Launch configuration and copy sizes from the ``*_details`` stats' ``key:value`` words."""
    details: dict[str, str] = {}
    for key in ("kernel_details", "memcpy_details", "memset_details"):
        for word in str(values.get(key, "")).split():
            name, _, value = word.partition(":")
            details[name] = value
    found: dict[str, Any] = {}
    registers = as_int64(details.get("regs"))
    if registers is not None and registers < 1 << 31:
        found["registers"] = registers
    shared = [number for k in ("static_shared", "dynamic_shared") if (number := as_int64(details.get(k))) is not None]
    if shared:
        found["shared_memory"] = sum(shared) if sum(shared) < 1 << 63 else None
    for key in ("grid", "block"):
        if key in details:
            found[key] = "[" + details[key] + "]"
    size = as_int64(details.get("size"))
    if size is not None:
        found["bytes"] = size
    return found
