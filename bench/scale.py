"""dlprof's analyses at 1 and 10 million events, as whole processes, beside DuckDB's bare query.

    .venv/bin/python bench/scale.py                          # 1M and 10M events, 3 rounds
    .venv/bin/python bench/scale.py --events 1000000 --rounds 1 --commands top,gpu
    .venv/bin/python bench/scale.py --events 250000 --events 10000000 --commands top,steps,gpu
    .venv/bin/python bench/scale.py --json scale.json

Inputs: synthetic traces shaped as a GPU training program's (``bench/realistic_trace.py``: the
mix of ops, launches, kernels, flows and allocations of the H200 and A100 traces in the tests'
data, nested as torch nests them, a step every 50 linear layers), or with ``--simple`` the
older uniform ones (``bench/synthetic_trace.py``), imported with ``dlprof import``. Importing
10M events takes minutes and GBs, so the imported runs are kept in ``--cache`` (default
``~/.cache/dlprof-bench/scale``) and made again only when the trace generator or the store's
schema changes.

Every measurement is a fresh process, as a user meets it: start-up, the work, printing, exit.
The configurations run interleaved, round after round, so a machine that drifts affects them
alike. The peer is DuckDB's bare query in its own Python process::

    SELECT name, sum(dur_ns) FROM read_parquet('RUN/slices/*/*.parquet') GROUP BY 1 ORDER BY 2 DESC LIMIT 10

Peak memory is that of the whole process tree (Spark's JVM included): the largest sum of the
tree's resident sets, sampled every 5 ms, or the process's own peak (``wait4``) if larger; CPU
time is the process's and its children's (``getrusage(RUSAGE_CHILDREN)``). Figures: the median
wall and CPU time of the rounds, their ratios to the peer's, the peak, the input's Parquet size
and each command's memory target (2 x Parquet + 300 MB; 300 MB for top), the machine's load,
and the growth from the smallest to the largest run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from realistic_trace import write_realistic  # noqa: E402
from synthetic_trace import write_synthetic  # noqa: E402

from dlprof.store.version import SCHEMA_VERSION  # noqa: E402

PEER = "duckdb"
PEER_QUERY = ("SELECT name, sum(dur_ns) FROM read_parquet('{run}/slices/*/*.parquet', hive_partitioning = true) "
              "GROUP BY 1 ORDER BY 2 DESC LIMIT 10")
# The commands measured, as dlprof arguments after the run directory is filled in.
COMMANDS: dict[str, list[str]] = {
    "top": ["top", "{run}"],
    "steps": ["steps", "{run}"],
    "gpu": ["gpu", "{run}"],
    "tune": ["tune", "{run}"],
    # The op view: op costs (CPU time less nested ops, device time launched, bytes), the same
    # queries as `dlprof tree` (the synthetic trace has no scopes or layers to hang a tree on).
    "opview": ["top", "{run}", "--group-by", "type"],
    "tree": ["tree", "{run}", "--view", "scope"],
    "ranks": ["ranks", "{run}"],
    "diff": ["diff", "{run}", "{run}"],
    "report": ["report", "{run}", "-o", "{out}/report.html"],
    "pprof": ["pprof", "{run}", "-n", "10"],
}
MB = 1_000_000
BUDGET_MB = 300  # the fixed part of every memory target


@dataclass
class Figure:
    """One configuration at one size: its rounds summed up."""

    events: int
    command: str
    seconds: float  # median wall time over rounds
    peak_mb: float  # the largest peak over rounds
    parquet_mb: float
    target_mb: float
    exit_code: int
    vs_peer: float = 0.0  # median time / the peer's median time
    cpu_seconds: float = 0.0  # median CPU time over rounds, children included
    cpu_vs_peer: float = 0.0  # median CPU time / the peer's
    load: float = 0.0  # the machine's load average (1 minute) over the rounds, median


def cache_dir(argument: Path | None) -> Path:
    base = argument or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dlprof-bench" / "scale"
    base.mkdir(parents=True, exist_ok=True)
    return base


def _stamp(simple: bool) -> str:
    """What an imported run depends on: the generator's source and the store's schema."""
    source = (BENCH / ("synthetic_trace.py" if simple else "realistic_trace.py")).read_bytes()
    return f"{hashlib.sha256(source).hexdigest()[:16]}-schema{SCHEMA_VERSION}"


def imported_run(cache: Path, events: int, simple: bool = False) -> Path:
    """The run of ``events`` synthetic events, imported once and kept."""
    run = cache / (f"run-{events}" if simple else f"realistic-run-{events}")
    stamp = run / "bench-stamp.txt"
    if stamp.is_file() and stamp.read_text() == _stamp(simple):
        return run
    shutil.rmtree(run, ignore_errors=True)
    with tempfile.TemporaryDirectory(dir=cache) as scratch:
        trace = Path(scratch) / "trace.json"
        print(f"writing a {events:,}-event trace and importing it (once; kept in {cache})", file=sys.stderr)
        (write_synthetic if simple else write_realistic)(trace, events)
        subprocess.run([*dlprof_program(), "import", "-o", str(run), str(trace)], check=True,
                       stdout=subprocess.DEVNULL)
    stamp.write_text(_stamp(simple))
    return run


def dlprof_program() -> list[str]:
    script = Path(sys.executable).with_name("dlprof")
    return [str(script)] if script.exists() else [sys.executable, "-m", "dlprof"]


def parquet_mb(run: Path) -> float:
    return sum(p.stat().st_size for p in run.rglob("*.parquet")) / MB


def measure(command: list[str]) -> tuple[float, float, int, float]:
    """Run a command to its end: wall seconds, peak resident MB of its process tree, exit code,
    CPU seconds (its children's included)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tree_peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal tree_peak
        try:
            root = psutil.Process(process.pid)
        except psutil.NoSuchProcess:
            return
        while not done.is_set():
            total = 0
            try:
                for member in [root, *root.children(recursive=True)]:
                    total += member.memory_info().rss
            except psutil.Error:
                pass
            tree_peak = max(tree_peak, total)
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    done.set()
    sampler.join()
    process.returncode = os.waitstatus_to_exitcode(status)
    own_peak = usage.ru_maxrss * 1024  # kilobytes on Linux
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return seconds, max(tree_peak, own_peak) / MB, process.returncode, cpu


def peer_command(run: Path) -> list[str]:
    query = PEER_QUERY.format(run=run)
    return [sys.executable, "-c", f"import duckdb; print(duckdb.sql({query!r}).fetchall())"]


def bench(sizes: list[int], commands: list[str], rounds: int, cache: Path, engine: str,
          simple: bool = False) -> list[Figure]:
    figures: list[Figure] = []
    environment = {**os.environ, "DLPROF_ENGINE": engine}
    os.environ.update(environment)
    for events in sizes:
        run = imported_run(cache, events, simple)
        size = parquet_mb(run)
        timings: dict[str, list[float]] = {name: [] for name in [PEER, *commands]}
        cpu: dict[str, list[float]] = {name: [] for name in timings}
        loads: list[float] = []
        peaks: dict[str, float] = dict.fromkeys(timings, 0.0)
        codes: dict[str, int] = dict.fromkeys(timings, 0)
        with tempfile.TemporaryDirectory() as out:
            for round_number in range(rounds):
                for name in [PEER, *commands]:
                    argv = peer_command(run) if name == PEER else [
                        *dlprof_program(), *(a.format(run=run, out=out) for a in COMMANDS[name])]
                    seconds, peak, code, cpu_seconds = measure(argv)
                    loads.append(os.getloadavg()[0])
                    timings[name].append(seconds)
                    cpu[name].append(cpu_seconds)
                    peaks[name] = max(peaks[name], peak)
                    codes[name] = code or codes[name]
                    print(f"{events:>10,} events  round {round_number + 1}/{rounds}  {name:<7} {seconds:7.2f} s "
                          f"{cpu_seconds:6.2f} s CPU {peak:8.0f} MB  exit {code}  load {loads[-1]:.1f}",
                          file=sys.stderr)
        peer, peer_cpu = statistics.median(timings[PEER]), statistics.median(cpu[PEER])
        for name in [PEER, *commands]:
            target = BUDGET_MB if name == "top" else 2 * size + BUDGET_MB
            median, median_cpu = statistics.median(timings[name]), statistics.median(cpu[name])
            figures.append(Figure(events, name, median, peaks[name], size, target, codes[name], median / peer,
                                  median_cpu, median_cpu / peer_cpu, statistics.median(loads)))
    return figures


def report(figures: list[Figure]) -> str:
    lines = ["| events | command | wall s (median) | / DuckDB query | CPU s (median) | / DuckDB query | "
             "peak MB (tree) | target MB | Parquet MB | load | exit |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for f in figures:
        lines.append(f"| {f.events:,} | {f.command} | {f.seconds:.2f} | {f.vs_peer:.2f} | {f.cpu_seconds:.2f} | "
                     f"{f.cpu_vs_peer:.2f} | {f.peak_mb:.0f} | {f.target_mb:.0f} | {f.parquet_mb:.1f} | "
                     f"{f.load:.1f} | {f.exit_code} |")
    sizes = sorted({f.events for f in figures})
    if len(sizes) > 1:
        small, large = sizes[0], sizes[-1]
        lines += ["", f"| command | time x ({small:,} to {large:,} events) | peak memory x |", "|---|---:|---:|"]
        by = {(f.events, f.command): f for f in figures}
        for command in dict.fromkeys(f.command for f in figures):
            a, b = by.get((small, command)), by.get((large, command))
            if a and b:
                lines.append(f"| {command} | {b.seconds / a.seconds:.1f} | {b.peak_mb / a.peak_mb:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, action="append", help="events per run (repeatable); "
                        "default 1,000,000 and 10,000,000")
    parser.add_argument("--commands", default=",".join(COMMANDS), help="comma-separated: " + ", ".join(COMMANDS))
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per size")
    parser.add_argument("--engine", default="duckdb", choices=["duckdb", "spark"], help="dlprof's engine")
    parser.add_argument("--cache", type=Path, default=None, help="where imported runs are kept")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--simple", action="store_true", help="the older uniform synthetic traces")
    args = parser.parse_args(argv)
    commands = [c for c in args.commands.split(",") if c]
    unknown = sorted(set(commands) - set(COMMANDS))
    if unknown:
        parser.error(f"unknown commands: {', '.join(unknown)}")
    sizes = args.events or [1_000_000, 10_000_000]
    figures = bench(sizes, commands, args.rounds, cache_dir(args.cache), args.engine, args.simple)
    print(report(figures))
    if args.json:
        args.json.write_text(json.dumps([asdict(f) for f in figures], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
