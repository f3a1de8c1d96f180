"""Run a script under torch.profiler alone and write torch's own view of its device work as JSON.

    python -m tools.gpu_check.programs.torch_reference OUT.json examples/torch_cnn.py --device cuda

The reference side of the torch check. The profiler is configured as dlprof's torch collector
configures it (the activities it picks, and the defaults of dlprof's ``ProfileConfig`` for
shapes, memory, FLOPs and stacks, written out here: the reference imports nothing of dlprof, and
a test holds the two equal), the script runs as ``__main__`` as ``dlprof run`` runs it, and the
device events are read from torch's own parse of Kineto's results (``_KinetoEvent``), not from the
Chrome trace that dlprof translates. A kernel's launching op is the CPU op whose correlation id is
the kernel's linked correlation id: how torch itself hangs kernels on ops in ``prof.events()``.

``_KinetoEvent`` tells the kind of an event in one of three ways, by torch release, and each is
read where the installed torch has it: ``activity_type()`` (Kineto's own activity name; torch 2.4
and 2.11 lack it), else ``is_user_annotation()`` (torch 2.11 has it; 2.4 does not) to leave out a
``record_function`` range's span on the GPU, else the names of the CPU side's user-scope ranges,
which that span repeats. Without ``activity_type``, copies and memsets are told from kernels by
the names CUPTI gives them (``Memcpy HtoD (Pageable -> Device)``, ``Memset (Device)``).

OUT.json: ``{"device": [{"kind", "name", "dur_ns", "launcher"}...], "cpu_ops": N}`` (``cpu_ops``:
the CPU ops and ranges that device work can hang on).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tools.gpu_check.programs import run_as_main

# Kineto's activity types of device work -> the check's kinds.
DEVICE_ACTIVITIES = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
# How CUPTI names copies and memsets (Kineto's GpuActivity names): the kind where no activity type is.
DEVICE_NAME_PREFIXES = (("Memcpy ", "memcpy"), ("Memset ", "memset"))
USER_SCOPE = 7  # at::RecordScope::USER_SCOPE: the scope of a record_function range
# dlprof's ProfileConfig defaults (dlprof/config.py), as its torch collector passes them.
RECORD_SHAPES = True
PROFILE_MEMORY = True
WITH_FLOPS = True
WITH_STACK = False


def user_ranges(events: Iterable[Any], cpu: Any) -> frozenset[str]:
    """The names of the ``record_function`` ranges on the CPU side (scope USER_SCOPE)."""
    return frozenset(e.name() for e in events if e.device_type() == cpu and e.scope() == USER_SCOPE)


def device_kind(event: Any, cpu: Any, ranges: frozenset[str]) -> str | None:
    """The kind of device work ``event`` is (kernel, memcpy, memset), or None for anything else.

    Args:
        event: a ``_KinetoEvent``.
        cpu: ``torch.autograd.DeviceType.CPU``.
        ranges: from :func:`user_ranges`; read only where torch has neither ``activity_type`` nor
            ``is_user_annotation``.
    """
    if event.device_type() == cpu:
        return None
    activity_type = getattr(event, "activity_type", None)
    if activity_type is not None:
        return DEVICE_ACTIVITIES.get(activity_type())
    is_user_annotation = getattr(event, "is_user_annotation", None)
    name = event.name()
    if is_user_annotation() if is_user_annotation is not None else name in ranges:
        return None  # a range's span on the GPU (gpu_user_annotation), not work of its own
    return next((kind for prefix, kind in DEVICE_NAME_PREFIXES if name.startswith(prefix)), "kernel")


def device_events(events: Iterable[Any], cpu: Any) -> tuple[list[dict[str, Any]], int]:
    """Torch's device events with their launching op, and how many CPU ops they can hang on.

    Args:
        events: ``_KinetoEvent`` objects (``prof.profiler.kineto_results.events()``).
        cpu: ``torch.autograd.DeviceType.CPU``.
    """
    taken = list(events)
    # As torch's _parse_kineto_results: device work hangs on the frontend CPU event (linked
    # correlation id 0) whose correlation id is the work's linked correlation id.
    ops = {e.correlation_id(): e.name() for e in taken
           if e.device_type() == cpu and e.linked_correlation_id() == 0 and not e.is_async()}
    ranges = user_ranges(taken, cpu)
    device = []
    for event in taken:
        kind = device_kind(event, cpu, ranges)
        if kind is not None:
            device.append({"kind": kind, "name": event.name(), "dur_ns": int(event.duration_ns()),
                           "launcher": ops.get(event.linked_correlation_id())})
    return device, len(ops)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python -m tools.gpu_check.programs.torch_reference OUT.json SCRIPT [ARGS...]",
              file=sys.stderr)
        return 2
    out, script, script_args = Path(argv[0]), Path(argv[1]), argv[2:]
    import torch
    from torch._C._autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities, record_shapes=RECORD_SHAPES, profile_memory=PROFILE_MEMORY,
                 with_flops=WITH_FLOPS, with_stack=WITH_STACK) as prof:
        status = run_as_main(script, script_args)
    if status != 0:
        return status
    device, cpu_ops = device_events(prof.profiler.kineto_results.events(), DeviceType.CPU)
    out.write_text(json.dumps({"device": device, "cpu_ops": cpu_ops}))
    print(f"torch.profiler {torch.__version__}: {len(device)} kernels, copies and memsets; {cpu_ops} CPU ops",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
