"""How fast dlprof imports Kineto traces and how much memory it takes, beside ``json.load``,
plain orjson and Holistic Trace Analysis (HTA) loading the same files.

    .venv/bin/python bench/import.py                                  # 1M events, every method
    .venv/bin/python bench/import.py --events 100000 --repeat 1       # a quick look
    .venv/bin/python bench/import.py --events 10000000 --repeat 1 --methods import_traces import_stream
    .venv/bin/python bench/import.py --bomb 400 --methods import_traces   # a gzip bomb besides

Files: the largest trace in tests/data/kineto-traces (by size on disk), a synthetic trace of
``--events`` events in Kineto's own layout (bench/synthetic_trace.py; kept in ``--cache`` between
runs, as writing 10M events takes minutes), and with ``--bomb N`` a small valid trace gzipped
with N MB of whitespace between its tokens.

Every measurement runs in a fresh child process, so one never inherits another's heap. The child
imports what it needs, notes its resident set, does the work once, and reports the wall time, the
CPU time and how far its peak resident set rose above that baseline: C allocations (orjson,
Arrow, DuckDB, numpy) included, which ``tracemalloc`` cannot see. The peak is Linux's ``VmHWM``
for the process image, not ``getrusage().ru_maxrss``: a child started by ``subprocess`` inherits
the parent's peak in ``ru_maxrss`` across ``exec``. Throughput is in MB (10**6 bytes) of
uncompressed JSON per second of wall time and per CPU second, reading and decompressing the file
included. The ways of loading:

    json.load              stdlib ``json.loads(gzip.open(f).read())``: what HTA and most tools do
    orjson                 ``orjson.loads`` of the whole file: the fastest parse into Python objects
    convert_file           dlprof.importers.kineto.convert_file: the file into Arrow tables in
                           memory (the torch collector's conversion of one cycle)
    import_stream          what ``dlprof import`` does but the compaction at the end: streamed
                           pieces written as chunks
    import_traces          dlprof.importers.trace_file.import_traces: ``dlprof import`` whole
                           (stream, then each rank's compaction: nesting and one part file)
    hta                    HTA's ``TraceAnalysis(trace_dir=...)``, in the interpreter given by
                           ``--hta-python`` (a separate virtual environment), if it imports

import_traces minus import_stream is the compaction's share of the time and of the peak.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from child_runs import child_report, measure, summarise  # bench/ is the script's own directory
from synthetic_trace import write_synthetic

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "tests" / "data" / "kineto-traces"
DEFAULT_HTA = Path(".hta-venv/bin/python")
METHODS = ("json.load", "orjson", "convert_file", "import_stream", "import_traces", "hta")
DEFAULT_CACHE = Path.home() / ".cache" / "dlprof-bench"


# --- the child: one measurement -----------------------------------------------------------


def _load(method: str, path: Path, scratch: Path) -> int:
    """Do the work once; returns how many events or rows it produced, as a sanity check."""
    if method == "json.load":
        with gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb") as handle:
            return len(json.loads(handle.read())["traceEvents"])
    if method == "orjson":
        import orjson

        with gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb") as handle:
            return len(orjson.loads(handle.read())["traceEvents"])
    if method == "convert_file":
        from dlprof.importers.kineto import KinetoOptions, convert_file

        tables = convert_file(path, KinetoOptions(id_base=0))
        return int(tables.slices.num_rows + tables.memory.num_rows + tables.counters.num_rows)
    if method == "import_stream":
        from dlprof.importers.trace_file import import_traces
        from dlprof.store.nesting import NestingReport
        from dlprof.store.writer import RankWriter

        RankWriter.compact = lambda self: ({}, NestingReport())  # type: ignore[method-assign]
        import_traces([path], scratch / "run")
        return sum(1 for _ in (scratch / "run").rglob("chunk-*.parquet"))
    if method == "import_traces":
        from dlprof.importers.trace_file import import_traces

        manifest = import_traces([path], scratch / "run")
        return sum(manifest.counts.values())
    if method == "hta":
        from hta.trace_analysis import TraceAnalysis

        # HTA loads every trace in a directory: give it one holding only this file.
        trace_dir = scratch / "hta"
        trace_dir.mkdir()
        (trace_dir / path.name).symlink_to(path)
        analysis = TraceAnalysis(trace_dir=str(trace_dir))
        return sum(len(analysis.t.get_trace(rank)) for rank in analysis.t.traces)
    raise ValueError(f"unknown method {method!r}")


def _preload(method: str) -> None:
    """Import the method's modules before the baseline, so that they are not counted."""
    if method == "orjson":
        import orjson  # noqa: F401
    elif method == "convert_file":
        import dlprof.importers.kineto
    elif method in ("import_stream", "import_traces"):
        import dlprof.importers.trace_file  # noqa: F401
    elif method == "hta":
        import hta.trace_analysis  # noqa: F401


def child(method: str, path: Path, scratch: Path) -> None:
    _preload(method)
    child_report(lambda: _load(method, path, scratch))


# --- the parent: every measurement, the table ---------------------------------------------


def write_bomb(path: Path, megabytes: int) -> None:
    """Two events, gzipped with ``megabytes`` MB of whitespace around and between them."""
    event = b'{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1.0, "dur": 2.0}'
    blank = b"\n" * (1 << 20)
    with gzip.open(path.with_suffix(".partial"), "wb", compresslevel=9) as out:
        out.write(b'{"schemaVersion": 1, "traceEvents": [\n' + event + b",\n")
        for _ in range(megabytes):
            out.write(blank)
        out.write(event + b"\n]}\n")
    path.with_suffix(".partial").replace(path)


