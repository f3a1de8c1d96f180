"""What one layer call costs in the layers collector's hooks, against another version of them.

    .venv/bin/python bench/hook_cost.py --baseline 71700bb           # about a minute
    .venv/bin/python bench/hook_cost.py --baseline HEAD~3 --rounds 40 --calls 20000

The forward pre-hook and forward hook of ``dlprof/collectors/layers.py`` as it is now and as it
was at ``--baseline`` (read with ``git show``, loaded as a module of its own beside this one)
are called directly on a small ``nn.Linear``, ``--calls`` pre/post pairs per round, each version
with a fresh collector and slice buffer (fewer calls than throttling takes), without gradients
(so no autograd hook is registered: the hooks' own bodies are what is timed). The rounds
alternate between the versions, the first of each pair rotated, and each is timed with
``time.thread_time_ns`` (this thread's CPU time, not the machine's). Reported: the median, and
the quartiles, of ns per call (one pre and one post hook) for each version, and the median of
the paired differences.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from dlprof.collectors import layers as current
from dlprof.collectors.base import CollectorContext
from dlprof.config import ProfileConfig
from dlprof.schedule import Action
from dlprof.store.sink import Sink
from dlprof.store.slice_buffer import SliceBuffer
from dlprof.store.writer import RankWriter

ROOT = Path(__file__).resolve().parent.parent


def baseline_module(revision: str, into: Path) -> ModuleType:
    """``dlprof/collectors/layers.py`` as it was at ``revision``, loaded as its own module."""
    source = subprocess.run(["git", "show", f"{revision}:dlprof/collectors/layers.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    path = into / "layers_baseline.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("layers_baseline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def round_ns(module: ModuleType, calls: int, run_dir: Path) -> float:
    """Thread CPU ns per pre/post hook pair over ``calls`` calls of one fresh collector."""
    context = CollectorContext(config=ProfileConfig(), sink=Sink(RankWriter(run_dir, 0)),
                               slices=SliceBuffer(0, os.getpid(), 0), run_dir=run_dir,
                               step=lambda: None, action=Action.RECORD)
    collector: Any = module.LayersCollector()
    collector.start(context)
    layer = torch.nn.Linear(8, 8)
    args = (torch.ones(2, 8),)
    output = layer(*args)
    pre, post = collector._pre_forward, collector._post_forward
    try:
        with torch.no_grad():
            start = time.thread_time_ns()
            for _ in range(calls):
                pre(layer, args)
                post(layer, args, output)
            spent = time.thread_time_ns() - start
    finally:
        collector.stop()
    return spent / calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--baseline", required=True, help="the git revision to compare with")
    parser.add_argument("--rounds", type=int, default=30, help="rounds of each version (default 30)")
    parser.add_argument("--calls", type=int, default=20_000, help="pre/post pairs per round (default 20000)")
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        versions = {"baseline": baseline_module(options.baseline, Path(scratch)), "current": current}
        times: dict[str, list[float]] = {name: [] for name in versions}
        round_ns(current, options.calls, Path(scratch) / "warm")  # imports, caches
        for number in range(options.rounds):
            order = list(versions) if number % 2 == 0 else list(reversed(versions))
            for name in order:
                times[name].append(round_ns(versions[name], options.calls, Path(scratch) / f"{name}-{number}"))
    print(f"layers hooks, ns per layer call (pre + post), {options.rounds} rounds of {options.calls} calls, "
          f"thread CPU time; load {os.getloadavg()[0]:.2f}")
    for name, values in times.items():
        q1, median, q3 = statistics.quantiles(values, n=4)
        print(f"  {name:<9} median {median:7.0f}   quartiles {q1:7.0f} .. {q3:7.0f}")
    differences = [now - before for now, before in zip(times["current"], times["baseline"], strict=True)]
    print(f"  current - baseline, median of paired rounds: {statistics.median(differences):+.0f} ns")
    return 0


if __name__ == "__main__":
    sys.exit(main())
