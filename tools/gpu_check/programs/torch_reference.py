"""Run a script under torch.profiler alone and write torch's own view of its device work as JSON.

    python -m tools.gpu_check.programs.torch_reference OUT.json examples/torch_cnn.py --device cuda

The reference side of the torch check. The profiler is configured as dlprof's torch collector
configures it (the activities it picks, and ``ProfileConfig``'s defaults for shapes, memory,
FLOPs and stacks), the script runs as ``__main__`` as ``dlprof run`` runs it, and the device
events are read from torch's own parse of Kineto's results (``_KinetoEvent``), not from the
Chrome trace that dlprof translates. A kernel's launching op is the CPU op whose correlation id
is the kernel's linked correlation id: how torch itself hangs kernels on ops in ``prof.events()``.

OUT.json: ``{"device": [{"kind", "name", "dur_ns", "launcher"}...], "cpu_ops": N}``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tools.gpu_check.programs import run_as_main

# Kineto's activity types of device work -> dlprof's kinds.
DEVICE_ACTIVITIES = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}


def device_events(events: Iterable[Any], cpu: Any) -> tuple[list[dict[str, Any]], int]:
    """Torch's device events with their launching op, and how many CPU ops it recorded.

    Args:
        events: ``_KinetoEvent`` objects (``prof.profiler.kineto_results.events()``).
        cpu: ``torch.autograd.DeviceType.CPU``.
    """
    taken = list(events)
    # As torch's _parse_kineto_results: device work hangs on the frontend CPU event (linked
    # correlation id 0) whose correlation id is the work's linked correlation id.
    ops = {e.correlation_id(): e.name() for e in taken
           if e.device_type() == cpu and e.linked_correlation_id() == 0 and not e.is_async()}
    device = []
    for event in taken:
        kind = DEVICE_ACTIVITIES.get(event.activity_type())
        if kind is None or event.device_type() == cpu:
            continue
        device.append({"kind": kind, "name": event.name(), "dur_ns": int(event.duration_ns()),
                       "launcher": ops.get(event.linked_correlation_id())})
    cpu_ops = sum(1 for e in taken if e.activity_type() == "cpu_op")
    return device, cpu_ops


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python -m tools.gpu_check.programs.torch_reference OUT.json SCRIPT [ARGS...]",
              file=sys.stderr)
        return 2
    out, script, script_args = Path(argv[0]), Path(argv[1]), argv[2:]
    import torch
    from torch._C._autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from dlprof.config import ProfileConfig

    config = ProfileConfig()
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities, record_shapes=config.record_shapes,
                 profile_memory=config.profile_memory, with_flops=config.with_flops,
                 with_stack=config.with_stack) as prof:
        status = run_as_main(script, script_args)
    if status != 0:
        return status
    device, cpu_ops = device_events(prof.profiler.kineto_results.events(), DeviceType.CPU)
    out.write_text(json.dumps({"device": device, "cpu_ops": cpu_ops}))
    print(f"torch.profiler: {len(device)} kernels, copies and memsets; {cpu_ops} CPU ops", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
