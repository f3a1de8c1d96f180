"""How fast dlprof exports a run and how much memory it takes, at two sizes, to show the growth.

    .venv/bin/python bench/export.py                                   # 1M and 10M events
    .venv/bin/python bench/export.py --events 100000 1000000 --repeat 1   # a quick look

For each size a synthetic Kineto trace (bench/synthetic_trace.py) is imported once into a run;
trace and run are kept in ``--cache`` between runs of the benchmark (writing and importing 10M
events takes minutes). Each export (``chrome``, ``chrome --merged``, ``perfetto``) then runs in a
fresh child process, interleaved, ``--repeat`` times: wall time, CPU time and the rise of the
child's peak resident set above its baseline after imports (see bench/child_runs.py). The last
table gives, per format, how each figure grew from the smallest size to the largest beside the
growth in events: equal ratios are linear.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from child_runs import child_report, measure, summarise  # bench/ is the script's own directory
from synthetic_trace import write_synthetic

FORMATS = ("chrome", "chrome-merged", "perfetto")
DEFAULT_CACHE = Path.home() / ".cache" / "dlprof-bench"


def _export(form: str, run_dir: Path, out: Path) -> int:
    import dlprof
    from dlprof.exporters.chrome import ChromeExporter
    from dlprof.exporters.perfetto import PerfettoExporter

    run = dlprof.load(run_dir)
    if form == "perfetto":
        paths = PerfettoExporter().export(run, out / "trace.perfetto-trace")
    else:
        paths = ChromeExporter(merged=form == "chrome-merged").export(run, out / "trace.json")
    return sum(path.stat().st_size for path in paths)


def child(form: str, run_dir: Path, scratch: Path) -> None:
    import dlprof.exporters.chrome
    import dlprof.exporters.perfetto  # noqa: F401

    child_report(lambda: _export(form, run_dir, scratch))


def cached_run(cache: Path, events: int) -> Path:
    """The run of a synthetic trace of ``events`` events, made once."""
    from dlprof.importers.trace_file import import_traces

    run_dir = cache / f"run-{events}"
    if (run_dir / "run.json").exists():
        return run_dir
    trace = cache / f"synthetic-{events}.json"
    if not trace.exists():
        began = time.perf_counter()
        write_synthetic(trace.with_suffix(".partial"), events)
        trace.with_suffix(".partial").replace(trace)
        print(f"wrote {trace} in {time.perf_counter() - began:.0f} s", flush=True)
    began = time.perf_counter()
    import_traces([trace], run_dir.with_name(run_dir.name + ".partial"))
    run_dir.with_name(run_dir.name + ".partial").replace(run_dir)
    print(f"imported {trace.name} in {time.perf_counter() - began:.0f} s", flush=True)
    return run_dir


def report(results: dict[int, dict[str, dict[str, Any]]], slices: dict[int, int]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 130)
    table = Table(title="exports")
    for header in ("events", "slices", "format", "wall (s)", "best (s)", "CPU (s)", "slices/s",
                   "peak growth (MiB)", "output (MB)"):
        table.add_column(header, justify="left" if header == "format" else "right")
    for events, by_format in results.items():
        for form, figures in by_format.items():
            if "error" in figures:
                table.add_row(f"{events:,}", "", form, "failed: " + figures["error"], *[""] * 5)
                continue
            table.add_row(f"{events:,}", f"{slices[events]:,}", form, f"{figures['wall_s']:.1f}",
                          f"{figures['best_wall_s']:.1f}", f"{figures['cpu_s']:.1f}",
                          f"{slices[events] / figures['wall_s']:,.0f}",
                          f"{figures['peak_growth_bytes'] / 2**20:,.0f}", f"{figures['produced'] / 1e6:,.0f}")
    console.print(table)
    sizes = sorted(results)
    if len(sizes) < 2:
        return
    small, large = sizes[0], sizes[-1]
    growth = Table(title=f"growth from {small:,} to {large:,} events ({slices[large] / slices[small]:.2f}x slices)")
    for header in ("format", "wall", "CPU", "peak growth"):
        growth.add_column(header, justify="left" if header == "format" else "right")
    for form in FORMATS:
        a, b = results[small].get(form, {}), results[large].get(form, {})
        if "wall_s" in a and "wall_s" in b:
            growth.add_row(form, f"{b['wall_s'] / a['wall_s']:.2f}x", f"{b['cpu_s'] / a['cpu_s']:.2f}x",
                           f"{b['peak_growth_bytes'] / max(a['peak_growth_bytes'], 1):.2f}x")
    console.print(growth)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--events", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--repeat", type=int, default=2, help="fresh children per format and size")
    parser.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where traces and runs are kept")
    parser.add_argument("--json", type=Path, default=None, help="also write every figure here")
    parser.add_argument("--child", nargs=3, metavar=("FORMAT", "RUN", "SCRATCH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        form, run_dir, scratch = args.child
        child(form, Path(run_dir), Path(scratch))
        return 0
    import pyarrow.parquet as pq

    args.cache.mkdir(parents=True, exist_ok=True)
    runs = {events: cached_run(args.cache, events) for events in args.events}
    slices = {events: sum(pq.read_metadata(p).num_rows for p in (run / "slices").rglob("*.parquet"))
              for events, run in runs.items()}
    results: dict[int, dict[str, dict[str, Any]]] = {events: {} for events in runs}
    for events, run_dir in runs.items():
        collected: dict[str, list[dict[str, Any]]] = {form: [] for form in args.formats}
        for round_index in range(args.repeat):
            order = args.formats[round_index % len(args.formats):] + args.formats[:round_index % len(args.formats)]
            for form in order:
                with tempfile.TemporaryDirectory(prefix="dlprof-bench-export-") as scratch:
                    figures = measure([sys.executable, __file__, "--child", form, str(run_dir), scratch])
                collected[form].append(figures)
                print(f"{events:,} {form} round {round_index + 1}: {figures.get('wall_s', figures.get('error'))}",
                      flush=True)
        for form, done in collected.items():
            results[events][form] = summarise(done, 1)
    report(results, slices)
    if args.json:
        args.json.write_text(json.dumps({"results": results, "slices": slices, "argv": sys.argv[1:]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
