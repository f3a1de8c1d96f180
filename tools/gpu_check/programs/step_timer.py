"""Run a training script as ``__main__`` and write when each optimizer step ended and the most CUDA
memory torch held: the overhead part's per-step times and peak device memory, taken the same way
under plain python, bare torch.profiler and ``dlprof run``.

    python tools/gpu_check/programs/step_timer.py --out steps.json SCRIPT [ARGS...]
    python bench/bare_profiler.py --trace t.json tools/gpu_check/programs/step_timer.py --out steps.json SCRIPT
    python -m dlprof run tools/gpu_check/programs/step_timer.py --out steps.json SCRIPT

Every optimizer's ``step()`` is timed through torch's global post-step hook, on the host, with no
synchronisation added (the program's own overlap of host and device is left as it is): in a
steady state the median time between two steps is the step's period. The file is written
however the script ends; its exit status passes through.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from tools.gpu_check.programs import run_as_main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, required=True, help="where to write the step times (JSON)")
    parser.add_argument("script", type=Path)
    parser.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    steps: list[int] = []
    register_optimizer_step_post_hook(lambda optimizer, a, k: steps.append(time.perf_counter_ns()))
    began = time.perf_counter_ns()
    try:
        return run_as_main(args.script, args.args)
    finally:
        found: dict[str, Any] = {"began_ns": began, "steps_ns": steps, "peak_cuda_bytes": None}
        if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            found["peak_cuda_bytes"] = int(torch.cuda.max_memory_allocated())
        args.out.write_text(json.dumps(found))


if __name__ == "__main__":
    status = main()
    if status:  # only then: under bench/bare_profiler.py a SystemExit would skip the trace's export
        sys.exit(status)
