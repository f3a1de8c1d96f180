"""Accelerator utilisation low: the GPU is busy for less than half of the steps' time, so the
time goes elsewhere (the host, data loading, communication).

The GPU's time is the step report's GPU breakdown: its busy time by the part of the step that
launched the work, and its own idle time; the time it sat idle while dlprof held the program
(a save) is dlprof's, neither busy nor idle."""

from __future__ import annotations

import pandas as pd

from dlprof.advice.base import Finding, Need, Rule, Severity, duration, evidence_of, percent
from dlprof.advice.data import RunData
from dlprof.analysis.steps import StepPart
from dlprof.keys import Kind

LOW_BUSY = 0.5  # busy / window: below this the GPU waits more than it works
VERY_LOW_BUSY = 0.2
# What the host's time went to, by kind of CPU slice (self time), in words.
HOST_CATEGORIES = {
    Kind.OP: "framework ops on the CPU",
    Kind.RUNTIME: "CUDA runtime calls (launches, copies, syncs)",
    Kind.DATA_WAIT: "waiting for data",
    Kind.DATALOADER: "loading data",
    Kind.COMM: "communication",
    Kind.COMPILE: "torch.compile compiling",
    Kind.PYTHON: "Python code",
    Kind.MODULE: "Python code inside layers, outside ops",
    Kind.STEP: "Python code outside ops",
    Kind.USER_ANNOTATION: "code inside annotated ranges, outside ops",
    Kind.REGION: "code inside regions, outside ops",
}
# The parts of a step whose launches kept the GPU busy, in the breakdown's order.
_LAUNCHING_PARTS = [p for p in StepPart if p is not StepPart.PROFILER]


class LowUtilisation(Rule):
    name = "low-utilisation"
    title = "Accelerator utilisation low"
    needs = (Need.DEVICE,)
    threshold = (f"GPU busy time / window < {LOW_BUSY:.0%} (high below {VERY_LOW_BUSY:.0%}); the "
                 "window is the counted steps' time less dlprof's pauses, as dlprof steps' GPU breakdown "
                 "gives it, or the GPU's whole span in a run without steps")
    stake_basis = "the GPU's own idle time in those windows: the most a busier GPU could gain"
    fix = ("Find what the host does meanwhile (the largest category below; dlprof steps and dlprof "
           "top --kind op): feed data ahead of the loop, batch small ops, remove host syncs, or "
           "raise the batch size so each launch does more work.")
    source = "Holistic Trace Analysis, 'Temporal breakdown' and 'Idle time breakdown' (hta.readthedocs.io)"

    def check(self, data: RunData) -> Finding | None:
        windows = data.gpu_time
        per_device = windows.groupby(["rank", "device"])[["busy_ns", "span_ns", "idle_ns"]].sum()
        low = per_device[per_device["busy_ns"] < LOW_BUSY * per_device["span_ns"]]
        if low.empty:
            return None
        worst = float((low["busy_ns"] / low["span_ns"]).min())
        idle = float(low["idle_ns"].sum())
        low_keys = set(low.index)
        rows = [r for r in windows.to_dict("records") if (r["rank"], r["device"]) in low_keys]
        evidence = evidence_of(
            rows, lambda r: f"rank {r['rank']} {r['device']} {r['step']}",
            lambda r: f"busy {duration(r['busy_ns'])} of {duration(r['span_ns'])} ({percent(r['busy_ns'], r['span_ns'])})",
            lambda r: r["idle_ns"])
        by_part = windows.groupby(["rank", "device"])[[f"{p}_ns" for p in _LAUNCHING_PARTS]].sum()
        devices = ", ".join(f"rank {r} {d} {percent(b, s)}{_launched_by(by_part.loc[(r, d)])}" for (r, d), b, s in
                            zip(low.index, low["busy_ns"], low["span_ns"], strict=True))
        summary = f"GPU busy {devices}; the host's largest category: {largest_host_category(data)}"
        severity = Severity.HIGH if worst < VERY_LOW_BUSY else Severity.MODERATE
        claims = [data.idle_claim(rank, device, float(ns)) for (rank, device), ns in low["idle_ns"].items()]
        return self.finding(severity, idle, summary, evidence, claims)


def _launched_by(times: pd.Series) -> str:
    """`` (launched in backward 52%, forward 37%...)``: the parts of the step whose work kept the
    GPU busy, largest first; nothing where all of it is other's (a run without steps)."""
    spent = sorted(((part, float(times[f"{part}_ns"])) for part in _LAUNCHING_PARTS), key=lambda item: -item[1])
    busy = sum(ns for _, ns in spent)
    if busy <= 0 or all(part is StepPart.OTHER for part, ns in spent if ns > 0):
        return ""
    shares = ", ".join(f"{str(part).replace('_', ' ')} {100 * ns / busy:.0f}%" for part, ns in spent if ns > 0)
    return f" (launched in {shares})"


def largest_host_category(data: RunData) -> str:
    """The kind of CPU slice with the most self time in the steady state, in words, with its time.

    The steady state is the counted steps, from the first one's start to the last one's end on
    each rank: the warm-up step holds the program's set-up (building the model, the first
    CUDA calls), which no change to the training loop removes. A run without counted steps is
    read whole.
    """
    kinds = data.run.engine.dialect.literals(tuple(HOST_CATEGORIES))
    rows = data.run.query(
        "SELECT kind, CAST(sum(self_ns) AS BIGINT) AS spent FROM slices WHERE device = 'cpu' "
        f"AND kind IN {kinds}{data.where()}{_steady(data)} GROUP BY kind ORDER BY spent DESC LIMIT 1").rows
    if not rows:
        return "none recorded"
    kind, spent = rows[0]
    within = " in the counted steps" if not data.counted_steps.empty else ""
    return f"{HOST_CATEGORIES[Kind(kind)]} ({duration(float(spent or 0))} self time{within})"


def _steady(data: RunData) -> str:
    """A condition keeping the slices that start within each rank's counted steps."""
    steps = data.counted_steps
    if steps.empty:
        return ""
    ends = steps.assign(end_ns=steps["start_ns"] + steps["dur_ns"]).groupby("rank").agg(
        first=("start_ns", "min"), last=("end_ns", "max"))
    windows = " OR ".join(f"(rank = {int(rank)} AND start_ns >= {int(r.first)} AND start_ns < {int(r.last)})"
                          for rank, r in ends.iterrows())
    return f" AND ({windows})"
