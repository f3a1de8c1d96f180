"""How fast dlprof imports Kineto traces and how much memory it takes, beside ``json.load``,
plain orjson and Holistic Trace Analysis (HTA) loading the same files.

    .venv/bin/python bench/import.py                                  # 1M events, every method
    .venv/bin/python bench/import.py --events 100000 --repeat 1       # a quick look
    .venv/bin/python bench/import.py --events 10000000 --repeat 1 --methods import_traces import_stream
    .venv/bin/python bench/import.py --bomb 200 --methods dlprof_import   # a gzip bomb besides
    .venv/bin/python bench/import.py --repeat 3 --no-synthetic --methods dlprof_import hta_process \
        --trace held-out/*.json.gz                                    # real traces, as whole commands

Files: the real traces given with ``--trace`` (default: the H200 GPT-2 trace torch 2.11 wrote,
tests/data/h200, and the largest A100 trace in tests/data/kineto-traces); a synthetic trace of
``--events`` events shaped as a GPU training program's (bench/realistic_trace.py: its mix of
ops, launches, kernels, flows and allocations measured from those two traces; ``--layout``
torch, one line as torch's export_chrome_trace writes, or kineto, a field per line), or with
``--simple`` the older uniform one (bench/synthetic_trace.py), kept in ``--cache`` between runs
as writing 10M events takes minutes; and with ``--bomb N`` a small valid trace gzipped with N MB
of whitespace between its events.

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

and as whole processes, the way a user meets them (start-up included; the CPU time is that of
the process and every child it waited for, ``getrusage(RUSAGE_CHILDREN)``; the peak is the
process's own resident peak, not a growth):

    dlprof_import          the ``dlprof import -o RUN FILE`` command
    hta_process            a Python process that loads the file with HTA's TraceAnalysis

Beside each file, whole-process rounds also import a two-event trace: that peak is the
command's footprint before its first event. import_traces minus import_stream is the
compaction's share of the time and of the peak.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from child_runs import child_report, measure, summarise  # bench/ is the script's own directory
from realistic_trace import LAYOUTS, write_realistic
from synthetic_trace import write_synthetic

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "tests" / "data" / "kineto-traces"
H200_TRACE = ROOT / "tests" / "data" / "h200" / "gpt2-torch-profiler.json.gz"
DEFAULT_HTA = Path(".hta-venv/bin/python")
METHODS = ("json.load", "orjson", "convert_file", "import_stream", "import_traces", "hta",
           "dlprof_import", "hta_process")
PROCESS_METHODS = ("dlprof_import", "hta_process")
_IMPORTED = re.compile(r"imported \d+ file\(s\), (\d+) events")
# HTA's load as a whole process; prints the rows it made.
_HTA_SCRIPT = ("import logging, sys; logging.disable(logging.CRITICAL); "
               "from hta.trace_analysis import TraceAnalysis; "
               "a = TraceAnalysis(trace_dir=sys.argv[1]); print(sum(len(a.t.get_trace(r)) for r in a.t.traces))")
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
        import pyarrow.parquet as pq

        from dlprof.importers.trace_file import import_traces
        from dlprof.store.nesting import NestingReport
        from dlprof.store.writer import RankWriter

        def chunks_only(self: RankWriter) -> tuple[dict[str, int], NestingReport]:
            # The chunks stay as written: their rows, from the footers, are what the import counts.
            rows: dict[str, int] = {}
            for chunk in self.run_dir.rglob("chunk-*.parquet"):
                table = chunk.relative_to(self.run_dir).parts[0]
                rows[table] = rows.get(table, 0) + pq.read_metadata(chunk).num_rows
            return rows, NestingReport()

        RankWriter.compact = chunks_only  # type: ignore[method-assign]
        manifest = import_traces([path], scratch / "run")
        return sum(manifest.counts.values())
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


def measure_process(argv: list[str], scratch: Path) -> dict[str, Any]:
    """Run a whole command: wall and CPU seconds (its children's included), its resident peak.

    The peak is ``wait4``'s ``ru_maxrss`` of the command's process; this benchmark's own
    process stays small (it never loads a trace), so what the child inherits across ``exec``
    is far below any figure. Most of a fresh process's resident set at start is the code of the
    shared libraries it maps (Arrow's, DuckDB's, numpy's), so the private peak (``RssAnon``,
    sampled every 5 ms) is reported beside it.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    with (scratch / "stdout").open("w+") as out, (scratch / "stderr").open("w+") as err:
        process = subprocess.Popen(argv, stdout=out, stderr=err, cwd=scratch)
        private = [0]
        sampler = threading.Thread(target=_sample_private, args=(process.pid, private), daemon=True)
        sampler.start()
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - began
        sampler.join()
        process.returncode = os.waitstatus_to_exitcode(status)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        out.seek(0)
        err.seek(0)
        printed, complaint = out.read(), err.read()
    if process.returncode:
        tail = (complaint or printed).strip().splitlines()[-1:] or ["no output"]
        return {"error": f"exit {process.returncode}: {tail[0]}"}
    found = _IMPORTED.search(printed)
    numbers = [line for line in printed.splitlines() if line.strip().isdigit()]
    produced = int(found.group(1)) if found else int(numbers[-1]) if numbers else 0
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "baseline_kib": 0, "peak_kib": usage.ru_maxrss, "produced": produced,
            "private_peak_kib": private[0]}


