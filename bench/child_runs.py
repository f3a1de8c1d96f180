"""Measuring one piece of work in a fresh child process: wall time, CPU time, peak memory.

The benchmarks of import and export run each measurement in a child of its own, so that one
never inherits another's heap. The child imports what it needs, notes its resident set, does the
work once and prints one line: the wall and CPU time, and how far its peak resident set rose
above that baseline (C allocations of orjson, Arrow, DuckDB and numpy included, which
``tracemalloc`` cannot see). The peak is Linux's ``VmHWM`` for the process image, not
``getrusage().ru_maxrss``: a child started by ``subprocess`` inherits the parent's peak in
``ru_maxrss`` across ``exec``::

    child_report(lambda: do_the_work())                      # in the child
    figures = measure([sys.executable, script, "--child", ...])   # in the parent
"""

from __future__ import annotations

import gc
import json
import statistics
import subprocess
import time
from collections.abc import Callable
from typing import Any

RESULT = "RESULT "  # a child's report line, apart from whatever the work prints


def memory_kib() -> tuple[int, int]:
    """This process image's resident set now and at its peak, in KiB."""
    found = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                found[key] = int(value.split()[0])
    return found["VmRSS"], found["VmHWM"]


def child_report(work: Callable[[], int]) -> None:
    """Do ``work`` once (it returns how much it produced, as a check) and print the figures."""
    gc.collect()
    baseline, _ = memory_kib()
    began, cpu_began = time.perf_counter(), time.process_time()
    produced = work()
    wall, cpu = time.perf_counter() - began, time.process_time() - cpu_began
    _, peak = memory_kib()
    report = {"wall_s": wall, "cpu_s": cpu, "baseline_kib": baseline, "peak_kib": peak, "produced": produced}
    print(RESULT + json.dumps(report), flush=True)


def measure(argv: list[str], timeout_s: int = 3600) -> dict[str, Any]:
    """Run a child that calls :func:`child_report`; its figures, or ``{"error": ...}``."""
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout_s)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"error": f"exit {done.returncode}: {tail[0]}"}
    result: dict[str, Any] = json.loads(lines[-1][len(RESULT):])
    return result


def summarise(runs: list[dict[str, Any]], size: int) -> dict[str, Any]:
    """Median and best of several runs; throughput over ``size`` bytes."""
    good = [r for r in runs if "error" not in r]
    if not good:
        return {"error": runs[0]["error"]}
    wall = statistics.median(r["wall_s"] for r in good)
    # On a host whose speed drifts, the fastest run is the closest to the work's own cost.
    best = min(r["wall_s"] for r in good)
    cpu = statistics.median(r["cpu_s"] for r in good)
    growth = [(r["peak_kib"] - r["baseline_kib"]) * 1024 for r in good]
    figures = {"wall_s": wall, "best_wall_s": best, "mb_per_s": size / wall / 1e6, "best_mb_per_s": size / best / 1e6,
               "cpu_s": cpu, "mb_per_cpu_s": size / cpu / 1e6, "peak_growth_bytes": statistics.median(growth),
               "peak_growth_max_bytes": max(growth), "produced": good[0]["produced"], "runs": len(good)}
    if all("private_peak_kib" in r for r in good):  # whole processes: their private memory too
        figures["private_peak_bytes"] = statistics.median(r["private_peak_kib"] * 1024 for r in good)
    return figures
