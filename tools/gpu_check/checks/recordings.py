"""Recordings brought back: real GPU runs for the tests' data, packed into the report's directory.

    python -m tools.gpu_check.checks.recordings --work DIR --result FILE --seconds 200 --out REPORT_DIR

Made here (in this order, each skipped with its reason when time or room runs short):

* ``gpt-dlprof-run.tar.gz``: ``dlprof run`` (default collectors) of the GPT-style workload in bf16
  (:func:`tools.gpu_check.workloads.gpt_program`); the commands part reads this run;
* ``gpt-torch-profiler.json.gz``: the same program under bare torch.profiler, then
  ``export_chrome_trace`` (``bench/bare_profiler.py``): the reference for the same work;
* ``cnn-workers-dlprof-run.tar.gz``: the bundled CNN fed by a DataLoader with two worker
  processes (``programs/cnn_variants.py``): dataloader slices from forked children;
* ``cnn-compiled-dlprof-run.tar.gz``: the CNN under ``torch.compile(mode="reduce-overhead")``, so
  that its steps run as CUDA graphs.

Each file is at most 16 MiB and the directory holds at most 8 (:mod:`tools.gpu_check.bring_back`).
A part passes when its program ran, the run is complete and holds what it was made for (kernels;
worker batches; graph launches), and the file is there.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlprof.keys import Kind, RunStatus
from tools.gpu_check.bring_back import TooLarge, files_left, gzip_file, pack_directory
from tools.gpu_check.checks.harness import CannotRun, Check, StepFailed, main
from tools.gpu_check.report import Part, Status
from tools.gpu_check.workloads import BARE_PROFILER, CNN_VARIANTS, Workload, gpt_program, own_gpt

GPT_RUN = "gpt-dlprof-run"  # in this part's work directory; the commands part reads it
DEVICE = "cuda"  # where the CNN trains (the tests run the same recordings on the CPU)
GPT_STEPS = 20
BARE_STEPS = 8
CNN_STEPS = 40
GRAPH_LAUNCH = "cudaGraphLaunch"


@dataclass
class Plan:
    """What the recordings share: the GPT-style program (the check's own once the benchmarks'
    failed to run)."""

    gpt: Workload = field(default_factory=gpt_program)


@dataclass(frozen=True)
class Recording:
    """One file to bring back: how it is made, about how long that takes, what it must hold."""

    name: str  # the file's name without its extension
    need_s: float  # about how long it takes on an H100 (start-up, compile, saving, packing)
    make: Callable[[Check, Plan], tuple[Path, dict[str, Any]]]  # -> what to pack, figures
    packed: str = ".tar.gz"


def _dlprof_run(c: Check, name: str, program: list[str]) -> Path:
    return c.dlprof_run(f"dlprof run {' '.join(Path(program[0]).parts[-2:])} {' '.join(program[1:])}", name,
                        None, program)


def _run_figures(path: Path) -> dict[str, Any]:
    """What a run holds, from its manifest and tables: status, rows, kernels, worker batches,
    graph launches, collectors' notes."""
    import dlprof

    run = dlprof.load(path)
    if run.status not in (RunStatus.COMPLETE, RunStatus.DEGRADED):
        raise StepFailed(f"the run in {path.name} is complete", f"it is {run.status}: {run.manifest.error}")
    kinds = dict(run.query("SELECT kind, count(*) FROM slices GROUP BY kind").rows)
    graphs = run.query(f"SELECT count(*) FROM slices WHERE name LIKE '{GRAPH_LAUNCH}%'").rows[0][0]
    return {"status": str(run.status), "rows": dict(run.manifest.counts), "kinds": {str(k): int(v) for k, v in kinds.items()},
            "graph_launches": int(graphs),
            "notes": {i.name: i.notes for i in run.manifest.collectors if i.notes}}


