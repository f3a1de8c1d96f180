"""Check (c): CUPTI PM sampling per kernel, and the derived metrics ``dlprof metrics`` makes of it.

    python -m tools.gpu_check.checks.cupti_metrics --work DIR --result FILE --seconds 180

A memory-bound kernel (``stream_scale``) and a compute-bound one (``fma_loop``), each about a
millisecond or more per launch (:mod:`tools.gpu_check.programs.cupy_work`, phase ``metrics``),
run under ``dlprof run --collectors cupti_metrics,cupti``. Each kernel must carry every default
metric (``cupti:<metric>``, method ``sampled``); ``dlprof metrics`` (run as a user runs it) must
give IPC, warps per instruction, global loads per instruction and achieved occupancy within
their physical ranges (:data:`tools.gpu_check.compare.PHYSICAL_RANGES`), with the memory-bound
kernel loading more per instruction than the compute-bound one; ``dlprof roofline`` must put each
on its side of the ridge (the GPU named with ``--device``, as a CUPTI run records no device
properties). A chip that cannot sample a default metric samples an equivalent
(:mod:`dlprof.hardware.pm_metrics`): the part says which was stored. Last, the bundled CNN runs
under ``--collectors cupti_metrics,torch``: the kernels torch recorded must carry the metrics too.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from dlprof.collectors.cupti_metrics import PERMISSION_MESSAGE
from dlprof.hardware.pm_metrics import DEFAULT_METRICS, equivalents
from dlprof.store.pm_samples import METRIC_PREFIX, SAMPLED
from dlprof.store.reader import Run
from tools.gpu_check.checks.harness import PROGRAMS, ROOT, CannotRun, Check, main
from tools.gpu_check.checks.stored import run_complete
from tools.gpu_check.compare import PHYSICAL_RANGES, check_order, check_range
from tools.gpu_check.programs.cupy_work import COMPUTE_BOUND, MEMORY_BOUND
from tools.gpu_check.report import Part, Status

PROGRAM = [str(PROGRAMS / "cupy_work.py"), "--phase", "metrics"]
# The same sampling with the torch collector recording the kernels: attribution is the store's,
# whichever collector recorded them. The commands part reads this run for `dlprof metrics`.
TORCH_RUN = "torch-run"
TORCH_PROGRAM = [str(ROOT / "examples" / "torch_cnn.py"), "--device", "cuda", "--steps", "30", "--batch-size", "256"]
TORCH_COVERED = 0.95  # of the kernels carry every metric (sampling starts before torch's first kernel)
ROOFLINE = "memory-bound and compute-bound kernels on their sides of the roofline"
NO_ROOFLINE = "no roofline command yet"
# Columns a roofline table might name its verdict by; the first found is read.
_BOUND_COLUMNS = ("bound", "bound_by", "limited_by", "side", "regime")
# Counts every kernel that ran has more than none of; global loads may be none (fma_loop's are).
NEVER_ZERO = ("smsp__inst_executed.sum", "sm__warps_active.sum", "sm__cycles_active.sum")


def kernel_named(names: Sequence[str], wanted: str) -> str | None:
    """The stored kernel name that is, or contains, ``wanted`` (CuPy may decorate it)."""
    if wanted in names:
        return wanted
    return next((n for n in names if wanted in n), None)


def sampled_as(stored: set[str]) -> dict[str, str | None]:
    """Each default metric -> the name it was stored under (itself or an equivalent the chip
    offered in its place, :mod:`dlprof.hardware.pm_metrics`), None if the run has neither."""
    return {metric: next((m for m in equivalents(metric) if METRIC_PREFIX + m in stored), None)
            for metric in DEFAULT_METRICS}


def per_kernel_metrics(run: Run, kernels: Mapping[str, str | None]) -> Part:
    """Each named kernel carries every default PM sampling metric (or the equivalent its chip
    sampled), sampled, and the counts every kernel has (:data:`NEVER_ZERO`) above 0.

    Args:
        run: the run.
        kernels: role ("memory-bound") -> the kernel's stored name, None if it was not found.
    """
    what = f"each kernel carries {', '.join(DEFAULT_METRICS)} or an equivalent (method {SAMPLED})"
    slices, metrics = run.slices, run.metrics
    used = sampled_as(set(metrics["metric"].astype(str)))
    figures: dict[str, Any] = {"rows": len(metrics),
                               "sampled as": {m: name for m, name in used.items() if name not in (None, m)}}
    missing = [role for role, name in kernels.items() if name is None]
    if missing:
        return Part(what, Status.FAILED, f"no {' or '.join(missing)} kernel was recorded", figures)
    table: list[dict[str, Any]] = []
    lacking = []
    for role, name in kernels.items():
        ids = slices.loc[(slices["kind"] == "kernel") & (slices["name"] == name), "id"]
        rows = metrics[metrics["slice_id"].isin(ids)]
        totals = rows.groupby(rows["metric"].astype(str))["value"].sum()
        methods = set(rows["method"].astype(str))
        entry: dict[str, Any] = {"kernel": role, "launches": len(ids)}
        for metric in DEFAULT_METRICS:
            total = totals.get(METRIC_PREFIX + (used[metric] or metric))
            entry[metric] = None if total is None or pd.isna(total) else float(total)
            if entry[metric] is None or entry[metric] < 0 or (metric in NEVER_ZERO and entry[metric] == 0):
                lacking.append(f"{role} {metric}")
        if methods != {SAMPLED}:
            lacking.append(f"{role} methods {sorted(methods)}")
        table.append(entry)
    figures["kernels"] = table
    if lacking:
        return Part(what, Status.FAILED, f"missing, negative or zero: {', '.join(lacking)}", figures)
    return Part(what, Status.PASSED, f"{len(kernels)} kernels: every metric there, instructions, warps "
                "and cycles above 0", figures)


def derived_parts(rows: Sequence[Mapping[str, Any]], unavailable: Mapping[str, str],
                  kernels: Mapping[str, str | None]) -> list[Part]:
    """The range of each derived metric, and the memory-bound kernel's loads above the other's.

    Args:
        rows: ``dlprof metrics --format json``: one row per kernel name.
        unavailable: metric -> why ``dlprof metrics --list`` says it is not available.
        kernels: role -> the kernel's stored name ("memory-bound", "compute-bound").
    """
    parts = []
    for metric, valid in PHYSICAL_RANGES.items():
        if metric in unavailable:
            parts.append(Part(f"{metric} is computed", Status.FAILED,
                              f"dlprof metrics: not available: {unavailable[metric]}"))
        else:
            parts.append(check_range(rows, metric, valid))
    memory, compute = kernels.get("memory-bound"), kernels.get("compute-bound")
    if memory and compute and "gld_per_inst" not in unavailable:
        parts.append(check_order(rows, "gld_per_inst", memory, compute,
                                 "one load per element against none at all"))
    return parts


def roofline_verdicts(rows: Sequence[Mapping[str, Any]], kernels: Mapping[str, str | None]) -> Part:
    """Whether ``dlprof roofline``'s rows put each kernel on its side (memory or compute)."""
    columns = list(dict.fromkeys(k for row in rows for k in row))
    column = next((c for c in _BOUND_COLUMNS if c in columns), None)
    if column is None:
        return Part(ROOFLINE, Status.COULD_NOT_RUN,
                    f"dlprof roofline's JSON names no bound (columns: {', '.join(columns)})")
    verdicts = {str(r.get("name")): str(r.get(column, "")).lower() for r in rows}
    expected = {"memory-bound": "memory", "compute-bound": "compute"}
    found = {role: verdicts.get(name or "", "") for role, name in kernels.items()}
    right = all(expected[role] in found[role] for role in expected)
    return Part(ROOFLINE, Status.PASSED if right else Status.FAILED,
                ", ".join(f"{role}: {found[role] or 'absent'}" for role in expected), {"verdicts": found})


