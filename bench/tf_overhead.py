"""What dlprof's tensorflow collector costs on the bundled Keras MLP: step time against no profiler
and against TensorFlow's own profiler, the cost of a cycle's save, and post-processing per event.

    .venv/bin/python bench/tf_overhead.py                       # defaults: about 3 minutes on 2 cores
    .venv/bin/python bench/tf_overhead.py --rounds 4 --post-steps 100   # a quick look
    .venv/bin/python bench/tf_overhead.py --json tf_overhead.json

1. Step time. Blocks of ``--steps`` training batches, each one ``model.fit`` of the example's
   model (examples/keras_mlp.py) over that many batches, timed batch by batch from a Keras
   callback; one block of each configuration per round, the order rotated every round, all in
   this one process. The first ``--skip`` batches of a block (fit setting up its iterator, a
   profiler starting) are left out. Statistics as bench/overhead.py's (its functions are reused).

       A   unprofiled
       B   TensorFlow's profiler: tf.profiler.experimental.start/stop around the block
       C   dlprof.profile(collectors=("tensorflow",)), a step per batch
       D   dlprof.profile() with its default collectors (what dlprof run uses), a step per batch

2. Cycle saves. With no schedule dlprof saves every 100 steps: TensorFlow's profiler stops
   (writing its XPlane), starts again, and a child process converts the cycle. Blocks of 120
   batches of A, B, C show that batch and the 20 after it.

3. Post-processing. ``--post-steps`` batches under the tensorflow collector: the time ``stop()``
   takes, per XPlane event and per row written, with the whole run as one cycle (all conversion
   in ``stop()``) and with the default cycles of 100 steps (conversion in child processes while
   the program runs, their CPU time from getrusage); TensorFlow's own ``stop()`` over the same
   batches; and the translation alone (``convert_xspace`` on the run's XPlane, in this process).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
from rich.console import Console
from rich.table import Table

import dlprof
from dlprof.collectors.tensorflow import is_tensorflow_chatter
from dlprof.importers.xplane import XPLANE_SUFFIX, XPlaneOptions, convert_xspace, read_xspace
from dlprof.schedule import Schedule
from dlprof.support.chatter import hidden_chatter

ROOT = Path(__file__).resolve().parents[1]
StepHook = Callable[[], None] | None


def load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# The statistics of bench/overhead.py (ratios with resampled intervals, cycle-save figures).
torch_bench = load("dlprof_bench_overhead", ROOT / "bench" / "overhead.py")
Block = torch_bench.Block
example = load("keras_mlp_example", ROOT / "examples" / "keras_mlp.py")
keras = example.keras


class Workload:
    """The example's model and data; a block is one fit over ``steps`` batches."""

    def __init__(self, batch_size: int, width: int) -> None:
        keras.utils.set_random_seed(0)
        self.batch_size = batch_size
        self.x, self.y = example.synthetic_data(batch_size * 200, 32, 10)
        self.model = example.build_model(32, 10, width)
        self.model.fit(self.x[:batch_size], self.y[:batch_size], batch_size=batch_size, verbose=0)

    def timed_steps(self, steps: int, after_step: StepHook) -> np.ndarray:
        """Nanoseconds per batch, the profiler's step() included."""
        times = np.empty(steps, dtype=np.int64)
        last = [time.perf_counter_ns()]

        class Timer(keras.callbacks.Callback):  # type: ignore[misc]
            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                if after_step is not None:
                    after_step()
                now = time.perf_counter_ns()
                times[batch] = now - last[0]
                last[0] = now

        count = steps * self.batch_size
        repeats = -(-count // len(self.x))
        x, y = np.concatenate([self.x] * repeats)[:count], np.concatenate([self.y] * repeats)[:count]
        self.model.fit(x, y, batch_size=self.batch_size, epochs=1, verbose=0, shuffle=False, callbacks=[Timer()])
        return times


@contextlib.contextmanager
def unprofiled(scratch: Path) -> Iterator[StepHook]:
    yield None


@contextlib.contextmanager
def tensorflow_profiler(scratch: Path) -> Iterator[StepHook]:
    import tensorflow as tf

    logdir = scratch / f"tf-{time.perf_counter_ns()}"
    with hidden_chatter(is_tensorflow_chatter):
        tf.profiler.experimental.start(str(logdir))
    try:
        yield None
    finally:
        with hidden_chatter(is_tensorflow_chatter):
            tf.profiler.experimental.stop()
        shutil.rmtree(logdir, ignore_errors=True)


# A dlprof session around each block, and one configuration of the comparison: as for PyTorch.
with_dlprof = torch_bench.with_dlprof
Config = torch_bench.Config


CONFIGS = (
    Config("A", "unprofiled", unprofiled),
    Config("B", "TensorFlow's profiler (start/stop)", tensorflow_profiler),
    Config("C", "dlprof tensorflow collector", with_dlprof(("tensorflow",))),
    Config("D", "dlprof default collectors", with_dlprof(None)),
)
RATIOS = (("C", "B"), ("C", "A"), ("B", "A"), ("D", "B"), ("D", "A"))


def run_block(config: Config, work: Workload, steps: int, scratch: Path) -> Any:
    started = time.perf_counter_ns()
    with config.open(scratch) as after_step:
        entered = time.perf_counter_ns()
        times = work.timed_steps(steps, after_step)
        done = time.perf_counter_ns()
    return Block(times, entered - started, time.perf_counter_ns() - done)


def interleave(configs: tuple[Config, ...], work: Workload, steps: int, rounds: int, scratch: Path,
               console: Console) -> dict[str, list[Any]]:
    blocks: dict[str, list[Any]] = {c.key: [] for c in configs}
    for number in range(rounds):
        shift = number % len(configs)
        for config in configs[shift:] + configs[:shift]:
            blocks[config.key].append(run_block(config, work, steps, scratch))
        medians = "  ".join(f"{k} {np.median(b[-1].step_ns) / 1e6:.2f}" for k, b in blocks.items())
        console.print(f"  round {number + 1}/{rounds}  median ms: {medians}")
    return blocks


def xplane_events(run_dir: Path) -> tuple[int, list[Path]]:
    files = sorted(run_dir.glob(f"tensorflow/**/*{XPLANE_SUFFIX}"))
    count = sum(len(line.events) for f in files for plane in read_xspace(f).planes for line in plane.lines)
    return count, files


def post_processing(work: Workload, steps: int, scratch: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for label, schedule in (("one cycle", Schedule.every_step(steps + 1)), ("cycles of 100", None)):
        out = scratch / f"post-{len(results)}"
        children_before = torch_bench.children_cpu_s()
        session = dlprof.profile(out=out, collectors=("tensorflow",), schedule=schedule).start()
        work.timed_steps(steps, session.step)
        stopping = time.perf_counter_ns()
        session.stop()
        stop_ns = time.perf_counter_ns() - stopping
        children_ns = round((torch_bench.children_cpu_s() - children_before) * 1e9)
        rows, _ = torch_bench.run_size(out)
        events, files = xplane_events(out)
        results[label] = {"xplane_events": events, "rows": rows, "stop_ms": stop_ns / 1e6,
                          "stop_us_per_event": stop_ns / 1e3 / events,
                          "children_cpu_ms": children_ns / 1e6,
                          "total_us_per_event": (stop_ns + children_ns) / 1e3 / events,
                          "xplane_bytes": sum(f.stat().st_size for f in files)}
        if schedule is not None:  # the translation alone, warm, on this run's one XPlane
            [path] = files
            convert_xspace(read_xspace(path), XPlaneOptions(id_base=0))
            began = time.perf_counter_ns()
            tables = convert_xspace(read_xspace(path), XPlaneOptions(id_base=0))
            took = time.perf_counter_ns() - began
            results["convert_xspace"] = {"events": tables.events, "ms": took / 1e6,
                                         "us_per_event": took / 1e3 / tables.events}
        shutil.rmtree(out)
    import tensorflow as tf

    logdir = scratch / "tf-post"
    with hidden_chatter(is_tensorflow_chatter):
        tf.profiler.experimental.start(str(logdir))
    work.timed_steps(steps, None)
    stopping = time.perf_counter_ns()
    with hidden_chatter(is_tensorflow_chatter):
        tf.profiler.experimental.stop()
    stop_ns = time.perf_counter_ns() - stopping
    events = sum(len(line.events) for f in logdir.glob(f"**/*{XPLANE_SUFFIX}")
                 for plane in read_xspace(f).planes for line in plane.lines)
    results["tensorflow stop()"] = {"xplane_events": events, "stop_ms": stop_ns / 1e6,
                                    "stop_us_per_event": stop_ns / 1e3 / events}
    return results


def report(console: Console, results: dict[str, Any]) -> None:
    steps = Table(title="Step (batch) time, ms")
    for column in ("config", "", "median", "IQR", "mean", "steps", "start ms", "stop ms"):
        steps.add_column(column, justify="left" if column in ("config", "") else "right")
    for key, s in results["steps"].items():
        steps.add_row(key, results["labels"][key], f"{s['median_ms']:.2f}", f"{s['q25_ms']:.2f}-{s['q75_ms']:.2f}",
                      f"{s['mean_ms']:.2f}", str(s["steps"]), f"{s['enter_ms']:.1f}", f"{s['exit_ms']:.1f}")
    console.print(steps)
    ratios = Table(title="Ratios of step times (95% intervals: rounds resampled, paired)")
    for column in ("ratio", "of medians", "95%", "of means", "95% ", "median per-round", "95%  "):
        ratios.add_column(column, justify="left" if column == "ratio" else "right")
    for name, r in results["ratios"].items():
        ratios.add_row(name, f"{r['median_ratio']:.3f}", f"{r['ci95'][0]:.3f}-{r['ci95'][1]:.3f}",
                       f"{r['mean_ratio']:.3f}", f"{r['mean_ci95'][0]:.3f}-{r['mean_ci95'][1]:.3f}",
                       f"{r['per_round_ratio']:.3f}", f"{r['per_round_ci95'][0]:.3f}-{r['per_round_ci95'][1]:.3f}")
    console.print(ratios)
    if "cycles" in results:
        cycles = Table(title="The save at step 100 and the 20 steps after it, ms")
        for column in ("config", "median step", "save step", "extra", "after: mean", "after / median"):
            cycles.add_column(column, justify="left" if column == "config" else "right")
        for key, c in results["cycles"].items():
            cycles.add_row(key, f"{c['recording_median_ms']:.2f}", f"{c['save_step_ms']:.2f}",
                           f"{c['save_extra_ms']:.2f}", f"{c['after_mean_ms']:.2f}", f"{c['after_ratio']:.2f}")
        console.print(cycles)
    post = Table(title=f"Post-processing ({results['args']['post_steps']} batches)")
    for column in ("what", "XPlane events", "rows", "stop ms", "us/event", "children CPU ms", "total us/event"):
        post.add_column(column, justify="left" if column == "what" else "right")
    for name, p in results["post"].items():
        if name == "convert_xspace":
            post.add_row("convert_xspace alone (warm)", str(p["events"]), "", f"{p['ms']:.1f}",
                         f"{p['us_per_event']:.2f}", "", "")
            continue
        post.add_row(name, str(p["xplane_events"]), str(p.get("rows", "")), f"{p['stop_ms']:.1f}",
                     f"{p['stop_us_per_event']:.2f}", f"{p.get('children_cpu_ms', 0):.0f}",
                     f"{p.get('total_us_per_event', p['stop_us_per_event']):.2f}")
    console.print(post)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=40, help="batches per block")
    parser.add_argument("--skip", type=int, default=3, help="first batches of a block left out")
    parser.add_argument("--cycle-rounds", type=int, default=3, help="rounds of 120-batch blocks (0: none)")
    parser.add_argument("--post-steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    console = Console(width=150)
    began = time.perf_counter()
    work = Workload(args.batch_size, args.width)
    results: dict[str, Any] = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                               "labels": {c.key: c.label for c in CONFIGS}}
    with tempfile.TemporaryDirectory(prefix="dlprof-tf-bench-") as tmp:
        scratch = Path(tmp)
        console.print(f"1. step time: {args.rounds} rounds of {args.steps}-batch blocks")
        blocks = interleave(CONFIGS, work, args.steps, args.rounds, scratch, console)
        results["steps"] = {k: torch_bench.step_stats(b, args.skip) for k, b in blocks.items()}
        results["ratios"] = {f"{a}/{b}": torch_bench.ratio_stats(blocks[a], blocks[b], args.skip, args.resamples)
                             for a, b in RATIOS}
        if args.cycle_rounds:
            console.print(f"2. cycle saves: {args.cycle_rounds} rounds of 120-batch blocks")
            cycles = interleave(CONFIGS[:3], work, 120, args.cycle_rounds, scratch, console)
            results["cycles"] = {k: torch_bench.cycle_stats(b, args.skip) for k, b in cycles.items()}
        console.print(f"3. post-processing: {args.post_steps} batches")
        results["post"] = post_processing(work, args.post_steps, scratch)
    results["seconds"] = time.perf_counter() - began
    report(console, results)
    console.print(f"total {results['seconds']:.0f}s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