def gpt_run(c: Check, plan: Plan) -> tuple[Path, dict[str, Any]]:
    try:
        path = _dlprof_run(c, GPT_RUN, plan.gpt.argv(GPT_STEPS))
    except StepFailed as failure:
        if plan.gpt == own_gpt():
            raise
        c.add(Part(f"{plan.gpt.shown} runs under dlprof run", Status.FAILED, failure.detail))
        plan.gpt = own_gpt()
        shutil.rmtree(c.work / GPT_RUN, ignore_errors=True)
        path = _dlprof_run(c, GPT_RUN, plan.gpt.argv(GPT_STEPS))
    figures = _run_figures(path)
    figures["program"] = plan.gpt.shown
    if not figures["kinds"].get(str(Kind.KERNEL)):
        raise StepFailed("the GPT-style run holds kernels", f"no kernel recorded: {figures['notes']}")
    return path, figures


def gpt_bare(c: Check, plan: Plan) -> tuple[Path, dict[str, Any]]:
    trace = c.work / "gpt-torch-profiler.json"
    c.python("the GPT-style workload under bare torch.profiler, then export_chrome_trace",
             [str(BARE_PROFILER), "--trace", str(trace), *plan.gpt.argv(BARE_STEPS)])
    events = len(json.loads(trace.read_bytes()).get("traceEvents", []))
    return trace, {"program": plan.gpt.shown, "steps": BARE_STEPS, "events": events}


def cnn_workers(c: Check, _: Plan) -> tuple[Path, dict[str, Any]]:
    path = _dlprof_run(c, "cnn-workers-dlprof-run",
                       [str(CNN_VARIANTS), "--workers", "2", "--steps", str(CNN_STEPS), "--device", DEVICE])
    figures = _run_figures(path)
    if not figures["kinds"].get(str(Kind.DATALOADER)):
        raise StepFailed("the workers' batches are recorded", f"no dataloader slice: {figures['notes']}")
    return path, figures


def cnn_compiled(c: Check, _: Plan) -> tuple[Path, dict[str, Any]]:
    path = _dlprof_run(c, "cnn-compiled-dlprof-run",
                       [str(CNN_VARIANTS), "--compile", "reduce-overhead", "--steps", str(CNN_STEPS),
                        "--device", DEVICE])
    figures = _run_figures(path)
    if not figures["graph_launches"]:
        raise StepFailed("CUDA graph launches are recorded", f"no {GRAPH_LAUNCH} call recorded: {figures['notes']}")
    return path, figures


RECORDINGS = (
    Recording("gpt-dlprof-run", 40, gpt_run),
    Recording("gpt-torch-profiler", 30, gpt_bare, ".json.gz"),
    Recording("cnn-workers-dlprof-run", 40, cnn_workers),
    Recording("cnn-compiled-dlprof-run", 90, cnn_compiled),
)


def record(c: Check, recording: Recording, plan: Plan, out: Path) -> Part:
    """Make one recording and leave it in ``out``; the part says how it went."""
    what = f"{recording.name}{recording.packed} is brought back"
    left = c.seconds_left()
    if left < recording.need_s:
        return Part(what, Status.COULD_NOT_RUN, f"out of time: {left:.0f} s left, about {recording.need_s:.0f} s needed")
    if files_left(out) < 1:
        return Part(what, Status.COULD_NOT_RUN, f"no room: {out} already holds the most files brought back")
    try:
        made, figures = recording.make(c, plan)
    except StepFailed as failure:
        return Part(what, Status.FAILED, f"{failure.what}: {failure.detail}")
    except CannotRun as cannot:
        return Part(what, Status.COULD_NOT_RUN, f"{cannot.what}: {cannot.why}")
    target = out / f"{recording.name}{recording.packed}"
    try:
        size = gzip_file(made, target) if recording.packed == ".json.gz" else pack_directory(made, target)
    except TooLarge as large:
        return Part(what, Status.FAILED, str(large), figures)
    figures["bytes"] = size
    return Part(what, Status.PASSED, f"{target.name}: {size / 2**20:.1f} MiB", figures)


def check(c: Check) -> None:
    import torch

    if not torch.cuda.is_available():
        raise CannotRun("torch sees a CUDA device", f"torch {torch.__version__} sees none")
    out = c.out or c.work
    out.mkdir(parents=True, exist_ok=True)
    plan = Plan()
    for recording in RECORDINGS:
        c.add(record(c, recording, plan, out))


if __name__ == "__main__":
    sys.exit(main(check))
