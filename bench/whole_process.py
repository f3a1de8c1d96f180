"""What a user pays for ``dlprof run``, measured as whole processes against the profiler it wraps.

    .venv/bin/python bench/whole_process.py                         # every workload, 5 rounds
    .venv/bin/python bench/whole_process.py --rounds 3 --workloads nanogpt gpt
    .venv/bin/python bench/whole_process.py --json whole.json

Three ways to run the same unchanged script, each a fresh process, interleaved round by round in
an order rotated every round (the machine drifts; only ratios from one run mean much):

    plain    python SCRIPT ARGS
    bare     python bench/bare_profiler.py SCRIPT ARGS: one torch.profiler around the whole
             program with the options dlprof's torch collector uses, then export_chrome_trace
    dlprof   dlprof run -o DIR SCRIPT ARGS, as a user types it (the top table printed at the end)

For each: the wall time from the start of the process to its exit; the CPU time of the process
tree (user and system, children included); the tail, from the script's last line of output to
the process's exit (for plain python, the interpreter's own teardown); the peak resident memory
of the whole process tree (the process and every child, summed, sampled every 20 ms); the
events recorded (rows dlprof wrote; events in torch's JSON); for the GPT workloads, the median
training step (an iteration of micro-batches, as the script prints it, the first left out); and
for dlprof, its own pauses of the program as the run's manifest sums them (dlprof info). The load
average is noted at each start: the machine is often shared. Reported: medians over rounds, the
ratios dlprof/bare and dlprof/plain per round (median and range), and the tail beyond python's
own teardown per event, then each target (median step at most 1.05 x bare's, whole process at
most 1.05 x bare + export, peak memory at most bare's, no pause inside a step over 50 ms that
memory did not force, pauses at most 2% of the run).

Workloads: the bundled CNN (``examples/torch_cnn.py --steps 300``), a sequence predictor
with about a million events (``bench/workloads/sequence_predictor.py``), a GPT-style model with
gradient accumulation (``bench/workloads/gpt.py``: about a million events a minute) and
nanoGPT's shape (``gpt.py --preset nanogpt``: 2 layers, width 64, block 64, batch 8, 40
micro-batches an iteration), all with one torch thread so that the second core is left for the
profilers' own work, as on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
DLPROF = str(Path(PYTHON).with_name("dlprof"))


@dataclass(frozen=True)
class Workload:
    name: str
    script: Path
    args: tuple[str, ...]
    last_line: str  # a regular expression for the script's own last line of output


WORKLOADS = {
    "cnn": Workload("cnn", ROOT / "examples" / "torch_cnn.py", ("--steps", "300", "--threads", "1"),
                    r"^trained \d+ steps"),
    "seq": Workload("seq", ROOT / "bench" / "workloads" / "sequence_predictor.py",
                    ("--steps", "90", "--threads", "1"), r"^trained \d+ steps"),
    "gpt": Workload("gpt", ROOT / "bench" / "workloads" / "gpt.py", ("--preset", "gpt", "--threads", "1"),
                    r"^trained \d+ iterations"),
    "nanogpt": Workload("nanogpt", ROOT / "bench" / "workloads" / "gpt.py",
                        ("--preset", "nanogpt", "--threads", "1"), r"^trained \d+ iterations"),
}
# The step times the GPT workloads print, as nanoGPT's train.py does.
STEP_LINE = re.compile(r"^iter (\d+): .* time ([\d.]+)ms")
WAYS = ("plain", "bare", "dlprof")


@dataclass
class Measurement:
    way: str
    wall_s: float
    tail_s: float
    peak_rss_mib: float
    events: int
    returncode: int
    cpu_s: float = 0.0
    load: float = 0.0  # the 1-minute load average as it began
    steps_ms: list[float] = field(default_factory=list)  # each iteration's time, as printed
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def median_step_ms(self) -> float:
        """The median step, the first (warm-up) left out; nan without steps."""
        counted = self.steps_ms[1:]
        return statistics.median(counted) if counted else float("nan")


def command(way: str, workload: Workload, scratch: Path) -> list[str]:
    script = [str(workload.script), *workload.args]
    if way == "plain":
        return [PYTHON, *script]
    if way == "bare":
        return [PYTHON, str(ROOT / "bench" / "bare_profiler.py"), "--trace", str(scratch / "bare.json"), *script]
    return [DLPROF, "run", "-o", str(scratch / "run"), *script]


class TreeMemory:
    """Samples the summed resident memory of a process and all its descendants."""

    def __init__(self, pid: int, interval_s: float = 0.02) -> None:
        self.peak = 0
        self._root = psutil.Process(pid)
        self._interval = interval_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.is_set():
            total = 0
            try:
                processes = [self._root, *self._root.children(recursive=True)]
            except psutil.Error:
                return
            for process in processes:
                try:
                    total += process.memory_info().rss
                except psutil.Error:
                    continue
            self.peak = max(self.peak, total)
            self._done.wait(self._interval)

    def stop(self) -> int:
        self._done.set()
        self._thread.join()
        return self.peak


def measure(way: str, workload: Workload, work: Path) -> Measurement:
    scratch = Path(tempfile.mkdtemp(dir=work))
    pattern = re.compile(workload.last_line)
    last_line_at: list[float] = []
    steps_ms: list[float] = []
    load = os.getloadavg()[0]
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    process = subprocess.Popen(command(way, workload, scratch), stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, cwd=scratch)
    memory = TreeMemory(process.pid)
    assert process.stdout is not None
    for raw in process.stdout:
        line = raw.decode(errors="replace")
        if pattern.search(line):
            last_line_at.append(time.perf_counter())
        step = STEP_LINE.match(line)
        if step:
            steps_ms.append(float(step.group(2)))
    returncode = process.wait()
    ended = time.perf_counter()
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak = memory.stop()
    events, extra = _events(way, scratch)
    shutil.rmtree(scratch, ignore_errors=True)
    tail = ended - last_line_at[-1] if last_line_at else float("nan")
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    return Measurement(way, ended - began, tail, peak / 2**20, events, returncode, cpu, load, steps_ms, extra)


def _events(way: str, scratch: Path) -> tuple[int, dict[str, Any]]:
    if way == "bare" and (scratch / "bare.json").is_file():
        import orjson

        trace = orjson.loads((scratch / "bare.json").read_bytes())
        return len(trace.get("traceEvents", [])), {"json_bytes": (scratch / "bare.json").stat().st_size}
    manifest = scratch / "run" / "run.json"
    if way == "dlprof" and manifest.is_file():
        data = json.loads(manifest.read_text())
        counts = data.get("counts", {})
        saving = data.get("saving", {})
        return sum(counts.values()), {"counts": counts, "status": data.get("status"), "saves": saving.get("saves"),
                                      "pauses": saving.get("pauses", {}),
                                      "run_s": (data.get("end_ns", 0) - data.get("start_ns", 0)) / 1e9}
    return 0, {}


def run(workloads: list[str], rounds: int, work: Path) -> dict[str, list[Measurement]]:
    results: dict[str, list[Measurement]] = {f"{w}:{way}": [] for w in workloads for way in WAYS}
    for round_number in range(rounds):
        for name in workloads:
            shift = round_number % len(WAYS)
            for way in WAYS[shift:] + WAYS[:shift]:
                measured = measure(way, WORKLOADS[name], work)
                results[f"{name}:{way}"].append(measured)
                steps = f"  step {measured.median_step_ms:7.1f} ms" if measured.steps_ms else ""
                print(f"round {round_number + 1}/{rounds} {name:7s} {way:6s} wall {measured.wall_s:6.2f} s  "
                      f"cpu {measured.cpu_s:6.2f} s  tail {measured.tail_s:6.2f} s  "
                      f"peak {measured.peak_rss_mib:7.0f} MiB{steps}  events {measured.events:,}  "
                      f"rc {measured.returncode}  load {measured.load:.1f}", flush=True)
    return results


def summarise(results: dict[str, list[Measurement]], workloads: list[str]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for name in workloads:
        by_way = {way: results[f"{name}:{way}"] for way in WAYS}
        medians = {way: {key: statistics.median(getattr(m, key) for m in ms)
                         for key in ("wall_s", "cpu_s", "tail_s", "peak_rss_mib", "events", "median_step_ms", "load")}
                   for way, ms in by_way.items()}
        ratios = {}
        for num, den in (("dlprof", "bare"), ("dlprof", "plain"), ("bare", "plain")):
            ratios[f"{num}/{den}"] = _per_round(by_way[num], by_way[den], "wall_s")
        memory_ratio = [a.peak_rss_mib / b.peak_rss_mib
                        for a, b in zip(by_way["dlprof"], by_way["bare"], strict=True)]
        plain_tail = medians["plain"]["tail_s"]
        per_event = {way: (medians[way]["tail_s"] - plain_tail) / max(medians[way]["events"], 1) * 1e6
                     for way in ("bare", "dlprof")}
        figures: dict[str, Any] = {
            "medians": medians, "wall_ratios": ratios,
            "cpu_ratio_dlprof_over_bare": _per_round(by_way["dlprof"], by_way["bare"], "cpu_s"),
            "peak_rss_ratio_dlprof_over_bare": statistics.median(memory_ratio),
            "tail_beyond_python_us_per_event": per_event,
        }
        if all(m.steps_ms for m in by_way["dlprof"] + by_way["bare"]):
            figures["step_ratio_dlprof_over_bare"] = _per_round(by_way["dlprof"], by_way["bare"], "median_step_ms")
        pauses = [m.extra.get("pauses", {}) for m in by_way["dlprof"]]
        if all(pauses):
            figures["pauses"] = {
                "share_of_run_pct": statistics.median(
                    100 * p["total_ms"] / 1000 / max(m.extra["run_s"], 1e-9) for p, m in zip(pauses, by_way["dlprof"],
                                                                                          strict=True)),
                "longest_unforced_inside_step_ms": max(p.get("longest_unforced_inside_step_ms", 0) for p in pauses),
                "for_memory": statistics.median(p.get("for_memory", 0) for p in pauses),
                "count": statistics.median(p["count"] for p in pauses),
            }
        summary[name] = figures
    return summary


def _per_round(numerators: list[Measurement], denominators: list[Measurement], key: str) -> dict[str, float]:
    """The ratio of one figure, round by round: median and range."""
    per_round = [getattr(a, key) / getattr(b, key) for a, b in zip(numerators, denominators, strict=True)]
    return {"median": statistics.median(per_round), "min": min(per_round), "max": max(per_round)}


def report(summary: dict[str, Any]) -> None:
    for name, figures in summary.items():
        medians = figures["medians"]
        print(f"\n{name}: medians over rounds")
        print(f"  {'way':8s} {'wall s':>8s} {'cpu s':>8s} {'tail s':>8s} {'peak MiB':>9s} {'step ms':>8s} "
              f"{'events':>11s} {'load':>5s}")
        for way in WAYS:
            m = medians[way]
            print(f"  {way:8s} {m['wall_s']:8.2f} {m['cpu_s']:8.2f} {m['tail_s']:8.2f} {m['peak_rss_mib']:9.0f} "
                  f"{m['median_step_ms']:8.1f} {m['events']:11,.0f} {m['load']:5.1f}")
        for label, ratio in figures["wall_ratios"].items():
            print(f"  wall {label:14s} {_ratio(ratio)}")
        print(f"  cpu  dlprof/bare     {_ratio(figures['cpu_ratio_dlprof_over_bare'])}")
        print(f"  peak memory of the tree, dlprof/bare: {figures['peak_rss_ratio_dlprof_over_bare']:.2f}")
        for way, value in figures["tail_beyond_python_us_per_event"].items():
            print(f"  tail beyond python's teardown, {way}: {value:.2f} us per event")
        if "step_ratio_dlprof_over_bare" in figures:
            print(f"  median step, dlprof/bare: {_ratio(figures['step_ratio_dlprof_over_bare'])}  (target <= 1.05)")
        print(f"  whole process, dlprof/bare: {figures['wall_ratios']['dlprof/bare']['median']:.3f}  (target <= 1.05)")
        print(f"  peak memory, dlprof/bare: {figures['peak_rss_ratio_dlprof_over_bare']:.2f}  (target <= 1)")
        if "pauses" in figures:
            p = figures["pauses"]
            print(f"  dlprof's pauses: {p['count']:.0f}, {p['share_of_run_pct']:.1f}% of the run (target <= 2); "
                  f"longest inside a step not for memory {p['longest_unforced_inside_step_ms']:.0f} ms "
                  f"(target <= 50); {p['for_memory']:.0f} for memory")


def _ratio(ratio: dict[str, float]) -> str:
    return f"{ratio['median']:.3f} (rounds {ratio['min']:.3f}-{ratio['max']:.3f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS), default=["nanogpt", "gpt", "cnn", "seq"])
    parser.add_argument("--json", type=Path, default=None, help="also write every measurement here")
    parser.add_argument("--iterations", type=int, default=None,
                        help="iterations of the GPT workloads (default: their presets': 60 and 40)")
    args = parser.parse_args(argv)
    if args.iterations is not None:
        for name in ("gpt", "nanogpt"):
            workload = WORKLOADS[name]
            WORKLOADS[name] = Workload(name, workload.script, (*workload.args, "--iterations", str(args.iterations)),
                                       workload.last_line)
    with tempfile.TemporaryDirectory(prefix="dlprof-whole-") as work:
        results = run(args.workloads, args.rounds, Path(work))
    summary = summarise(results, args.workloads)
    report(summary)
    if args.json is not None:
        args.json.write_text(json.dumps({
            "summary": summary,
            "measurements": {key: [asdict(m) for m in ms] for key, ms in results.items()},
            "cpus": os.cpu_count(),
            "load_at_end": os.getloadavg(),
        }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
