"""What dlprof costs on the bundled CNN: step time against no profiler and bare torch.profiler,
the cost of a cycle's save, post-processing time per event, and bytes per event on disk.

    .venv/bin/python bench/overhead.py                      # defaults: about 5 minutes on 2 cores
    .venv/bin/python bench/overhead.py --rounds 5 --cycle-rounds 1 --post-steps 100  # a quick look
    .venv/bin/python bench/overhead.py --json overhead.json

1. Step time. The configurations below run in blocks of ``--steps`` training steps, one block of
   each per round, in an order rotated every round so that drift (the host, other processes)
   falls on all of them alike, all in this one process. Every block starts from the same
   weights. The first ``--skip`` steps of a block (the profiler starting) are left out. Ratios
   are of medians, with a 95% interval from resampling whole rounds (paired across
   configurations); ratios of means are shown too.

       A   unprofiled
       B   torch.profiler with the torch collector's options, on_trace_ready doing nothing
       Bx  the same, on_trace_ready exporting the Chrome trace (what the torch collector does)
       C   dlprof, default collectors (torch, layers, host)
       D   dlprof, collectors=("torch",)
       E   dlprof, collectors=("layers",)

2. Cycle saves. Blocks of 30 steps never reach the end of a profiling cycle (every 100 steps
   here, both profilers given that schedule: dlprof's own policy saves by memory and time),
   where torch.profiler stops, hands over its trace and restarts, and dlprof exports it and
   starts converting it in a child process. Blocks of 120 steps of A, B, Bx, C, D measure that
   step, and the 20 steps after it.

3. Post-processing. The time from the profiled program's last step to dlprof's return from
   ``stop()`` (or, under ``dlprof run``, from the script's last line of output to the process's
   exit), per event written (the sum of ``counts`` in ``run.json``), against torch's own
   ``prof.events()`` / ``key_averages()`` on the same steps; and Parquet bytes per event
   against torch's Chrome JSON export of the same steps.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import importlib.util
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import orjson
import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from torch import nn
from torch.profiler import ProfilerAction, ProfilerActivity, profile

import dlprof
from dlprof.collectors.torch import hide_kineto_chatter
from dlprof.schedule import Schedule

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "torch_cnn.py"
# The cycle both profilers save at in the blocks of steps (torch.profiler's schedule, dlprof's
# --schedule): dlprof's own policy saves by memory and time, which these blocks never reach.
FLUSH_STEPS = 100
# Lines Kineto prints on every start and stop; anything else written to stderr is shown.

StepHook = Callable[[], None] | None


# --- the workload -------------------------------------------------------------------------


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("torch_cnn_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Workload:
    """The example's training step; every block starts again from the same weights."""

    def __init__(self, example: ModuleType, batch_size: int) -> None:
        torch.manual_seed(0)
        self.model: nn.Module = example.CNN()
        self._initial = copy.deepcopy(self.model.state_dict())
        self.loss_fn = nn.CrossEntropyLoss()
        self.data = example.synthetic_batches(16, batch_size)
        self.reset()

    def reset(self) -> None:
        self.model.load_state_dict(self._initial)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)

    def step(self, index: int) -> None:
        # The loop body of examples/torch_cnn.py, region included.
        with dlprof.region("data"):
            inputs, labels = self.data[index % len(self.data)]
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.model(inputs), labels)
        loss.backward()
        self.optimizer.step()

    def timed_steps(self, steps: int, after_step: StepHook) -> np.ndarray:
        """Nanoseconds per step, the profiler's ``step()`` included."""
        times = np.empty(steps, dtype=np.int64)
        last = time.perf_counter_ns()
        for index in range(steps):
            self.step(index)
            if after_step is not None:
                after_step()
            now = time.perf_counter_ns()
            times[index] = now - last
            last = now
        return times


# --- the configurations -------------------------------------------------------------------


def torch_options() -> dict[str, Any]:
    """What dlprof's torch collector passes to torch.profiler.profile (defaults)."""
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    return {"activities": activities, "record_shapes": True, "profile_memory": True,
            "with_flops": True, "with_stack": False}


def every_step(step: int) -> ProfilerAction:
    """Record every step; save every FLUSH_STEPS steps, as dlprof's blocks do."""
    if step % FLUSH_STEPS == FLUSH_STEPS - 1:
        return ProfilerAction.RECORD_AND_SAVE
    return ProfilerAction.RECORD


@contextlib.contextmanager
def unprofiled(scratch: Path) -> Iterator[StepHook]:
    yield None


