"""How long ``dlprof diff`` takes on the control and test traces of one model (HTA's trace_diff:
75k and 68k slices, A100 and V100), run by hand, not by the test suite.

    .venv/bin/python bench/diff.py               # about 30 s on 2 cores
    .venv/bin/python bench/diff.py --repeat 10 --json diff.json

The traces are imported once into a temporary directory (not timed). Then, each ``--repeat``
times, in order:

    program     the installed ``dlprof diff control test`` as a subprocess, output to a pipe:
                Python start-up, imports, reading both runs, the analysis and the tables
    start-up    ``dlprof --version`` as a subprocess: the part of ``program`` that is not diff
    load        ``dlprof.load`` of both runs and reading their slices, in this process
    analysis    ``choose_basis`` and ``diff`` (ops and kernels, per step) on the loaded runs
    gate        the same with ``regressed`` applied (what --fail-above adds)

Medians and the spread (min-max) are printed; ``--json`` also writes every sample.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import dlprof  # noqa: E402  (after the path: the benchmark runs from a checkout)
from dlprof.analysis.diff import choose_basis, diff, regressed  # noqa: E402
from dlprof.importers.trace_file import import_traces  # noqa: E402

TRACES = ROOT / "tests" / "data" / "kineto-traces" / "trace_diff"


def dlprof_program() -> list[str]:
    script = Path(sys.executable).with_name("dlprof")
    return [str(script)] if script.exists() else [sys.executable, "-m", "dlprof"]


def timed(work: Callable[[], object], repeat: int) -> list[float]:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        samples.append(time.perf_counter() - start)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5, help="samples per measurement")
    parser.add_argument("--json", type=Path, help="also write every sample here")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        runs = []
        for name in ("control", "test"):
            (trace,) = (TRACES / name).glob("*.json.gz")
            import_traces([trace], Path(scratch) / name)
            runs.append(Path(scratch) / name)
        command = [*dlprof_program(), "diff", *map(str, runs)]

        def program() -> None:
            subprocess.run(command, check=True, capture_output=True)

        def start_up() -> None:
            subprocess.run([*dlprof_program(), "--version"], check=True, capture_output=True)

        def load() -> tuple[dlprof.Run, dlprof.Run]:
            loaded = dlprof.load(runs[0]), dlprof.load(runs[1])
            _ = loaded[0].slices, loaded[1].slices
            return loaded

        a, b = load()
        results = {
            "program": timed(program, options.repeat),
            "start-up": timed(start_up, options.repeat),
            "load": timed(load, options.repeat),
            "analysis": timed(lambda: diff(a, b, per=choose_basis(a, b)), options.repeat),
            "gate": timed(lambda: regressed(diff(a, b, per=choose_basis(a, b)), 5.0, 50_000), options.repeat),
        }
        slices = len(a.slices), len(b.slices)
    print(f"dlprof diff on trace_diff control ({slices[0]:,} slices) vs test ({slices[1]:,}), "
          f"{options.repeat} samples each:")
    for what, samples in results.items():
        print(f"  {what:9} median {statistics.median(samples):6.3f} s   (min {min(samples):.3f}, max {max(samples):.3f})")
    if options.json:
        options.json.write_text(json.dumps({"slices": slices, "seconds": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
