"""Kineto's names for dlprof's slices: categories and argument names, for the timeline exporters.

The Chrome exporter writes them as Kineto does; the Perfetto exporter names its categories and
debug annotations the same way, so both read alike::

    kineto_category("op", None)  # "cpu_op"
"""

from __future__ import annotations

from typing import Any

import orjson

from dlprof.exporters.slice_walks import device_index
from dlprof.keys import Kind

# Kineto's activity categories (libkineto ActivityType names), kept as they are.
KINETO_CATEGORIES = frozenset(
    {
        "cpu_op", "user_annotation", "gpu_user_annotation", "python_function", "kernel",
        "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "cuda_sync",
        "cuda_profiler_range", "cpu_instant_event", "overhead", "collective_comm",
        "external_correlation", "mtia_runtime", "mtia_ccp_events", "hpu_op", "xpu_runtime",
        "xpu_driver", "privateuse1_runtime", "privateuse1_driver", "glow_runtime",
    }
)

# The Kineto category of each dlprof kind, for slices whose own category is not Kineto's.
CATEGORY_OF_KIND: dict[str, str] = {
    Kind.STEP: "user_annotation",  # Kineto records ProfilerStep#N as a user annotation
    Kind.REGION: "user_annotation",  # a dlprof region is a record_function range
    Kind.USER_ANNOTATION: "user_annotation",
    # torch's DataLoader ranges are user annotations; as such they are classified again on import.
    Kind.DATA_WAIT: "user_annotation",
    # Kineto's own module scopes (with_modules, with_stack) are python_function events, where
    # TensorBoard's module view and HTA's call stacks look for them; as user annotations they
    # would crowd the annotations HTA analyses.
    Kind.MODULE: "python_function",
    Kind.PYTHON: "python_function",
    Kind.OP: "cpu_op",
    Kind.COMM: "cpu_op",  # collectives are cpu_op events (nccl:*, record_param_comms)
    Kind.COMPILE: "cpu_op",  # torch.compile's phases are cpu_op events, classified again on import
    Kind.KERNEL: "kernel",
    Kind.MEMCPY: "gpu_memcpy",
    Kind.MEMSET: "gpu_memset",
    Kind.RUNTIME: "cuda_runtime",
    Kind.PROFILER: "overhead",  # dlprof's own pauses: Kineto's category for the profiler's overhead
}

# (Kineto argument name, slice column, parse): the typed columns written back as arguments.
_ARG_COLUMNS: tuple[tuple[str, str, bool], ...] = (
    ("External id", "external_id", False),
    ("Sequence number", "sequence_nr", False),
    ("correlation", "correlation_id", False),
    ("Input Dims", "input_shapes", True),
    ("Input type", "input_dtypes", True),
    ("flops", "flops", False),
    ("bytes", "bytes", False),
    ("registers per thread", "registers", False),
    ("shared memory", "shared_memory", False),
    ("blocks per SM", "blocks_per_sm", False),
    ("warps per SM", "warps_per_sm", False),
    ("grid", "grid", True),
    ("block", "block", True),
    ("est. achieved occupancy %", "occupancy", False),
)
SLICE_COLUMNS = [
    "id", "pid", "tid", "device", "kind", "category", "name", "start_ns", "dur_ns", "stream",
    "args", *(column for _, column, _ in _ARG_COLUMNS),
]


def kineto_category(kind: str, category: str | None) -> str:
    """The category a slice carries in Kineto's layout.

    Args:
        kind: the slice's dlprof kind.
        category: the category its source gave it (``dlprof_module`` for dlprof's own).

    Returns:
        The source's category when it is one of Kineto's, else the Kineto category of the
        kind, else (a foreign trace's own category) the category unchanged.
    """
    if category in KINETO_CATEGORIES:
        return category
    return CATEGORY_OF_KIND.get(kind, category or kind)


def slice_args(batch: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Kineto's ``args`` of each slice of a batch.

    Device slices get ``device`` (the index) and ``stream`` (the stream, else the tid), which is
    how Kineto readers tell them from CPU slices. A foreign trace's extra ``args`` come after
    the typed columns, which win where both name the same argument.

    Args:
        batch: slices as :func:`~dlprof.exporters.base.sorted_slice_batches` gives them, with
            at least the columns of :data:`SLICE_COLUMNS`.

    Returns:
        One dict per slice, in batch order, empty where a slice has no arguments.
    """
    args: list[dict[str, Any]] = [{} for _ in batch["id"]]
    _add_args(args, batch, _ARG_COLUMNS[:1])  # Kineto puts "External id" first
    for i, device in enumerate(batch["device"]):
        if device != "cpu":
            stream = batch["stream"][i]
            args[i]["device"] = device_index(device)
            args[i]["stream"] = stream if stream is not None else batch["tid"][i]
    _add_args(args, batch, _ARG_COLUMNS[1:])
    extras = batch["args"]
    if extras.count(None) == len(extras):
        return args
    for i, extra in enumerate(extras):
        parsed = orjson.loads(extra) if extra else None
        if isinstance(parsed, dict):
            for key, value in parsed.items():
                args[i].setdefault(key, value)
    return args


def _add_args(args: list[dict[str, Any]], batch: dict[str, list[Any]],
              columns: tuple[tuple[str, str, bool], ...]) -> None:
    for key, column, parse in columns:
        values = batch[column]
        if values.count(None) == len(values):  # a column no slice of the batch has (C speed)
            continue
        parsed: dict[str, Any] = {}  # shapes repeat: parse each distinct text once
        for i, value in enumerate(values):
            if value is None:
                continue
            if parse:
                text = value
                value = parsed.get(text)
                if value is None:
                    value = parsed[text] = orjson.loads(text)
            args[i][key] = value