def bare_torch(export: bool) -> Callable[[Path], contextlib.AbstractContextManager[StepHook]]:
    @contextlib.contextmanager
    def opened(scratch: Path) -> Iterator[StepHook]:
        def ready(prof: Any) -> None:
            if export:
                path = scratch / f"torch-{time.perf_counter_ns()}.json"
                prof.export_chrome_trace(str(path))
                path.unlink()

        with profile(schedule=every_step, on_trace_ready=ready, **torch_options()) as prof:
            yield prof.step

    return opened


def with_dlprof(collectors: tuple[str, ...] | None) -> Callable[[Path], contextlib.AbstractContextManager[StepHook]]:
    """A dlprof session around the blocks of steps (collectors None: the default set)."""

    @contextlib.contextmanager
    def opened(scratch: Path) -> Iterator[StepHook]:
        out = scratch / f"run-{time.perf_counter_ns()}"
        options: dict[str, Any] = {} if collectors is None else {"collectors": collectors}
        options["schedule"] = Schedule.every_step(FLUSH_STEPS)
        try:
            with dlprof.profile(out=out, **options) as session:
                yield session.step
        finally:
            shutil.rmtree(out, ignore_errors=True)

    return opened


@dataclass(frozen=True)
class Config:
    key: str
    label: str
    open: Callable[[Path], contextlib.AbstractContextManager[StepHook]]


CONFIGS = (
    Config("A", "unprofiled", unprofiled),
    Config("B", "torch.profiler, on_trace_ready no-op", bare_torch(export=False)),
    Config("Bx", "torch.profiler, exports Chrome trace", bare_torch(export=True)),
    Config("C", "dlprof default collectors", with_dlprof(None)),
    Config("D", "dlprof torch", with_dlprof(("torch",))),
    Config("E", "dlprof layers", with_dlprof(("layers",))),
)
# (numerator, denominator, target ratio of medians or None)
RATIOS = (("C", "B", 1.05), ("D", "B", 1.05), ("C", "Bx", 1.05), ("D", "Bx", 1.05),
          ("E", "A", 1.02), ("B", "A", None), ("Bx", "A", None), ("C", "A", None))
# Cycle-save blocks: one cycle, then this many steps while its conversion runs.
CYCLE_TAIL = 20
CYCLE_CONFIGS = ("A", "B", "Bx", "C", "D")


@dataclass
class Block:
    step_ns: np.ndarray
    enter_ns: int  # starting the profiler
    exit_ns: int  # stopping it, and for dlprof writing the run


def run_block(config: Config, work: Workload, steps: int, scratch: Path) -> Block:
    work.reset()
    gc.collect()
    started = time.perf_counter_ns()
    with config.open(scratch) as after_step:
        entered = time.perf_counter_ns()
        times = work.timed_steps(steps, after_step)
        done = time.perf_counter_ns()
    exited = time.perf_counter_ns()
    return Block(times, entered - started, exited - done)


# --- statistics ---------------------------------------------------------------------------


def step_stats(blocks: list[Block], skip: int) -> dict[str, Any]:
    kept = np.stack([b.step_ns[skip:] for b in blocks]) / 1e6  # rounds x steps, ms
    q25, median, q75 = np.percentile(kept, [25, 50, 75])
    return {"median_ms": median, "q25_ms": q25, "q75_ms": q75, "mean_ms": kept.mean(),
            "steps": kept.size, "enter_ms": float(np.median([b.enter_ns for b in blocks]) / 1e6),
            "exit_ms": float(np.median([b.exit_ns for b in blocks]) / 1e6)}


def ratio_stats(num: list[Block], den: list[Block], skip: int, resamples: int) -> dict[str, Any]:
    """Ratio of medians (and of means) with a 95% interval from resampling rounds, paired."""
    a = np.stack([b.step_ns[skip:] for b in num]).astype(np.float64)
    b = np.stack([b.step_ns[skip:] for b in den]).astype(np.float64)
    rng = np.random.default_rng(0)
    picks = rng.integers(0, len(a), size=(resamples, len(a)))
    boot_a = np.median(a[picks].reshape(resamples, -1), axis=1)
    boot_b = np.median(b[picks].reshape(resamples, -1), axis=1)
    low, high = np.percentile(boot_a / boot_b, [2.5, 97.5])
    means = a[picks].reshape(resamples, -1).mean(axis=1) / b[picks].reshape(resamples, -1).mean(axis=1)
    mean_low, mean_high = np.percentile(means, [2.5, 97.5])
    # Each round's two blocks ran seconds apart: their ratio shrugs off slow drift of the host.
    per_round = np.median(a, axis=1) / np.median(b, axis=1)
    boot_rounds = np.median(per_round[picks], axis=1)
    round_low, round_high = np.percentile(boot_rounds, [2.5, 97.5])
    return {"median_ratio": float(np.median(a) / np.median(b)), "ci95": [low, high],
            "mean_ratio": float(a.mean() / b.mean()), "mean_ci95": [mean_low, mean_high],
            "per_round_ratio": float(np.median(per_round)), "per_round_ci95": [round_low, round_high]}


