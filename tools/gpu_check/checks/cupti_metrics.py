"""Check (c): CUPTI PM sampling per kernel, and the derived metrics ``dlprof metrics`` makes of it.

    python -m tools.gpu_check.checks.cupti_metrics --work DIR --result FILE --seconds 180

A memory-bound kernel (``stream_scale``) and a compute-bound one (``fma_loop``), each about a
millisecond or more per launch (:mod:`tools.gpu_check.programs.cupy_work`, phase ``metrics``),
run under ``dlprof run --collectors cupti_metrics,cupti``. Each kernel must carry every default
metric (``cupti:<metric>``, method ``sampled``); ``dlprof metrics`` (run as a user runs it) must
give IPC, warps per instruction, global loads per instruction and achieved occupancy within
their physical ranges (:data:`tools.gpu_check.compare.PHYSICAL_RANGES`), with the memory-bound
kernel loading more per instruction than the compute-bound one. The roofline part runs only
where a ``dlprof roofline`` command exists.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from dlprof.collectors.cupti_metrics import DEFAULT_METRICS, METRIC_PREFIX, PERMISSION_MESSAGE, SAMPLED
from dlprof.store.reader import Run
from tools.gpu_check.checks.harness import PROGRAMS, CannotRun, Check, main
from tools.gpu_check.checks.stored import run_complete
from tools.gpu_check.compare import PHYSICAL_RANGES, check_order, check_range
from tools.gpu_check.programs.cupy_work import COMPUTE_BOUND, MEMORY_BOUND
from tools.gpu_check.report import Part, Status

PROGRAM = [str(PROGRAMS / "cupy_work.py"), "--phase", "metrics"]
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


def per_kernel_metrics(run: Run, kernels: Mapping[str, str | None]) -> Part:
    """Each named kernel carries every default PM sampling metric, sampled, and the counts every
    kernel has (:data:`NEVER_ZERO`) above 0.

    Args:
        run: the run.
        kernels: role ("memory-bound") -> the kernel's stored name, None if it was not found.
    """
    what = f"each kernel carries {', '.join(DEFAULT_METRICS)} (method {SAMPLED})"
    slices, metrics = run.slices, run.metrics
    figures: dict[str, Any] = {"rows": len(metrics)}
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
            total = totals.get(METRIC_PREFIX + metric)
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
    probe = c.python("dlprof roofline --help", ["-m", "dlprof", "roofline", "--help"], allow_failure=True)
    if probe.returncode != 0:
        c.add(Part(ROOFLINE, Status.COULD_NOT_RUN, NO_ROOFLINE))
        return
    roofline = c.python("dlprof roofline", ["-m", "dlprof", "roofline", str(path), "--format", "json"],
                        allow_failure=True)
    if roofline.returncode != 0:
        c.add(Part(ROOFLINE, Status.COULD_NOT_RUN, f"dlprof roofline exited {roofline.returncode}: "
                   f"{roofline.stderr.strip()[-300:]}"))
        return
    c.add(roofline_verdicts(json.loads(roofline.stdout), kernels))


if __name__ == "__main__":
    sys.exit(main(check))
