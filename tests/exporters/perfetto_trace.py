"""A Perfetto trace dlprof exported, read back with Perfetto's own protobuf classes."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

import dlprof
from dlprof.exporters.perfetto import PerfettoExporter
from dlprof.store.reader import Run


@dataclass
class Slice:
    track: int
    name: str
    category: str
    start: int
    end: int = -1
    depth: int = 0
    args: dict[str, Any] = field(default_factory=dict)
    flows_out: list[int] = field(default_factory=list)
    flows_in: list[int] = field(default_factory=list)


@dataclass
class Parsed:
    packets: list[pb.TracePacket]
    tracks: dict[int, pb.TrackDescriptor]
    slices: list[Slice]
    counters: dict[int, list[tuple[int, float]]]


def _value(annotation: pb.DebugAnnotation) -> Any:
    kind = annotation.WhichOneof("value")
    value = getattr(annotation, kind)
    return json.loads(value) if kind == "legacy_json_value" else value


def read_back(path: Path) -> Parsed:
    """Parse a trace as a reader does; fails on any ill-formed begin/end or unknown iid."""
    packets = list(pb.Trace.FromString(path.read_bytes()).packet)
    tracks: dict[int, pb.TrackDescriptor] = {}
    names: dict[int, str] = {}
    categories: dict[int, str] = {}
    arg_names: dict[int, str] = {}
    open_slices: dict[int, list[Slice]] = defaultdict(list)
    last_ts: dict[int, int] = {}
    slices: list[Slice] = []
    counters: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for packet in packets:
        for entry in packet.interned_data.event_names:
            names[entry.iid] = entry.name
        for entry in packet.interned_data.event_categories:
            categories[entry.iid] = entry.name
        for entry in packet.interned_data.debug_annotation_names:
            arg_names[entry.iid] = entry.name
        if packet.HasField("track_descriptor"):
            assert packet.track_descriptor.uuid not in tracks
            tracks[packet.track_descriptor.uuid] = packet.track_descriptor
        if not packet.HasField("track_event"):
            continue
        event = packet.track_event
        assert event.track_uuid in tracks, "an event on a track not yet described"
        assert packet.timestamp >= last_ts.get(event.track_uuid, 0), "time runs back on a track"
        last_ts[event.track_uuid] = packet.timestamp
        stack = open_slices[event.track_uuid]
        if event.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            assert packet.sequence_flags & pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
            begun = Slice(event.track_uuid, names[event.name_iid],
                          ",".join(categories[i] for i in event.category_iids), packet.timestamp,
                          depth=len(stack),
                          args={arg_names[a.name_iid]: _value(a) for a in event.debug_annotations},
                          flows_out=list(event.flow_ids), flows_in=list(event.terminating_flow_ids))
            stack.append(begun)
            slices.append(begun)
        elif event.type == pb.TrackEvent.TYPE_SLICE_END:
            assert stack, "an end with no slice open"
            stack.pop().end = packet.timestamp
        elif event.type == pb.TrackEvent.TYPE_COUNTER:
            counters[event.track_uuid].append((packet.timestamp, event.double_counter_value))
    assert not any(open_slices.values()), "slices left open at the end of the trace"
    return Parsed(packets, tracks, slices, counters)


def export(run_dir: Path, out: Path) -> tuple[Run, Parsed]:
    run = dlprof.load(run_dir)
    [path] = PerfettoExporter().export(run, out / "trace.perfetto-trace")
    return run, read_back(path)