def cycle_stats(blocks: list[Block], skip: int) -> dict[str, Any]:
    """The save step (the last of the first cycle) and the steps after it, against the others."""
    save = FLUSH_STEPS - 1
    recording = np.concatenate([b.step_ns[skip:save] for b in blocks]) / 1e6
    after = np.concatenate([b.step_ns[save + 1:] for b in blocks]) / 1e6
    save_ms = float(np.median([b.step_ns[save] for b in blocks]) / 1e6)
    median = float(np.median(recording))
    return {"recording_median_ms": median, "save_step_ms": save_ms,
            "save_extra_ms": save_ms - median, "after_mean_ms": float(after.mean()),
            "after_median_ms": float(np.median(after)), "after_ratio": float(after.mean()) / median}


def interleave(configs: list[Config], work: Workload, steps: int, rounds: int, scratch: Path,
               console: Console, began: float) -> dict[str, list[Block]]:
    """``rounds`` rounds of one block of each configuration, the order rotated each round."""
    blocks: dict[str, list[Block]] = {c.key: [] for c in configs}
    for round_number in range(rounds):
        shift = round_number % len(configs)
        with hide_kineto_chatter():
            for config in configs[shift:] + configs[:shift]:
                blocks[config.key].append(run_block(config, work, steps, scratch))
        medians = "  ".join(f"{k} {np.median(b[-1].step_ns) / 1e6:.2f}" for k, b in blocks.items())
        console.print(f"  round {round_number + 1}/{rounds}  median ms: {medians}  "
                      f"[{time.perf_counter() - began:.0f}s]")
    return blocks


# --- post-processing and size -------------------------------------------------------------


def run_size(run_dir: Path) -> tuple[int, dict[str, dict[str, int]]]:
    """Events (sum of the manifest's counts) and Parquet bytes and rows per table."""
    manifest = json.loads((run_dir / "run.json").read_text())
    counts: dict[str, int] = manifest["counts"]
    tables = {
        name: {"rows": rows, "bytes": sum(p.stat().st_size for p in (run_dir / name).rglob("*.parquet"))}
        for name, rows in counts.items()
    }
    return sum(counts.values()), tables


