"""The GPU's overhead, measured in the same go as the checks: what ``dlprof run`` costs on ``cuda``.

    python -m tools.gpu_check.checks.overhead --work DIR --result FILE --seconds 200

The GPT-style workload in bf16 (:func:`tools.gpu_check.workloads.gpt_program`) and the bundled
CNN, each run as a whole process three ways, ``plain``, ``bare`` (torch.profiler around the whole
program, then ``export_chrome_trace``) and ``dlprof`` (``dlprof run``), interleaved over
:data:`ROUNDS` rounds in an order rotated each round (:mod:`tools.gpu_check.overhead`). Every
process runs the script through ``programs/step_timer.py`` (optimizer steps timed on the host,
peak CUDA memory); the peak resident memory of the process tree is sampled from here, as
``bench/whole_process.py`` samples it. First an
unmeasured plain run of the GPT-style workload warms its caches up and says how long a process
takes, so that a round is started only when it fits in the time left.

One part per workload: passed when every round ran and every process exited 0, with the figures
(a row per way, a row per ratio); could not run when fewer than :data:`ROUNDS` rounds fitted.
Nothing is judged against a target: the figures are the result.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.whole_process import TreeMemory
from tools.gpu_check.checks.harness import ROOT, CannotRun, Check, main, tail
from tools.gpu_check.overhead import MIN_ROUNDS, Measurement, round_order, step_period_ms, summarise
from tools.gpu_check.report import Part, Status
from tools.gpu_check.workloads import BARE_PROFILER, STEP_TIMER, Workload, cnn, gpt_program, own_gpt

ROUNDS = MIN_ROUNDS
STEPS = {"gpt": 30, "cnn": 100}
WARM_UP_STEPS = 3
WAY_COST = {"plain": 1.0, "bare": 1.6, "dlprof": 2.0}  # a process's time against plain's, to plan a round
_SPARE_S = 10.0


def command(way: str, workload: Workload, steps: int, scratch: Path) -> list[str]:
    """The process of one way: the script through the step timer, alone or under a profiler."""
    timed = [str(STEP_TIMER), "--out", str(scratch / "steps.json"), *workload.argv(steps)]
    if way == "plain":
        return [sys.executable, *timed]
    if way == "bare":
        return [sys.executable, str(BARE_PROFILER), "--trace", str(scratch / "bare.json"), *timed]
    return [sys.executable, "-m", "dlprof", "run", "-o", str(scratch / "run"), "-n", "0", *timed]


def _events(way: str, scratch: Path) -> int:
    if way == "bare" and (scratch / "bare.json").is_file():
        return (scratch / "bare.json").read_bytes().count(b'"ph"')
    manifest = scratch / "run" / "run.json"
    if way == "dlprof" and manifest.is_file():
        return sum(int(v) for v in json.loads(manifest.read_text()).get("counts", {}).values())
    return 0


def measure(c: Check, workload: Workload, way: str, number: int, steps: int) -> Measurement:
    """One whole process; killed (with its children) if it would pass the part's time."""
    scratch = Path(tempfile.mkdtemp(prefix=f"{workload.name}-{way}-", dir=c.work))
    argv = command(way, workload, steps, scratch)
    print(f"$ {' '.join(argv)}", file=sys.stderr, flush=True)
    began = time.perf_counter()
    with (scratch / "output.log").open("w") as log:
        process = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        memory = TreeMemory(process.pid)
        try:
            code = process.wait(timeout=max(c.seconds_left() - _SPARE_S / 2, 1))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            code = -int(signal.SIGKILL)
    wall = time.perf_counter() - began
    peak = memory.stop()
    output = (scratch / "output.log").read_text(errors="replace")
    print(output[-3000:], file=sys.stderr, flush=True)
    try:
        timed = json.loads((scratch / "steps.json").read_text())
    except (OSError, ValueError):
        timed = {"steps_ns": [], "peak_cuda_bytes": None}
    cuda = timed.get("peak_cuda_bytes")
    found = Measurement(workload.name, way, number, wall, step_period_ms(timed.get("steps_ns", [])), peak / 2**20,
                        None if cuda is None else cuda / 2**20, code, _events(way, scratch))
    print(f"  {workload.name} {way} round {number + 1}: exit {code}, {wall:.1f} s, step {found.step_ms} ms, "
          f"peak {found.peak_rss_mib:.0f} MiB" + ("" if code == 0 else f"; {tail(output, 3)}"),
          file=sys.stderr, flush=True)
    shutil.rmtree(scratch, ignore_errors=True)
    return found