def _sample_private(pid: int, peak: list[int]) -> None:
    """The largest ``RssAnon`` of a process until it ends, into ``peak[0]`` (KiB)."""
    status = Path(f"/proc/{pid}/status")
    while True:
        try:
            text = status.read_text()
        except OSError:
            return
        if "\nState:\tZ" in text:
            return
        found = re.search(r"RssAnon:\s+(\d+)", text)
        peak[0] = max(peak[0], int(found.group(1)) if found else 0)
        time.sleep(0.005)


def dlprof_program() -> list[str]:
    """``dlprof`` as a user runs it: the installed script beside this interpreter, else ``-m``."""
    script = Path(sys.executable).with_name("dlprof")
    return [str(script)] if script.exists() and "PYTHONPATH" not in os.environ else [sys.executable, "-m", "dlprof"]


def measure_method(python: str, method: str, path: Path, work: Path) -> dict[str, Any]:
    scratch = Path(tempfile.mkdtemp(dir=work))
    try:
        if method == "dlprof_import":
            return measure_process([*dlprof_program(), "import", "-o", str(scratch / "run"), str(path)], scratch)
        if method == "hta_process":
            (scratch / "hta").mkdir()
            (scratch / "hta" / path.name).symlink_to(path)
            return measure_process([python, "-c", _HTA_SCRIPT, str(scratch / "hta")], scratch)
        return measure([python, __file__, "--child", method, str(path), str(scratch)])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def available(args: argparse.Namespace) -> dict[str, str]:
    """The methods that can run here, each with the interpreter that runs it; why not, printed."""
    methods = {m: sys.executable for m in METHODS if not m.startswith("hta") and m in args.methods}
    if "import_traces" in methods:
        spec = importlib.util.find_spec("dlprof.importers.trace_file")
        if spec is None or "def import_traces(" not in Path(str(spec.origin)).read_text():
            print("import_traces: dlprof.importers.trace_file.import_traces is not there; left out")
            del methods["import_traces"]
    wanted = [m for m in ("hta", "hta_process") if m in args.methods]
    if wanted:
        python = str(Path(args.hta_python).absolute())  # the children run in scratch directories
        check = subprocess.run([python, "-c", "import hta.trace_analysis"], capture_output=True,
                               check=False) if Path(python).exists() else None
        if check is not None and check.returncode == 0:
            methods.update(dict.fromkeys(wanted, python))
        else:
            print(f"hta: cannot import hta.trace_analysis with {python}; left out "
                  "(python3 -m venv .hta-venv && .hta-venv/bin/pip install HolisticTraceAnalysis)")
    return methods


