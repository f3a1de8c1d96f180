"""TAU's profile files as text, and the directory that holds them, for :mod:`dlprof.exporters.tau`.

A TAU profile directory holds one file ``profile.<node>.<context>.<thread>`` per thread, or one
``MULTI__<metric>`` subdirectory of such files per metric. :func:`write_profile` writes one file
the way TAU's ``Profiler.cpp`` does; the readers it must satisfy are TAU's ``pprof`` (C, reads
names up to the first ``"`` and lines into 64 KiB buffers) and ParaProf (Java, splits on ``"``,
parses the metadata with a SAX parser, takes a name with ``=>`` for a callpath)::

    with path.open("w") as file:
        write_profile(file, "TIME", [("Metric Name", "TIME")], functions, events)
"""

from __future__ import annotations

import hashlib
import math
import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import orjson

from dlprof.exporters.base import ExportError
from dlprof.keys import Kind
from dlprof.store.reader import Run

# TAU's separator of callpath components and of an event from its context.
CALLPATH_SEPARATOR = " => "
CONTEXT_SEPARATOR = " : "

# pprof reads a line with fgets into a 64 KiB buffer; the rest of a longer line would be taken
# for the next line. Names stay well inside it, with room for the numbers after them.
MAX_NAME_CHARS = 2000  # a component: long C++ kernel names are cut, with a marker and a digest
MAX_PATH_BYTES = 48_000  # a callpath or an event context, in UTF-8
MAX_METADATA_BYTES = 60_000  # the whole second line
MAX_VALUE_CHARS = 4096  # one metadata value
_MAX_DIRECTORY_BYTES = 200  # below every file system's 255-byte name limit
_MAX_TOKEN_CHARS = 63 - len("templated_functions_MULTI_")

# TAU's groups where TAU has one (its GPU and message groups), else a plain word per kind.
GROUP_OF_KIND: dict[str, str] = {
    Kind.STEP: "STEP",
    Kind.REGION: "TAU_USER",
    Kind.USER_ANNOTATION: "TAU_USER",
    Kind.MODULE: "MODULE",
    Kind.PYTHON: "TAU_PYTHON",
    Kind.OP: "OP",
    Kind.COMM: "TAU_MESSAGE",
    Kind.RUNTIME: "TAU_GPU_API",
    Kind.KERNEL: "TAU_GPU_KERNEL",
    Kind.MEMCPY: "TAU_GPU_MEMORY_COPY",
    Kind.MEMSET: "TAU_GPU_MEMORY_SET",
    "cuda_sync": "TAU_GPU_SYNCHRONIZATION",
}

HEADER = "# Name Calls Subrs Excl Incl ProfileCalls"
EVENT_HEADER = "# eventname numevents max min mean sumsqr"

# Characters that end or split a line for some reader (C0 and C1 controls, Unicode line breaks);
# a double quote ends a name for pprof and for ParaProf's tokenizer.
_LINE_BREAKERS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_SPACES = re.compile(" {2,}")
# Characters TAU replaces in a metric name before using it as a directory name.
_DIRECTORY_UNSAFE = re.compile(r'[/\\?%*:|"<> \x00-\x1f\x7f]')
# Characters XML 1.0 forbids even as references.
_XML_FORBIDDEN = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
_PROFILE_FILE = re.compile(r"profile\.\d+\.\d+\.\d+")


@dataclass(frozen=True)
class FunctionLine:
    """One timer of one thread: a flat name or an ``A => B`` callpath."""

    name: str  # already made safe by :func:`clean_name` or :func:`join_path`
    calls: int
    subrs: int
    exclusive: float
    inclusive: float
    group: str


@dataclass(frozen=True)
class EventLine:
    """One user event (TAU's atomic event) of one thread: statistics of its samples."""

    name: str
    count: int
    maximum: float
    minimum: float
    mean: float
    sum_squares: float


def clean_name(text: str | None) -> str:
    """A timer or event name that no TAU reader can misread.

    Args:
        text: the name as recorded.

    Returns:
        The name with ``"`` as ``'``, control characters and line breaks as spaces, runs of
        spaces as one and none at either end, ``=>`` as ``= >`` (ParaProf would take the name
        for a callpath), ``(unnamed)`` for an empty name, and past :data:`MAX_NAME_CHARS` cut,
        ending in ``...[truncated <digest>]`` so that two long names sharing their start stay
        two names.
    """
    # pprof also folds runs of spaces and drops leading ones: do it here so both readers agree.
    name = _SPACES.sub(" ", _LINE_BREAKERS.sub(" ", text or "").replace('"', "'")).strip()
    name = name.replace("=>", "= >")
    if not name:
        return "(unnamed)"
    if len(name) <= MAX_NAME_CHARS:
        return name
    digest = hashlib.sha1((text or "").encode("utf-8", "replace")).hexdigest()[:10]
    marker = f"...[truncated {digest}]"
    return name[: MAX_NAME_CHARS - len(marker)] + marker


