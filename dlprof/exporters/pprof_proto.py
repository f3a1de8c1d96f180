"""pprof's ``profile.proto``, gzipped: the run as call-path samples for ``go tool pprof``.

Named ``pprof-proto`` to keep it apart from ``dlprof pprof``, the TAU-style table::

    PprofProtoExporter().export(dlprof.load("runs/cnn"), Path("cnn.pb.gz"))
    # go tool pprof -top cnn.pb.gz
    # go tool pprof -top -sample_index=gpu cnn.pb.gz
    # go tool pprof -http=: cnn.pb.gz          (flame graph)

The stacks are the store's nesting of steps, regions, modules and ops on each thread: a slice's
stack is the slice, then its parent, up to the outermost slice of its thread (leaf first, as
pprof wants). Every slice adds its *self* time, so pprof's flat time of a name is the self time
``dlprof top`` shows for it and its cumulative time the total (for names that do not call
themselves). Samples with the same stack and labels are merged, as pprof itself would.

Sample types, in this order:

* ``calls`` (count): slices, so ``-sample_index=calls`` counts calls;
* ``wall`` (nanoseconds): self time on CPU threads, the default;
* ``gpu`` (nanoseconds), when the run has device work: the self time of each slice on a device
  stream, as the store computed it (what ``dlprof top --kind kernel`` shows). A device slice
  stands under the op that launched it (the parent of the runtime call with its correlation id,
  as ``dlprof top --group-by op`` finds it), else under the slice enclosing it on its stream,
  if any, else under ``(no launching op)``. Device slices add nothing to ``wall``, so the time
  of a kernel is not counted a second time inside the wall time of the op that launched it;
* one per metric of the metrics table (hardware counters measured over a slice), named as the
  table names it, unit ``count``, rounded to integers: added on the slice it was measured on.

Labels on every sample: ``rank``, ``pid``, ``device`` and ``thread`` (a CPU thread) or
``stream`` (a device stream), for ``-tagfocus``, ``-tagroot`` and ``-tags``. Counters and memory
rows are not profiles of call paths and are not written.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from dlprof.analysis.aggregate import UNATTRIBUTED
from dlprof.exporters.base import Exporter, Ticker, atomic_output
from dlprof.exporters.chrome import program_name
from dlprof.exporters.protobuf_wire import Message
from dlprof.exporters.slice_walks import slices_of, sorted_slice_batches
from dlprof.keys import Kind, StoreTable
from dlprof.store.reader import Run

CALLS = ("calls", "count")
WALL = ("wall", "nanoseconds")
GPU = ("gpu", "nanoseconds")
METRIC_UNIT = "count"
UNATTRIBUTED_KIND = "device"  # the "file" of the (no launching op) frame

_COLUMNS = ["id", "rank", "pid", "device", "tid", "kind", "name", "depth", "self_ns"]
_MAPPING_ID = 1  # one mapping for every location: the program the run recorded
_SAMPLES_PER_WRITE = 4096

# profile.proto field numbers (github.com/google/pprof, proto/profile.proto).
_PROFILE_SAMPLE_TYPE, _PROFILE_SAMPLE, _PROFILE_MAPPING, _PROFILE_LOCATION = 1, 2, 3, 4
_PROFILE_FUNCTION, _PROFILE_STRING_TABLE, _PROFILE_TIME, _PROFILE_DURATION = 5, 6, 9, 10
_PROFILE_PERIOD_TYPE, _PROFILE_PERIOD, _PROFILE_COMMENT, _PROFILE_DEFAULT_TYPE = 11, 12, 13, 14
_VALUE_TYPE_TYPE, _VALUE_TYPE_UNIT = 1, 2
_SAMPLE_LOCATION, _SAMPLE_VALUE, _SAMPLE_LABEL = 1, 2, 3
_LABEL_KEY, _LABEL_STR = 1, 2
_MAPPING_ID_FIELD, _MAPPING_FILENAME, _MAPPING_HAS_FUNCTIONS = 1, 5, 7
_LOCATION_ID, _LOCATION_MAPPING, _LOCATION_LINE = 1, 2, 4
_LINE_FUNCTION = 1
_FUNCTION_ID, _FUNCTION_NAME, _FUNCTION_FILENAME = 1, 2, 4


class PprofProtoExporter(Exporter):
    """The run as one gzipped pprof profile, every rank in it (told apart by a label)."""

    format_name = "pprof-proto"
    file_extension = ".pb.gz"
    binary = True
    description = "gzipped pprof profile.proto by call path (go tool pprof)"

    def write(self, run: Run, path: Path, ticker: Ticker) -> list[Path]:
        slices = slices_of(run)
        on_cpu = pc.equal(slices.column("device"), "cpu")
        host, device = slices.filter(on_cpu), slices.filter(pc.invert(on_cpu))
        metric_names, metrics = metric_values(run)
        types = [CALLS, WALL, *([GPU] if device.num_rows else []),
                 *((name, METRIC_UNIT) for name in metric_names)]
        profile = _Profile(types, metrics, metric_base=len(types) - len(metric_names))
        launchers = launching_ops(slices)
        # Host first: a device slice needs the call path of the op that launched it.
        launcher_nodes = profile.add_slices(host, types.index(WALL), self.batch_rows, ticker,
                                            wanted=frozenset(launchers.values()))
        if device.num_rows:
            profile.add_slices(device, types.index(GPU), self.batch_rows, ticker, frozenset(),
                               launchers, launcher_nodes)
        for table in (StoreTable.COUNTERS, StoreTable.MEMORY):
            ticker.advance(run.arrow(table).num_rows)  # read, but not profiles of call paths
        start = pc.min(slices.column("start_ns")).as_py()
        end = pc.max(pc.add(slices.column("start_ns"), slices.column("dur_ns"))).as_py()
        header = _Header(
            program=program_name(run),
            comments=[f"dlprof run {run.manifest.name}", " ".join(run.manifest.command)],
            time_ns=start,
            duration_ns=end - start,
        )
        with atomic_output(path) as raw:
            # mtime 0 and no file name in the gzip header: the same run gives the same bytes.
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as file:
                profile.serialize(file.write, header)
        return [path]


def metric_values(run: Run) -> tuple[list[str], dict[int, list[tuple[int, float]]]]:
    """The run's metrics by slice.

    Args:
        run: the run to export.

    Returns:
        The metric names, sorted, and for each slice id that has metrics its (index into the
        names, value) pairs.
    """
    table = run.arrow(StoreTable.METRICS)
    if table.num_rows == 0:
        return [], {}
    metric = table.column("metric").cast(pa.string())
    names = sorted(pc.unique(metric).to_pylist())
    index = {name: i for i, name in enumerate(names)}
    values: dict[int, list[tuple[int, float]]] = {}
    for slice_id, name, value in zip(table.column("slice_id").to_pylist(), metric.to_pylist(),
                                     table.column("value").to_pylist(), strict=True):
        if slice_id is not None and value is not None:
            values.setdefault(slice_id, []).append((index[name], value))
    return names, values


def launching_ops(slices: pa.Table) -> dict[int, int]:
    """The op that launched each slice on a device stream.

    The rule of :func:`dlprof.analysis.aggregate.launches`, for every slice on a device track
    (``Stream Sync`` too, not only kernels, memcpy and memset): the runtime call with the same
    correlation id on the same rank links it to the call's parent; where several runtime calls
    share a correlation id, the first in the table wins.

    Args:
        slices: the slices table (with its ``rank`` column).

    Returns:
        ``{device slice id: launching op id}`` for the device slices that have one.
    """
    keys = ["rank", "correlation_id"]
    correlated = slices.select(["id", "kind", "device", "parent_id", *keys]).filter(
        pc.is_valid(slices.column("correlation_id")))
    is_call = pc.and_(pc.equal(correlated.column("kind").cast(pa.string()), str(Kind.RUNTIME)),
                      pc.is_valid(correlated.column("parent_id")))
    # Single-threaded, so that "first" is the first in table order.
    calls = correlated.filter(is_call).group_by(keys, use_threads=False).aggregate(
        [("parent_id", "first")])
    work = correlated.filter(pc.not_equal(correlated.column("device"), "cpu")).select(["id", *keys])
    linked = work.join(calls, keys=keys, join_type="inner")
    return dict(zip(linked.column("id").to_pylist(), linked.column("parent_id_first").to_pylist(),
                    strict=True))


@dataclass(frozen=True)
class _Header:
    """What the profile says about itself besides its samples."""

    program: str  # the mapping's file name, which pprof shows as "File:"
    comments: list[str]
    time_ns: int
    duration_ns: int


@dataclass
class _Profile:
    """Samples merged by (call path, labels), with the tables they refer to."""

    types: list[tuple[str, str]]
    metrics: dict[int, list[tuple[int, float]]]  # slice id -> (metric number, value)
    metric_base: int  # the index in types of metric number 0
    strings: dict[str, int] = field(default_factory=lambda: {"": 0})
    functions: dict[tuple[str, str], int] = field(default_factory=dict)
    # A call path is a node: (caller node, function id) -> node id; node 0 is the empty path.
    nodes: dict[tuple[int, int], int] = field(default_factory=dict)
    node_function: list[int] = field(default_factory=lambda: [0])
    node_caller: list[int] = field(default_factory=lambda: [0])
    samples: dict[tuple[int, tuple[Any, ...]], list[float]] = field(default_factory=dict)

    def string(self, text: str) -> int:
        index = self.strings.get(text)
        if index is None:
            index = self.strings[text] = len(self.strings)
        return index

    def node(self, caller: int, name: str, kind: str) -> int:
        """The call path of ``name`` called from ``caller``."""
        function = self.functions.get((name, kind))
        if function is None:
            function = self.functions[(name, kind)] = len(self.functions) + 1
        key = (caller, function)
        node = self.nodes.get(key)
        if node is None:
            node = self.nodes[key] = len(self.node_function)
            self.node_function.append(function)
            self.node_caller.append(caller)
        return node

    def add_slices(self, table: pa.Table, value_index: int, batch_rows: int, ticker: Ticker,
                   wanted: frozenset[int], launchers: dict[int, int] | None = None,
                   launcher_nodes: dict[int, int] | None = None) -> dict[int, int]:
        """Add each slice to the sample of its call path, walking each track depth first.

        Args:
            table: the slices of some tracks, all on CPU threads or all on device streams.
            value_index: the sample value that self time goes to (wall or gpu).
            batch_rows: rows turned into Python values at a time.
            ticker: advanced by every row.
            wanted: slice ids whose call path the caller needs back (the launching ops).
            launchers: for device slices, their launching op (see :func:`launching_ops`).
            launcher_nodes: the call path of each launching op.

        Returns:
            The call path of each wanted slice id.
        """
        on_device = launchers is not None
        launchers = launchers or {}
        launcher_nodes = launcher_nodes or {}
        found: dict[int, int] = {}
        track: tuple[int, int, str, int] | None = None
        stack: list[int] = []  # the call path of the open slice at each depth of the track
        labels: tuple[Any, ...] = ()
        unattributed = 0
        for batch in sorted_slice_batches(table, _COLUMNS, batch_rows):
            for i, slice_id in enumerate(batch["id"]):
                here = (batch["rank"][i], batch["pid"][i], batch["device"][i], batch["tid"][i])
                if here != track:
                    track, stack = here, []
                    labels = _labels(*here, on_device)
                # The store's depth: the slices of a track come parents first, so the open
                # slices deeper than this one have ended and the one above it is its parent.
                del stack[batch["depth"][i]:]
                caller = stack[-1] if stack else 0
                if on_device:
                    launcher = launcher_nodes.get(launchers.get(slice_id, -1))
                    if launcher is not None:
                        caller = launcher
                    elif not stack:
                        unattributed = unattributed or self.node(0, UNATTRIBUTED, UNATTRIBUTED_KIND)
                        caller = unattributed
                node = self.node(caller, batch["name"][i], batch["kind"][i])
                stack.append(node)
                if slice_id in wanted:
                    found[slice_id] = node
                values = self.samples.get((node, labels))
                if values is None:
                    values = self.samples[(node, labels)] = [0] * len(self.types)
                values[0] += 1
                values[value_index] += batch["self_ns"][i]
                for metric, value in self.metrics.get(slice_id, ()):
                    values[self.metric_base + metric] += value
            ticker.advance(len(batch["id"]))
        return found

    def serialize(self, write: Callable[[bytes], object], header: _Header) -> None:
        """Write the profile, its samples a few thousand at a time.

        Args:
            write: takes each piece of the encoded profile, in order.
            header: the profile's time, duration, program and comments.
        """
        for name, unit in self.types:
            write(Message().message(_PROFILE_SAMPLE_TYPE, self._value_type(name, unit)).to_bytes())
        label_messages: dict[tuple[Any, ...], list[Message]] = {}
        chunk = Message()
        for count, ((node, labels), values) in enumerate(self.samples.items(), start=1):
            if labels not in label_messages:
                label_messages[labels] = [self._label(key, value) for key, value in labels]
            sample = Message().packed(_SAMPLE_LOCATION, self._path(node))
            sample.packed(_SAMPLE_VALUE, (round(v) for v in values))
            for label in label_messages[labels]:
                sample.message(_SAMPLE_LABEL, label)
            chunk.message(_PROFILE_SAMPLE, sample)
            if count % _SAMPLES_PER_WRITE == 0:
                write(chunk.to_bytes())
                chunk = Message()
        write(chunk.to_bytes())
        mapping = (Message().uint(_MAPPING_ID_FIELD, _MAPPING_ID)
                   .uint(_MAPPING_FILENAME, self.string(header.program))
                   .uint(_MAPPING_HAS_FUNCTIONS, True))  # nothing for pprof to symbolise
        tail = Message().message(_PROFILE_MAPPING, mapping)
        # One location per function, with the function's id: a frame has no address.
        for (name, kind), function in self.functions.items():
            line = Message().uint(_LINE_FUNCTION, function)
            tail.message(_PROFILE_LOCATION, Message().uint(_LOCATION_ID, function)
                         .uint(_LOCATION_MAPPING, _MAPPING_ID).message(_LOCATION_LINE, line))
            # No system name: pprof takes a function whose name equals its system name for
            # an undemangled symbol and strips what looks like C++ arguments from it, turning
            # "Memcpy HtoD (Pageable -> Device)" into "Memcpy HtoD ".
            tail.message(_PROFILE_FUNCTION, Message().uint(_FUNCTION_ID, function)
                         .uint(_FUNCTION_NAME, self.string(name))
                         .uint(_FUNCTION_FILENAME, self.string(kind)))
        comments = [self.string(text) for text in header.comments if text]
        default_type = self.string(WALL[0])
        period_type = self._value_type(*WALL)
        for text in self.strings:  # every string is interned by now
            tail.string(_PROFILE_STRING_TABLE, text)
        tail.uint(_PROFILE_TIME, header.time_ns).uint(_PROFILE_DURATION, header.duration_ns)
        tail.message(_PROFILE_PERIOD_TYPE, period_type).uint(_PROFILE_PERIOD, 1)
        tail.packed(_PROFILE_COMMENT, comments).uint(_PROFILE_DEFAULT_TYPE, default_type)
        write(tail.to_bytes())

    def _value_type(self, name: str, unit: str) -> Message:
        return Message().uint(_VALUE_TYPE_TYPE, self.string(name)).uint(_VALUE_TYPE_UNIT, self.string(unit))

    def _label(self, key: str, value: object) -> Message:
        # String labels, ids included: pprof drops a numeric label whose value is 0 (rank 0,
        # stream 0), and string labels are what -tagfocus=rank=1 matches most simply.
        return Message().uint(_LABEL_KEY, self.string(key)).uint(_LABEL_STR, self.string(str(value)))

    def _path(self, node: int) -> list[int]:
        """The location ids of a call path, leaf first (a location's id is its function's)."""
        path = []
        while node:
            path.append(self.node_function[node])
            node = self.node_caller[node]
        return path


def _labels(rank: int, pid: int, device: str, tid: int, on_device: bool) -> tuple[Any, ...]:
    return (("rank", rank), ("pid", pid), ("device", device), ("stream" if on_device else "thread", tid))