def warm_up(c: Check, workload: Workload) -> Measurement:
    return measure(c, workload, "plain", -1, WARM_UP_STEPS)


def workload_part(workload: Workload, measured: list[Measurement], rounds: int, why_short: str) -> Part:
    """The part of one workload: its figures, and whether they are whole."""
    what = f"{workload.name} ({workload.shown}, {STEPS[workload.name]} steps) plain / bare torch.profiler / dlprof run"
    rows, ratios = summarise(measured)
    figures = {"program": workload.shown, "rounds": rounds, "per way": rows, "ratios": ratios}
    failed = [m for m in measured if m.returncode != 0]
    if failed:
        return Part(what, Status.FAILED, "; ".join(f"{m.way} round {m.round + 1} exited {m.returncode}"
                                                   for m in failed), figures)
    if rounds < ROUNDS:
        return Part(what, Status.COULD_NOT_RUN, f"{rounds} of {ROUNDS} rounds: {why_short}", figures)
    dlprof_bare = next(r for r in ratios if r["ratio"] == "dlprof/bare")
    return Part(what, Status.PASSED, f"{rounds} rounds: dlprof/bare wall {dlprof_bare['wall']}, step "
                f"{dlprof_bare['step']}, tree memory {dlprof_bare['memory']}", figures)


def check(c: Check) -> None:
    import torch

    if not torch.cuda.is_available():
        raise CannotRun("torch sees a CUDA device", f"torch {torch.__version__} sees none")
    # One unmeasured plain run of the GPT-style workload: its caches warm, the benchmarks' program
    # shown to run (else the check's own stands in), and how long a process takes. The CNN ran
    # in the checks and recordings before: it is warm.
    gpt = gpt_program()
    first = warm_up(c, gpt)
    if first.returncode != 0 and gpt != own_gpt():
        c.add(Part(f"{gpt.shown} runs on cuda", Status.FAILED,
                   f"exited {first.returncode}: the check's own GPT-style program is measured instead"))
        gpt = own_gpt()
        first = warm_up(c, gpt)
    workloads = [cnn()]
    if first.returncode == 0:
        workloads.insert(0, gpt)
    else:
        c.add(Part(f"gpt ({gpt.shown}) runs on cuda", Status.FAILED, f"the warm-up run exited {first.returncode}"))
    measured: dict[str, list[Measurement]] = {w.name: [] for w in workloads}
    rounds, why_short = 0, ""
    # The first round costs about each way's share of a plain process (a CNN process about as
    # long as the GPT-style one: start-up dominates both); later ones, as the last did.
    need = 1.1 * len(workloads) * first.wall_s * sum(WAY_COST.values())
    for number in range(ROUNDS):
        if c.seconds_left() < need + _SPARE_S:
            why_short = f"round {number + 1} needs about {need:.0f} s, {c.seconds_left():.0f} s were left"
            break
        began = time.monotonic()
        for workload in workloads:
            for way in round_order(number):
                measured[workload.name].append(measure(c, workload, way, number, STEPS[workload.name]))
        rounds += 1
        need = time.monotonic() - began
    for workload in workloads:
        c.add(workload_part(workload, measured[workload.name], rounds, why_short))


if __name__ == "__main__":
    sys.exit(main(check))