def report(results: dict[str, dict[str, Any]], files: dict[str, dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 150)
    for label, info in files.items():
        console.print(f"\n[bold]{label}[/bold]: {info['path']}, {info['json_bytes'] / 1e6:,.1f} MB of JSON "
                      f"({info['disk_bytes'] / 1e6:,.1f} MB on disk), {info['events']:,} events")
        table = Table()
        for header in ("method", "wall (s)", "best (s)", "CPU (s)", "MB/s", "MB/CPU s", "events/s",
                       "peak (MiB)", "x JSON size", "private (MiB)", "rows out"):
            table.add_column(header, justify="left" if header == "method" else "right")
        for method, figures in results[label].items():
            name = f"{method} (whole process; peak, not growth)" if method in PROCESS_METHODS else method
            if "error" in figures:
                table.add_row(name, "failed: " + figures["error"], *[""] * 9)
                continue
            peak = figures["peak_growth_bytes"]
            table.add_row(name, f"{figures['wall_s']:.2f}", f"{figures['best_wall_s']:.2f}", f"{figures['cpu_s']:.2f}",
                          f"{figures['mb_per_s']:.1f}", f"{figures['mb_per_cpu_s']:.1f}",
                          f"{info['events'] / figures['wall_s']:,.0f}", f"{peak / 2**20:,.0f}",
                          f"{peak / info['json_bytes']:.1f}",
                          f"{figures['private_peak_bytes'] / 2**20:,.0f}" if "private_peak_bytes" in figures else "",
                          f"{figures['produced']:,}")
        console.print(table)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="events in the synthetic trace")
    parser.add_argument("--layout", choices=LAYOUTS, default="torch", help="the synthetic trace's layout")
    parser.add_argument("--simple", action="store_true", help="the older uniform synthetic trace instead")
    parser.add_argument("--no-synthetic", action="store_true", help="leave out the synthetic trace")
    parser.add_argument("--repeat", type=int, default=5, help="fresh children per method and file")
    parser.add_argument("--trace", type=Path, nargs="+", default=None,
                        help="real traces (default: the H200 trace and the largest A100 trace of the tests)")
    parser.add_argument("--hta-python", default=str(DEFAULT_HTA), help="interpreter with HTA installed")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--json", type=Path, default=None, help="also write every figure here")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where synthetic traces are kept")
    parser.add_argument("--bomb", type=int, default=0, metavar="MB",
                        help="also a gzip bomb: a small trace with this many MB of whitespace")
    parser.add_argument("--no-shared", action="store_true", help="leave out the real traces")
    parser.add_argument("--child", nargs=3, metavar=("METHOD", "PATH", "SCRATCH"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def synthetic_trace(args: argparse.Namespace) -> Path:
    """The synthetic trace the arguments ask for, written once into the cache."""
    args.cache.mkdir(parents=True, exist_ok=True)
    shape = "synthetic" if args.simple else f"realistic-{args.layout}"
    path = args.cache / f"{shape}-{args.events}.json"
    if not path.exists():
        began = time.perf_counter()
        partial = path.with_suffix(".partial")
        if args.simple:
            write_synthetic(partial, args.events)
        else:
            write_realistic(partial, args.events, args.layout)
        partial.replace(path)
        print(f"wrote {path} in {time.perf_counter() - began:.1f} s")
    return path


def inputs_of(args: argparse.Namespace) -> dict[str, Path]:
    inputs: dict[str, Path] = {}
    if not args.no_shared:
        for path in args.trace or [H200_TRACE, largest_trace()]:
            inputs[path.name.split(".")[0]] = path.resolve()
    if not args.no_synthetic:
        inputs["synthetic" if args.simple else f"realistic ({args.layout} layout)"] = synthetic_trace(args)
    if args.bomb:
        bomb = args.cache / f"bomb-{args.bomb}.json.gz"
        if not bomb.exists():
            args.cache.mkdir(parents=True, exist_ok=True)
            write_bomb(bomb, args.bomb)
        inputs["bomb"] = bomb
    return inputs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        method, path, scratch = args.child
        child(method, Path(path), Path(scratch))
        return 0
    methods = available(args)
    inputs = inputs_of(args)
    with tempfile.TemporaryDirectory(prefix="dlprof-bench-import-") as work_dir:
        work = Path(work_dir)
        if any(m in PROCESS_METHODS for m in methods):
            # The command's footprint before its first event: a trace of two events.
            inputs = {"two events (start-up)": work / "two-events.json.gz", **inputs}
            write_bomb(inputs["two events (start-up)"], 0)
        files: dict[str, dict[str, Any]] = {}
        for label, path in inputs.items():
            files[label] = {"path": str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path),
                            "json_bytes": json_bytes(path), "disk_bytes": path.stat().st_size}
        results: dict[str, dict[str, Any]] = {label: {} for label in files}
        for label, path in inputs.items():
            chosen = {m: p for m, p in methods.items() if m in PROCESS_METHODS or "start-up" not in label}
            runs: dict[str, list[dict[str, Any]]] = {m: [] for m in chosen}
            for round_index in range(args.repeat):
                # A rotated order each round, so that drift falls on every method alike.
                order = list(chosen)[round_index % len(chosen):] + list(chosen)[:round_index % len(chosen)]
                for method in order:
                    runs[method].append(measure_method(chosen[method], method, path, work))
                    print(f"{label} {method} round {round_index + 1}: "
                          f"{runs[method][-1].get('wall_s', runs[method][-1].get('error'))} "
                          f"(load {os.getloadavg()[0]:.1f})", flush=True)
            for method in chosen:
                results[label][method] = summarise(runs[method], files[label]["json_bytes"])
            produced = [results[label].get(m, {}).get("produced") for m in ("json.load", "orjson")]
            files[label]["events"] = next((p for p in produced if p), None) or (
                args.events if label.startswith(("synthetic", "realistic"))
                else event_count(path) if files[label]["json_bytes"] < 500e6 else 0)
    report(results, files)
    print(f"\nload average at the end: {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps({"files": files, "results": results, "argv": sys.argv[1:],
                                         "cpus": os.cpu_count(), "load": os.getloadavg()}, indent=1))
    return 0


def event_count(path: Path) -> int:
    """Events in a trace, counted with the stdlib parser in a child (this process stays small)."""
    code = ("import gzip, json, sys; p = sys.argv[1]; "
            "f = gzip.open(p) if p.endswith('.gz') else open(p, 'rb'); d = json.loads(f.read()); "
            "print(len(d['traceEvents'] if isinstance(d, dict) else d))")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=False)
    return int(done.stdout.strip() or 0)


if __name__ == "__main__":
    sys.exit(main())