def largest_trace() -> Path:
    return max(TRACES.rglob("*.json.gz"), key=lambda p: p.stat().st_size)


def json_bytes(path: Path) -> int:
    with gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb") as handle:
        return sum(len(block) for block in iter(lambda: handle.read(1 << 24), b""))


def measure_method(python: str, method: str, path: Path, work: Path) -> dict[str, Any]:
    scratch = Path(tempfile.mkdtemp(dir=work))
    try:
        return measure([python, __file__, "--child", method, str(path), str(scratch)])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def available(args: argparse.Namespace) -> dict[str, str]:
    """The methods that can run here, each with the interpreter that runs it; why not, printed."""
    methods = {m: sys.executable for m in METHODS if m != "hta" and m in args.methods}
    if "import_traces" in methods:
        spec = importlib.util.find_spec("dlprof.importers.trace_file")
        if spec is None or "def import_traces(" not in Path(str(spec.origin)).read_text():
            print("import_traces: dlprof.importers.trace_file.import_traces is not there; left out")
            del methods["import_traces"]
    if "hta" in args.methods:
        python = args.hta_python
        check = subprocess.run([python, "-c", "import hta.trace_analysis"], capture_output=True,
                               check=False) if Path(python).exists() else None
        if check is not None and check.returncode == 0:
            methods["hta"] = python
        else:
            print(f"hta: cannot import hta.trace_analysis with {python}; left out "
                  "(python3 -m venv .hta-venv && .hta-venv/bin/pip install HolisticTraceAnalysis)")
    return methods


def report(results: dict[str, dict[str, Any]], files: dict[str, dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 130)
    for label, info in files.items():
        console.print(f"\n[bold]{label}[/bold]: {info['path']}, {info['json_bytes'] / 1e6:,.1f} MB of JSON "
                      f"({info['disk_bytes'] / 1e6:,.1f} MB on disk), {info['events']:,} events")
        table = Table()
        for header in ("method", "wall (s)", "best (s)", "MB/s", "MB/CPU s", "events/s", "peak growth (MiB)",
                       "x JSON size", "rows out"):
            table.add_column(header, justify="left" if header == "method" else "right")
        for method, figures in results[label].items():
            if "error" in figures:
                table.add_row(method, "failed: " + figures["error"], *[""] * 7)
                continue
            growth = figures["peak_growth_bytes"]
            table.add_row(method, f"{figures['wall_s']:.2f}", f"{figures['best_wall_s']:.2f}",
                          f"{figures['mb_per_s']:.1f}", f"{figures['mb_per_cpu_s']:.1f}",
                          f"{info['events'] / figures['wall_s']:,.0f}", f"{growth / 2**20:,.0f}",
                          f"{growth / info['json_bytes']:.1f}", f"{figures['produced']:,}")
        console.print(table)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="events in the synthetic trace")
    parser.add_argument("--repeat", type=int, default=5, help="fresh children per method and file")
    parser.add_argument("--trace", type=Path, default=None, help="real trace (default: the largest shared)")
    parser.add_argument("--hta-python", default=str(DEFAULT_HTA), help="interpreter with HTA installed")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--json", type=Path, default=None, help="also write every figure here")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where synthetic traces are kept")
    parser.add_argument("--bomb", type=int, default=0, metavar="MB",
                        help="also a gzip bomb: a small trace with this many MB of whitespace")
    parser.add_argument("--no-shared", action="store_true", help="leave out the shared recorded trace")
    parser.add_argument("--child", nargs=3, metavar=("METHOD", "PATH", "SCRATCH"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        method, path, scratch = args.child
        child(method, Path(path), Path(scratch))
        return 0
    methods = available(args)
    args.cache.mkdir(parents=True, exist_ok=True)
    synthetic = args.cache / f"synthetic-{args.events}.json"
    if not synthetic.exists():
        began = time.perf_counter()
        write_synthetic(synthetic.with_suffix(".partial"), args.events)
        synthetic.with_suffix(".partial").replace(synthetic)
        print(f"wrote {synthetic} in {time.perf_counter() - began:.1f} s")
    inputs = {} if args.no_shared else {"shared": (args.trace or largest_trace()).resolve()}
    inputs["synthetic"] = synthetic
    if args.bomb:
        bomb = args.cache / f"bomb-{args.bomb}.json.gz"
        if not bomb.exists():
            write_bomb(bomb, args.bomb)
        inputs["bomb"] = bomb
    with tempfile.TemporaryDirectory(prefix="dlprof-bench-import-") as work_dir:
        work = Path(work_dir)
        files: dict[str, dict[str, Any]] = {}
        for label, path in inputs.items():
            files[label] = {"path": str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path),
                            "json_bytes": json_bytes(path), "disk_bytes": path.stat().st_size}
        results: dict[str, dict[str, Any]] = {label: {} for label in files}
        for label, path in inputs.items():
            runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
            for round_index in range(args.repeat):
                # A rotated order each round, so that drift falls on every method alike.
                order = list(methods)[round_index % len(methods):] + list(methods)[:round_index % len(methods)]
                for method in order:
                    runs[method].append(measure_method(methods[method], method, path, work))
                    print(f"{label} {method} round {round_index + 1}: "
                          f"{runs[method][-1].get('wall_s', runs[method][-1].get('error'))}", flush=True)
            for method in methods:
                results[label][method] = summarise(runs[method], files[label]["json_bytes"])
            files[label]["events"] = results[label].get("json.load", {}).get("produced") or (
                args.events if label == "synthetic" else 0)
    report(results, files)
    if args.json:
        args.json.write_text(json.dumps({"files": files, "results": results, "argv": sys.argv[1:],
                                         "cpus": os.cpu_count()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
