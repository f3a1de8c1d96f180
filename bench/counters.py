"""What counting costs: region boundaries with perf_event counters, and the samplers' CPU use.

    .venv/bin/python bench/counters.py                    # about 20 s
    .venv/bin/python bench/counters.py --idle 5 --repeat 7 --number 20000

1. Region boundaries. ``with dlprof.region("r"): pass`` inside a session with 0, 1, 2 and 4
   thread-scope perf_event counters (task-clock, page-faults, context-switches, cpu-migrations);
   timeit, best of ``--repeat`` runs of ``--number`` regions; reported as ns per boundary (one
   region is two boundaries, enter and exit), and the counters' part as the difference from 0.
2. Samplers. Process CPU time (``time.process_time``) over ``--idle`` seconds of sleep inside a
   session with the sampler at ``--interval`` (10 ms) against a session without it, as % of one
   core: host (psutil), and NVML where it is available (skipped with its reason elsewhere).

Targets (reported, not asserted): at most 2 us per region boundary with perf_event; each sampler
under 1 % of one core at 10 ms.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import timeit
from pathlib import Path

import dlprof
from dlprof.collectors.nvml import NvmlCollector
from dlprof.config import ProfileConfig
from dlprof.recording.session import Session
from dlprof.support.perf_event import PerfCounters

COUNTERS = ("task-clock", "page-faults", "context-switches", "cpu-migrations")


def region_cost(n_counters: int, repeat: int, number: int, out: Path) -> float:
    """Best ns per region boundary with the first ``n_counters`` counters."""

    def regions() -> None:
        with dlprof.region("r"):
            pass

    with dlprof.profile(out=out, collectors=(), counters=list(COUNTERS[:n_counters])):
        best = min(timeit.repeat(regions, repeat=repeat, number=number))
    return best / number / 2 * 1e9


def sampler_cpu(collectors: tuple[str, ...], idle_s: float, interval_s: float, out: Path) -> float:
    """Process CPU seconds over ``idle_s`` of sleep in a session with ``collectors``."""
    with Session(ProfileConfig(out=out, collectors=collectors, host_interval_s=interval_s)):
        time.sleep(0.2)  # the sampler's first samples
        before = time.process_time()
        time.sleep(idle_s)
        return time.process_time() - before


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--number", type=int, default=20_000)
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of idle per sampler run")
    parser.add_argument("--interval", type=float, default=0.01, help="sampler interval, seconds")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    figures: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        probe = PerfCounters(list(COUNTERS))
        probe.close()
        if probe.failed:
            print(f"region boundaries: skipped, perf_event cannot count here: {probe.failed}")
        else:
            costs = {n: region_cost(n, args.repeat, args.number, root / f"r{n}") for n in (0, 1, 2, 4)}
            figures["region_ns_per_boundary"] = costs
            print(f"region enter+exit, ns per boundary (best of {args.repeat} x {args.number} regions):")
            for n, ns in costs.items():
                extra = f"  (+{ns - costs[0]:.0f} ns for the counters)" if n else ""
                print(f"  {n} perf_event counters: {ns:7.0f} ns{extra}")
        base = sampler_cpu((), args.idle, args.interval, root / "idle")
        samplers: dict[str, object] = {"none_cpu_s": base}
        print(f"samplers at {args.interval * 1000:.0f} ms, {args.idle:.0f} s idle, % of one core:")
        print(f"  no sampler: {base:.3f} s CPU ({100 * base / args.idle:.2f} %)")
        runs = [("host", True, "")]
        ok, why = NvmlCollector.available()
        runs.append(("nvml", ok, why))
        for name, ok, why in runs:
            if not ok:
                print(f"  {name}: skipped: {why}")
                samplers[name] = f"skipped: {why}"
                continue
            cpu = sampler_cpu((name,), args.idle, args.interval, root / name)
            percent = 100 * (cpu - base) / args.idle
            samplers[name] = {"cpu_s": cpu, "percent_of_core": percent}
            print(f"  {name}: {cpu:.3f} s CPU, {percent:.2f} % of one core over no sampler")
        figures["samplers"] = samplers
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
