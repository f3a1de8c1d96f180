"""Check (a): the torch collector on CUDA against torch.profiler's own view of the same program.

    python -m tools.gpu_check.checks.torch_cuda --work DIR --result FILE --seconds 240

The bundled CNN runs on ``cuda`` three times: alone (a warm-up, so that neither profiled run
pays for the GPU's first use), under ``dlprof run`` with the default collectors, and under
torch.profiler alone configured as dlprof configures it
(:mod:`tools.gpu_check.programs.torch_reference`). For kernels, memcpy and memset: the calls per
name must be equal and the device time within 2 %; every one must link to its launching op
through the store's correlation ids, and that op must be the one torch itself links it to.
"""

from __future__ import annotations

import json
import sys

from tools.gpu_check.checks.harness import ROOT, CannotRun, Check, main
from tools.gpu_check.checks.stored import Link, device_work, run_complete, within_span
from tools.gpu_check.compare import (
    DEVICE_KINDS,
    Work,
    check_linked,
    compare_calls,
    compare_launchers,
    compare_time,
)
from tools.gpu_check.report import Part, Status

EXAMPLE = ROOT / "examples" / "torch_cnn.py"
# Long enough for a stable device time, short enough for one profiling cycle (dlprof saves every
# 100 steps): both sides then record every step from the program's start to its end.
PROGRAM = [str(EXAMPLE), "--device", "cuda", "--steps", "50", "--batch-size", "256"]
WARM_UP = [str(EXAMPLE), "--device", "cuda", "--steps", "10", "--batch-size", "256"]


def check(c: Check) -> None:
    import torch

    if not torch.cuda.is_available():
        raise CannotRun("torch sees a CUDA device",
                        f"torch {torch.__version__} (built for CUDA {torch.version.cuda}) sees none")
    c.python("the CNN alone on cuda (warm-up)", WARM_UP)
    path = c.dlprof_run("dlprof run examples/torch_cnn.py --device cuda", "run", None, PROGRAM)
    run = c.load(path)
    complete = run_complete(run, ["torch"])
    notes = " ".join(complete.figures.get("notes", {}).get("torch", []))
    if "no CUDA device" in notes:
        complete = Part(complete.what, Status.FAILED, f"the torch collector saw no GPU: {notes}",
                        complete.figures)
    c.add(complete)
    c.add(within_span(run, "kineto"))
    reference_path = c.work / "torch_profiler.json"
    c.python("the CNN under torch.profiler alone",
             ["-m", "tools.gpu_check.programs.torch_reference", str(reference_path), *PROGRAM])
    theirs = [Work(d["kind"], d["name"], int(d["dur_ns"]), d["launcher"])
              for d in json.loads(reference_path.read_text())["device"]]
    ours = device_work(run, Link.OP)
    for kind in DEVICE_KINDS:
        c.add(compare_calls(ours, theirs, kind))
    for kind in DEVICE_KINDS:
        c.add(compare_time(ours, theirs, kind))
    c.add(check_linked(ours, "correlation id to the runtime call, then the op it ran in"))
    c.add(compare_launchers(ours, theirs))


if __name__ == "__main__":
    sys.exit(main(check))