def group_of_kind(kind: str) -> str:
    """The TAU group of a slice kind: :data:`GROUP_OF_KIND`'s, else the kind as one word."""
    known = GROUP_OF_KIND.get(kind)
    return known if known else re.sub(r"[^A-Za-z0-9_]", "_", kind).upper() or "TAU_DEFAULT"


def clean_event_name(text: str) -> str:
    """An event name: as :func:`clean_name`, and without TAU's event-context separator."""
    return clean_name(text).replace(CONTEXT_SEPARATOR, " ; ")


def join_path(components: Sequence[str]) -> str:
    """A callpath from cleaned names, outermost first, as TAU names it (``main => a => b``).

    A path longer than :data:`MAX_PATH_BYTES` keeps its innermost components, as TAU's own
    ``TAU_CALLPATH_DEPTH`` limit does; a marker component would show in ParaProf's call graph
    as a function that never ran.
    """
    kept: list[str] = []
    size = 0
    for component in reversed(components):
        size += len(component.encode()) + len(CALLPATH_SEPARATOR)
        if kept and size > MAX_PATH_BYTES:
            break
        kept.append(component)
    return CALLPATH_SEPARATOR.join(reversed(kept))


def metric_token(metric: str) -> str:
    """The metric as it can stand on line 1 of a file.

    pprof reads that line with ``sscanf("%d %s")`` into a 64-byte buffer, so the word
    ``templated_functions_MULTI_<token>`` must be one word of at most 63 bytes: longer names are
    cut, with a digest. ParaProf takes the full name from the ``Metric Name`` metadata instead.
    """
    token = _DIRECTORY_UNSAFE.sub("_", metric).encode("ascii", "replace").decode() or "_"
    if len(token) <= _MAX_TOKEN_CHARS:
        return token
    digest = hashlib.sha1(metric.encode()).hexdigest()[:8]
    return f"{token[: _MAX_TOKEN_CHARS - 9]}_{digest}"


def metric_directories(metrics: Sequence[str]) -> list[str]:
    """The ``MULTI__<metric>`` directory of each metric, distinct, in the order given.

    Args:
        metrics: metric names, TIME first.

    Returns:
        TAU's directory names: ``/\\?%*:|"<>`` and spaces as ``_`` (as TAU's own writer does),
        long names cut with a digest, a ``_2``, ``_3`` suffix where two would be the same.
    """
    taken: set[str] = set()
    directories = []
    for metric in metrics:
        base = "MULTI__" + (_DIRECTORY_UNSAFE.sub("_", metric) or "_")
        if len(base.encode()) > _MAX_DIRECTORY_BYTES:
            digest = hashlib.sha1(metric.encode()).hexdigest()[:10]
            base = base.encode()[: _MAX_DIRECTORY_BYTES - 11].decode("utf-8", "ignore") + "_" + digest
        name, number = base, 1
        while name.lower() in taken:  # case-insensitive file systems too
            number += 1
            name = f"{base}_{number}"
        taken.add(name.lower())
        directories.append(name)
    return directories


def metadata_xml(attributes: Iterable[tuple[str, str]]) -> str:
    """TAU's ``<metadata>`` block, well-formed XML on one line.

    Args:
        attributes: (name, value) pairs, in order.

    Returns:
        ``<metadata><attribute><name>..</name><value>..</value></attribute>...</metadata>`` with
        every name and value escaped, line breaks as spaces, values cut at
        :data:`MAX_VALUE_CHARS`; attributes past :data:`MAX_METADATA_BYTES` are left out, so
        that pprof reads the whole line as one.
    """
    parts = ["<metadata>"]
    size = len("<metadata></metadata>")
    for name, value in attributes:
        part = (f"<attribute><name>{_xml_text(name)}</name>"
                f"<value>{_xml_text(value[:MAX_VALUE_CHARS])}</value></attribute>")
        size += len(part.encode())
        if size > MAX_METADATA_BYTES:
            break
        parts.append(part)
    parts.append("</metadata>")
    return "".join(parts)


def _xml_text(text: str) -> str:
    text = _XML_FORBIDDEN.sub(" ", _LINE_BREAKERS.sub(" ", text))
    # ParaProf looks for this word anywhere on line 2 to expect a SumExclSqr column.
    text = text.replace("SumExclSqr", "SumExcl_Sqr")
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;").replace("'", "&apos;"))


def number(value: float) -> str:
    """A value as TAU's readers parse it (``%lG``, ``Double.parseDouble``), exactly.

    Raises:
        ValueError: the value is NaN or infinite; no reader takes those.
    """
    if not math.isfinite(value):
        raise ValueError(f"not a finite value: {value}")
    return repr(float(value) + 0.0)  # + 0.0: no "-0.0"