def gpu_name() -> str:
    """The name the driver gives device 0 (the one the CuPy kernels ran on)."""
    import cupy

    name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def roofline_part(c: Check, path: Path, kernels: Mapping[str, str | None]) -> Part:
    """``dlprof roofline`` on the run; a CUPTI run records no device properties, so the GPU is
    then named with ``--device`` as a user would."""
    probe = c.python("dlprof roofline --help", ["-m", "dlprof", "roofline", "--help"], allow_failure=True)
    if probe.returncode != 0:
        return Part(ROOFLINE, Status.COULD_NOT_RUN, NO_ROOFLINE)
    command = ["-m", "dlprof", "roofline", str(path), "--by", "kernel", "--limit", "0", "--format", "json"]
    roofline = c.python("dlprof roofline", command, allow_failure=True)
    if roofline.returncode != 0 and "--device" in roofline.stderr:
        roofline = c.python("dlprof roofline --device", [*command, "--device", gpu_name()], allow_failure=True)
    if roofline.returncode != 0:
        return Part(ROOFLINE, Status.COULD_NOT_RUN, f"dlprof roofline exited {roofline.returncode}: "
                    f"{roofline.stderr.strip()[-300:]}")
    return roofline_verdicts(json.loads(roofline.stdout), kernels)


def torch_kernels_carry_metrics(run: Run) -> Part:
    """Samples reach the kernels the torch collector recorded too (attribution does not depend
    on which collector recorded them): nearly every kernel carries every sampled metric."""
    what = "the torch collector's kernels carry the sampled metrics"
    slices, metrics = run.slices, run.metrics
    kernels = slices.loc[slices["kind"] == "kernel", "id"]
    stored = sorted(set(metrics["metric"].astype(str)))
    per_kernel = metrics[metrics["slice_id"].isin(kernels)].groupby("slice_id")["metric"].nunique()
    complete = int((per_kernel == len(stored)).sum()) if stored else 0
    figures: dict[str, Any] = {"kernels": len(kernels), "with every metric": complete, "metrics": stored}
    if not len(kernels):
        return Part(what, Status.FAILED, "the torch collector recorded no kernel", figures)
    share = complete / len(kernels)
    status = Status.PASSED if stored and share >= TORCH_COVERED else Status.FAILED
    return Part(what, status, f"{complete} of {len(kernels)} kernels ({100 * share:.0f} %, needed "
                f"{100 * TORCH_COVERED:.0f} %) carry all of {len(stored)} metrics", figures)


