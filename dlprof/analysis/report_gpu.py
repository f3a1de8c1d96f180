"""What the report opens with on a GPU run: how busy each GPU was, step by step, with what, the
kernels that took its time, and the top advice.

    overview = gpu_overview(run)       # {"devices": ..., "steps": ..., "kernels": ..., "reason": ""}
    findings = top_advice(run)         # {"findings": [...], "skipped": 3, "reason": ""}

Pure: plain values for :func:`dlprof.analysis.report_data.report_data`, nothing printed. Times
are nanoseconds; the page formats them.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from dlprof.advice.ranking import advise
from dlprof.analysis.aggregate import has_device_activity
from dlprof.analysis.gpu import ALL, gpu_breakdown
from dlprof.analysis.steps import StepStatus, flagged_steps_sql
from dlprof.engine.base import EngineError
from dlprof.keys import Kind
from dlprof.store.reader import Run

NO_GPU = "the run recorded no GPU activity (kernels, copies, memsets)"
STEP_COLUMNS = ["rank", "device", "step", "status", "span_ns", "kernel_ns", "copy_ns", "idle_ns", "busy_pct"]
DEVICE_COLUMNS = ["rank", "device", "window", "span_ns", "kernel_ns", "copy_ns", "idle_ns", "busy_pct"]
KERNEL_COLUMNS = ["name", "device", "calls", "gpu_ns", "kernel_pct"]


def gpu_overview(run: Run, kernels: int = 10) -> dict[str, Any]:
    """Each GPU's busy time with what (kernels, copies and memsets) and idle, over the counted
    steps and step by step, and the kernels with most GPU time.

    Args:
        run: the run.
        kernels: the kernels to list.

    Returns:
        ``devices`` (one row per GPU over its counted steps, or its whole span without steps),
        ``steps`` (one row per GPU and step, warm-up and partial ones marked), ``kernels`` (the
        top ``kernels`` by GPU time, their share of all kernel time), each as ``columns`` and
        ``rows``; ``reason`` says why they are empty.
    """
    empty: dict[str, list[Any]] = {"columns": [], "rows": []}
    if not has_device_activity(run):
        return {"devices": empty, "steps": empty, "kernels": empty, "reason": NO_GPU}
    breakdown = gpu_breakdown(run)
    if breakdown.empty:
        return {"devices": empty, "steps": empty, "kernels": empty, "reason": NO_GPU}
    # Only each step's status: the steps' own query, not the whole step report with its sweeps.
    flagged = run.sql(f"SELECT rank, step, status FROM ({flagged_steps_sql(run)}) AS f")
    statuses = {(int(r), str(s)): str(t) for r, s, t in flagged.itertuples(index=False, name=None)}
    table = breakdown.assign(copy_ns=breakdown["memcpy_ns"] + breakdown["memset_ns"],
                             status=[statuses.get((int(r), str(s)), "") if s != ALL else ""
                                     for r, s in zip(breakdown["rank"], breakdown["step"], strict=True)])
    steps = table[table["step"] != ALL]
    counted = steps[steps["status"] == StepStatus.COUNTED]
    return {"devices": _records(_per_device(table, counted), DEVICE_COLUMNS),
            "steps": _records(steps, STEP_COLUMNS), "kernels": _top_kernels(run, kernels), "reason": ""}


def _per_device(table: pd.DataFrame, counted: pd.DataFrame) -> pd.DataFrame:
    """Per GPU, its counted steps summed, or its whole-run row where it has none."""
    rows = []
    for (rank, device), whole in table[table["step"] == ALL].groupby(["rank", "device"], sort=True):
        own = counted[(counted["rank"] == rank) & (counted["device"] == device)]
        part = own if not own.empty else whole
        span, busy = float(part["span_ns"].sum()), float(part["busy_ns"].sum())
        rows.append({"rank": int(rank), "device": str(device),
                     "window": f"{len(own)} counted steps" if not own.empty else "the whole run",
                     "span_ns": span, "kernel_ns": float(part["kernel_ns"].sum()),
                     "copy_ns": float(part["copy_ns"].sum()), "idle_ns": float(part["idle_ns"].sum()),
                     "busy_pct": 100.0 * busy / span if span else 0.0})
    return pd.DataFrame(rows, columns=DEVICE_COLUMNS)


def _top_kernels(run: Run, limit: int) -> dict[str, Any]:
    top = run.sql(
        "SELECT name, device, count(*) AS calls, CAST(sum(dur_ns) AS BIGINT) AS gpu_ns, "
        "100.0 * sum(dur_ns) / sum(sum(dur_ns)) OVER () AS kernel_pct FROM slices "
        f"WHERE kind = '{Kind.KERNEL}' GROUP BY name, device ORDER BY gpu_ns DESC, name LIMIT {int(limit)}")
    return _records(top, KERNEL_COLUMNS)


def top_advice(run: Run, findings: int = 5) -> dict[str, Any]:
    """The advice's top findings, as ``dlprof advise`` ranks them.

    Returns:
        ``findings`` (rule, title, severity, stake_ns, shared_ns, shared_with, summary, evidence
        as place and detail), ``skipped`` (how many rules could not judge the run) and ``reason``
        (why there is no advice, where the analyses failed).
    """
    try:
        found = advise(run)
    except (EngineError, ValueError) as error:
        return {"findings": [], "skipped": 0, "reason": f"the advice could not be computed: {error}"}
    shown = [{"rule": f.rule, "title": f.title, "severity": str(f.severity), "stake_ns": float(f.stake_ns),
              "shared_ns": float(f.shared_ns), "shared_with": list(f.shared_with), "summary": f.summary,
              "fix": f.fix, "evidence": [{"place": e.place, "detail": e.detail} for e in f.evidence]}
             for f in found.findings[:findings]]
    reason = "" if found.findings else f"no rule found anything to change ({len(found.passed)} rules judged the run)"
    return {"findings": shown, "total": len(found.findings), "skipped": len(found.skipped), "reason": reason}


def _records(frame: pd.DataFrame, columns: list[str]) -> dict[str, Any]:
    rows = [[_plain(v) for v in row] for row in frame[columns].itertuples(index=False, name=None)]
    return {"columns": columns, "rows": rows}


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and value != value:
        return None
    return value