def write_profile(file: TextIO, metric: str, metadata: Sequence[tuple[str, str]],
                  functions: Sequence[FunctionLine], events: Sequence[EventLine]) -> None:
    """Write one ``profile.N.C.T`` file.

    Args:
        file: a text file open for writing (UTF-8, ``\\n`` line ends).
        metric: the metric the values are of, named on line 1.
        metadata: the thread's metadata attributes (``Metric Name`` first).
        functions: the thread's timers; ``calls`` must be positive (readers skip others).
        events: the thread's user events, left out entirely when empty, as TAU does.
    """
    file.write(f"{len(functions)} templated_functions_MULTI_{metric_token(metric)}\n")
    file.write(f"{HEADER} # {metadata_xml(metadata)}\n")
    for f in functions:
        file.write(f'"{f.name}" {f.calls} {f.subrs} {number(f.exclusive)} {number(f.inclusive)} '
                   f'0 GROUP="{f.group}"\n')
    file.write("0 aggregates\n")
    if events:
        file.write(f"{len(events)} userevents\n{EVENT_HEADER}\n")
        for e in events:
            file.write(f'"{e.name}" {e.count} {number(e.maximum)} {number(e.minimum)} '
                       f"{number(e.mean)} {number(e.sum_squares)}\n")


def profile_paths(path: Path, threads: Sequence[tuple[int, int]], directories: Sequence[str]) -> list[Path]:
    """The files of a TAU profile directory.

    Args:
        path: the directory.
        threads: (node, thread) of every file, in order.
        directories: the ``MULTI__`` directory of each metric, or none for TIME alone.

    Returns:
        ``path/profile.N.0.T`` for each thread, or ``path/MULTI__M/profile.N.0.T`` for each
        metric and thread, metric by metric.
    """
    files = [f"profile.{node}.0.{thread}" for node, thread in threads]
    if not directories:
        return [path / name for name in files]
    return [path / directory / name for directory in directories for name in files]


def check_target(path: Path) -> None:
    """Refuse to replace anything but a directory of TAU profiles (an earlier export, say).

    Raises:
        ExportError: ``path`` is a file, or a directory holding something else.
    """
    if path.exists() and not path.is_dir():
        raise ExportError(f"{path}: a file is in the way; a TAU profile is a directory")
    if not path.is_dir():
        return
    for entry in path.iterdir():
        inside = list(entry.iterdir()) if entry.is_dir() and entry.name.startswith("MULTI__") else [entry]
        for item in inside:
            if item.is_symlink() or entry.is_symlink() or not (item.is_file() and _PROFILE_FILE.fullmatch(item.name)):
                raise ExportError(f"{path}: holds {item.relative_to(path)}, not only TAU profiles; "
                                  "export into a new directory")


def run_attributes(run: Run) -> list[tuple[str, str]]:
    """The metadata every file of a run carries, under TAU's own names where TAU has them.

    Returns:
        (name, value) pairs; empty values are left out.
    """
    manifest, host = run.manifest, run.manifest.host
    slices = run.slices
    start = manifest.start_ns or int(slices["start_ns"].min())
    end = manifest.end_ns or int((slices["start_ns"] + slices["dur_ns"].fillna(0)).max())
    attributes = [
        ("Starting Timestamp", str(start // 1000)),  # TAU: integer microseconds since the epoch
        ("Ending Timestamp", str(end // 1000)),
        ("Hostname", host.hostname),
        ("OS Name", host.os),
        ("CPU Type", host.cpu_model),
        ("CPU Cores", str(host.cpu_cores) if host.cpu_cores else ""),
        ("Memory Size", f"{host.memory_bytes // 1024} kB" if host.memory_bytes else ""),
        ("Python Version", host.python),
        ("Executable", manifest.command[0] if manifest.command else ""),
        ("Command Line", shlex.join(manifest.command)),
        ("dlprof Run", manifest.name),
        ("dlprof Status", str(run.status)),
        ("World Size", str(manifest.world_size)),
    ]
    for number, device in enumerate(manifest.devices):
        attributes.append((f"Device {device.get('id', number)}", orjson.dumps(device).decode()))
    return [(name, value) for name, value in attributes if value]


def thread_attributes(pid: int, tid: int, device: str) -> list[tuple[str, str]]:
    """The metadata of one thread; a GPU stream's names its device, context and stream as TAU does.

    dlprof keeps no CUPTI context id; PyTorch works in each device's primary context, one per
    process, so the process id stands for the context.
    """
    attributes = [("Process ID", str(pid)), ("Thread ID", str(tid)), ("Device", device or "cpu")]
    if device not in ("", "cpu"):
        kind, _, index = device.partition(":")
        prefix = "CUDA" if kind == "cuda" else "GPU"
        attributes += [(f"{prefix} Device", index or "0"), (f"{prefix} Context", str(pid)),
                       (f"{prefix} Stream", str(tid))]
    return attributes
