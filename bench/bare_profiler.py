"""Run a script under bare torch.profiler, as a user of the PyTorch profiler would: one profile
around the whole program with the options dlprof's torch collector uses, then
``export_chrome_trace``. The peer that ``bench/whole_process.py`` compares ``dlprof run`` with.

    python bench/bare_profiler.py --trace out.json script.py [args...]
"""

from __future__ import annotations

import argparse
import runpy
import sys

import torch
from torch.profiler import ProfilerActivity, profile


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", required=True, help="the Chrome trace to write")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    sys.argv = [args.script, *args.args]
    with profile(activities=activities, record_shapes=True, profile_memory=True, with_flops=True) as prof:
        runpy.run_path(args.script, run_name="__main__")
    prof.export_chrome_trace(args.trace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