def dlprof_post(work: Workload, steps: int, scratch: Path, single_cycle: bool) -> dict[str, Any]:
    """Profile ``steps`` steps with dlprof.profile; time ``stop()`` (the end of the program)."""
    out = scratch / f"post-{'single' if single_cycle else 'default'}"
    schedule = Schedule.every_step(steps + 1) if single_cycle else None
    work.reset()
    gc.collect()
    children_before = children_cpu_s()
    session = dlprof.profile(out=out, schedule=schedule).start()
    for index in range(steps):
        work.step(index)
        session.step()
    stopping = time.perf_counter_ns()
    session.stop()
    stop_ns = time.perf_counter_ns() - stopping
    # CPU time of the conversions run in child processes while the program ran.
    children_ns = round((children_cpu_s() - children_before) * 1e9)
    events, tables = run_size(out)
    parquet = sum(t["bytes"] for t in tables.values())
    shutil.rmtree(out)
    return {"events": events, "stop_ms": stop_ns / 1e6, "us_per_event": stop_ns / 1e3 / events,
            "children_cpu_ms": children_ns / 1e6,
            "total_us_per_event": (stop_ns + children_ns) / 1e3 / events,
            "parquet_bytes": parquet, "bytes_per_event": parquet / events, "tables": tables}


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def last_line_to_exit(command: list[str], log: Path) -> int:
    """Run ``command``; nanoseconds from the example's last line of output to the exit."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as errors:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True, env=env)
        assert child.stdout is not None
        last_line_ns = 0
        for line in child.stdout:
            if line.startswith("trained"):  # printed by the example's last statement
                last_line_ns = time.perf_counter_ns()
        code = child.wait()
        exit_ns = time.perf_counter_ns()
    if code != 0 or not last_line_ns:
        tail = "\n".join(log.read_text().splitlines()[-5:])
        raise RuntimeError(f"{' '.join(command)} failed ({code}):\n{tail}")
    return exit_ns - last_line_ns


def cli_post(steps: int, threads: int, scratch: Path) -> dict[str, Any]:
    """``dlprof run`` on the example, and the example alone: last line of output to exit."""
    out = scratch / "post-cli"
    script = Path(sys.executable).with_name("dlprof")
    dlprof_cli = [str(script)] if script.exists() else [sys.executable, "-m", "dlprof"]
    example = [str(EXAMPLE), "--steps", str(steps), "--threads", str(threads)]
    try:
        plain_ns = last_line_to_exit([sys.executable, *example], scratch / "plain-stderr.txt")
        cli_ns = last_line_to_exit([*dlprof_cli, "run", "-o", str(out), "--top", "0", *example],
                                   scratch / "cli-stderr.txt")
    except RuntimeError as error:
        return {"error": str(error)}
    events, tables = run_size(out)
    shutil.rmtree(out)
    extra = cli_ns - plain_ns
    return {"events": events, "exit_ms": cli_ns / 1e6, "plain_exit_ms": plain_ns / 1e6,
            "us_per_event": cli_ns / 1e3 / events, "extra_us_per_event": extra / 1e3 / events,
            "parquet_bytes": sum(t["bytes"] for t in tables.values())}


def torch_post(work: Workload, steps: int, scratch: Path) -> dict[str, Any]:
    """The same steps under bare torch.profiler: stop, events(), key_averages(), Chrome export."""
    work.reset()
    gc.collect()
    prof: Any = profile(**torch_options())
    prof.start()
    for index in range(steps):
        work.step(index)
        prof.step()
    t0 = time.perf_counter_ns()
    prof.stop()
    t1 = time.perf_counter_ns()
    events = len(prof.events())  # the first call parses Kineto's results into FunctionEvents
    t2 = time.perf_counter_ns()
    prof.key_averages()
    t3 = time.perf_counter_ns()
    trace = scratch / "torch-trace.json"
    prof.export_chrome_trace(str(trace))
    t4 = time.perf_counter_ns()
    size = trace.stat().st_size
    json_events = len(orjson.loads(trace.read_bytes())["traceEvents"])
    trace.unlink()
    return {"events": events, "stop_ms": (t1 - t0) / 1e6, "events_ms": (t2 - t1) / 1e6,
            "key_averages_ms": (t3 - t2) / 1e6, "export_ms": (t4 - t3) / 1e6,
            "json_events": json_events, "json_bytes": size,
            "us_per_event_stop_events": (t2 - t0) / 1e3 / events,
            "us_per_event_key_averages": (t3 - t2) / 1e3 / events,
            "us_per_event_export": (t4 - t3) / 1e3 / json_events,
            "bytes_per_event": size / json_events}


# --- report -------------------------------------------------------------------------------


def verdict(value: float, target: float | None) -> str:
    if target is None:
        return ""
    return f"[green]meets ≤{target:g}[/]" if value <= target else f"[red]misses ≤{target:g}[/]"


def report(console: Console, results: dict[str, Any]) -> None:
    args = results["args"]
    if "steps" in results:
        steps = Table(title=f"Step time, ms ({args['rounds']} rounds x {args['steps']} steps per "
                            f"block, first {args['skip']} steps of each block excluded)")
        for column in ("config", "", "median", "IQR", "mean", "steps", "start ms", "stop ms"):
            steps.add_column(column, justify="left" if column in ("config", "") else "right")
        for key, s in results["steps"].items():
            steps.add_row(key, results["labels"][key], f"{s['median_ms']:.2f}",
                          f"{s['q25_ms']:.2f}-{s['q75_ms']:.2f}", f"{s['mean_ms']:.2f}",
                          str(s["steps"]), f"{s['enter_ms']:.1f}", f"{s['exit_ms']:.1f}")
        console.print(steps)
        ratios = Table(title="Ratios of step times (95% intervals: rounds resampled, paired)")
        for column in ("ratio", "of medians", "95%", "target", "of means", "95% ",
                       "median of per-round ratios", "95%  "):
            ratios.add_column(column, justify="left" if column == "ratio" else "right")
        for name, r in results["ratios"].items():
            ratios.add_row(name, f"{r['median_ratio']:.3f}", f"{r['ci95'][0]:.3f}-{r['ci95'][1]:.3f}",
                           verdict(r["median_ratio"], r["target"]), f"{r['mean_ratio']:.3f}",
                           f"{r['mean_ci95'][0]:.3f}-{r['mean_ci95'][1]:.3f}",
                           f"{r['per_round_ratio']:.3f}",
                           f"{r['per_round_ci95'][0]:.3f}-{r['per_round_ci95'][1]:.3f}")
        console.print(ratios)
    cycles = results.get("cycles")
    if cycles:
        base = results.get("steps", {}).get("A", {}).get("median_ms")
        table = Table(title=f"Cycle saves: step {FLUSH_STEPS} of {FLUSH_STEPS + CYCLE_TAIL}-step "
                            f"blocks ({args['cycle_rounds']} rounds), ms")
        for column in ("config", "step median", "save step", "extra", "extra / cycle",
                       f"next {CYCLE_TAIL} steps mean", "/ median"):
            table.add_column(column, justify="left" if column == "config" else "right")
        for key, c in cycles.items():
            share = f"{c['save_extra_ms'] / FLUSH_STEPS / base:.1%} of A" if base else ""
            table.add_row(key, f"{c['recording_median_ms']:.2f}", f"{c['save_step_ms']:.1f}",
                          f"{c['save_extra_ms']:.1f}", share, f"{c['after_mean_ms']:.2f}",
                          f"{c['after_ratio']:.3f}")
        console.print(table)
    post = results.get("post")
    if not post:
        return
    n = args["post_steps"]
    cost = Table(title=f"Post-processing, {n} steps (target ≤10 µs/event, stretch 5)")
    for column in ("what", "events", "ms", "µs/event", ""):
        cost.add_column(column, justify="left" if column in ("what", "") else "right")
    d, s, t = post["dlprof_default"], post["dlprof_single_cycle"], post["torch"]
    cost.add_row("dlprof stop(), default (cycles of 100 converted in background)", str(d["events"]),
                 f"{d['stop_ms']:.0f}", f"{d['us_per_event']:.2f}", verdict(d["us_per_event"], 10))
    cost.add_row("  + CPU of the background conversions (child processes)", str(d["events"]),
                 f"{d['stop_ms'] + d['children_cpu_ms']:.0f}", f"{d['total_us_per_event']:.2f}",
                 verdict(d["total_us_per_event"], 10))
    cost.add_row("dlprof stop(), one cycle (all conversion in stop)", str(s["events"]),
                 f"{s['stop_ms']:.0f}", f"{s['us_per_event']:.2f}", verdict(s["us_per_event"], 10))
    c = post.get("cli", {})
    if "error" in c:
        cost.add_row("dlprof run (CLI)", "", "", "", f"[red]failed: {escape(c['error'][:300])}[/]")
    elif c:
        cost.add_row("dlprof run (CLI): script's last line -> exit", str(c["events"]),
                     f"{c['exit_ms']:.0f}", f"{c['us_per_event']:.2f}", "")
        cost.add_row("  python example.py alone: last line -> exit (interpreter teardown)", "",
                     f"{c['plain_exit_ms']:.0f}", "", "")
        cost.add_row("  dlprof run minus python alone", str(c["events"]),
                     f"{c['exit_ms'] - c['plain_exit_ms']:.0f}", f"{c['extra_us_per_event']:.2f}",
                     verdict(c["extra_us_per_event"], 10))
    cost.add_row("torch: prof.stop() + prof.events()", str(t["events"]),
                 f"{t['stop_ms'] + t['events_ms']:.0f}", f"{t['us_per_event_stop_events']:.2f}", "")
    cost.add_row("torch: key_averages() after events()", str(t["events"]),
                 f"{t['key_averages_ms']:.0f}", f"{t['us_per_event_key_averages']:.2f}", "")
    cost.add_row("torch: export_chrome_trace() (per JSON event)", str(t["json_events"]),
                 f"{t['export_ms']:.0f}", f"{t['us_per_event_export']:.2f}", "")
    console.print(cost)
    disk = Table(title=f"On disk, {n} steps (target < 40 bytes/event)")
    for column in ("what", "rows", "bytes", "bytes/row", ""):
        disk.add_column(column, justify="left" if column in ("what", "") else "right")
    disk.add_row("dlprof run, all Parquet", str(d["events"]), str(d["parquet_bytes"]),
                 f"{d['bytes_per_event']:.1f}", verdict(d["bytes_per_event"], 40))
    for name, table in d["tables"].items():
        if table["rows"]:
            disk.add_row(f"  {name}", str(table["rows"]), str(table["bytes"]),
                         f"{table['bytes'] / table['rows']:.1f}", "")
    disk.add_row("torch Chrome JSON export", str(t["json_events"]), str(t["json_bytes"]),
                 f"{t['bytes_per_event']:.1f}", "")
    console.print(disk)


def tree_state() -> dict[str, Any]:
    """Which dlprof was measured: the commit, and how many files differ from it."""
    def git(*words: str) -> str:
        command = ["git", "-C", str(ROOT), *words]
        done = subprocess.run(command, check=False, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    return {"commit": git("rev-parse", "--short", "HEAD"),
            "changed_files": len(git("status", "--porcelain").splitlines())}


# --- main ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    keys = ",".join(c.key for c in CONFIGS)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30, help="rounds of step-time blocks")
    parser.add_argument("--steps", type=int, default=30, help="steps per step-time block")
    parser.add_argument("--skip", type=int, default=2, help="first steps of a block left out")
    parser.add_argument("--configs", default=keys, help=f"which configurations (default {keys})")
    parser.add_argument("--cycle-rounds", type=int, default=4,
                        help=f"rounds of {FLUSH_STEPS + CYCLE_TAIL}-step blocks (0: skip)")
    parser.add_argument("--post-steps", type=int, default=300,
                        help="steps of the post-processing runs (0: skip that part)")
    parser.add_argument("--no-cli", action="store_true", help="skip the `dlprof run` subprocess")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)
    unknown = set(args.configs.split(",")) - {c.key for c in CONFIGS}
    if unknown:
        parser.error(f"--configs: unknown {sorted(unknown)}")
    if not 0 <= args.skip < args.steps:
        parser.error("--skip must be below --steps")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Piped output gets rich's 80 columns by default, too narrow for the tables.
    console = Console(width=None if sys.stdout.isatty() else 120)
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    # torch.profiler warns once per cycle that a cycle clears the previous one's events.
    warnings.filterwarnings("ignore", message=".*Profiler clears events.*")
    configs = [c for c in CONFIGS if c.key in args.configs.split(",")]
    work = Workload(load_example(), args.batch_size)
    began = time.perf_counter()
    results: dict[str, Any] = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                    "cuda": torch.cuda.is_available()},
        "tree": tree_state(),
        "labels": {c.key: c.label for c in CONFIGS},
    }
    with tempfile.TemporaryDirectory(prefix="dlprof-bench-") as tmp:
        scratch = Path(tmp)
        console.print("warm-up")
        with hide_kineto_chatter():
            for config in configs:  # the first profiler start, the allocator, caches
                run_block(config, work, 20, scratch)
        if args.rounds:
            console.print(f"1. step time: {args.rounds} rounds x {len(configs)} blocks of {args.steps} steps")
            blocks = interleave(configs, work, args.steps, args.rounds, scratch, console, began)
            results["steps"] = {k: step_stats(b, args.skip) for k, b in blocks.items()}
            results["round_medians_ms"] = {
                k: [float(np.median(x.step_ns[args.skip:]) / 1e6) for x in b] for k, b in blocks.items()
            }
            results["ratios"] = {
                f"{n}/{d}": {**ratio_stats(blocks[n], blocks[d], args.skip, args.resamples), "target": t}
                for n, d, t in RATIOS if n in blocks and d in blocks
            }
        cycle_configs = [c for c in configs if c.key in CYCLE_CONFIGS]
        if args.cycle_rounds and cycle_configs:
            steps = FLUSH_STEPS + CYCLE_TAIL
            console.print(f"2. cycle saves: {args.cycle_rounds} rounds x {len(cycle_configs)} "
                          f"blocks of {steps} steps")
            cycles = interleave(cycle_configs, work, steps, args.cycle_rounds, scratch, console, began)
            results["cycles"] = {k: cycle_stats(b, args.skip) for k, b in cycles.items()}
        if args.post_steps:
            console.print(f"3. post-processing: runs of {args.post_steps} steps")
            with hide_kineto_chatter():
                post = {"dlprof_default": dlprof_post(work, args.post_steps, scratch, False),
                        "dlprof_single_cycle": dlprof_post(work, args.post_steps, scratch, True),
                        "torch": torch_post(work, args.post_steps, scratch)}
            if not args.no_cli:
                post["cli"] = cli_post(args.post_steps, args.threads, scratch)
            results["post"] = post
    results["seconds"] = time.perf_counter() - began
    report(console, results)
    console.print(f"total {results['seconds']:.0f}s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=float))
        console.print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