def check(c: Check) -> None:
    c.python("the CuPy kernels alone (warm-up, fills CuPy's kernel cache)", PROGRAM)
    path = c.dlprof_run("dlprof run --collectors cupti_metrics,cupti", "run", "cupti_metrics,cupti", PROGRAM)
    run = c.load(path)
    info = {i.name: i for i in run.manifest.collectors}
    sampling = info.get("cupti_metrics")
    if sampling is not None and PERMISSION_MESSAGE in sampling.notes:
        raise CannotRun("PM sampling may read the GPU's counters", PERMISSION_MESSAGE)
    c.add(run_complete(run, ["cupti", "cupti_metrics"]))
    names = sorted(set(run.slices.loc[run.slices["kind"] == "kernel", "name"].astype(str)))
    kernels = {"memory-bound": kernel_named(names, MEMORY_BOUND), "compute-bound": kernel_named(names, COMPUTE_BOUND)}
    c.add(per_kernel_metrics(run, kernels))
    values = c.python("dlprof metrics", ["-m", "dlprof", "metrics", str(path), "--format", "json", "--limit", "0"],
                      allow_failure=True)
    listing = c.python("dlprof metrics --list", ["-m", "dlprof", "metrics", str(path), "--list", "--format", "json"])
    unavailable = {str(r["name"]): str(r["reason"]) for r in json.loads(listing.stdout) if not r["available"]}
    rows = json.loads(values.stdout) if values.returncode == 0 else []
    for part in derived_parts(rows, unavailable, kernels):
        c.add(part)
    c.add(roofline_part(c, path, kernels))
    try:
        import torch
    except ImportError as error:
        c.add(Part("the torch collector's kernels carry the sampled metrics", Status.COULD_NOT_RUN,
                   f"torch does not import: {error}"))
        return
    if not torch.cuda.is_available():
        c.add(Part("the torch collector's kernels carry the sampled metrics", Status.COULD_NOT_RUN,
                   f"torch {torch.__version__} sees no CUDA device"))
        return
    torch_run = c.dlprof_run("dlprof run --collectors cupti_metrics,torch (the CNN on cuda)", TORCH_RUN,
                             "cupti_metrics,torch", TORCH_PROGRAM)
    c.add(torch_kernels_carry_metrics(c.load(torch_run)))


if __name__ == "__main__":
    sys.exit(main(check))
