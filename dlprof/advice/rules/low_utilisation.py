"""Accelerator utilisation low: the GPU is busy for less than half of the steps' time, so the
time goes elsewhere (the host, data loading, communication)."""

from __future__ import annotations

from dlprof.advice.base import Finding, Need, Rule, Severity, duration, evidence_of, percent
from dlprof.advice.data import RunData
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
    Kind.PYTHON: "Python code",
    Kind.MODULE: "Python code inside layers, outside ops",
    Kind.STEP: "Python code outside ops",
    Kind.USER_ANNOTATION: "code inside annotated ranges, outside ops",
    Kind.REGION: "code inside regions, outside ops",
}


class LowUtilisation(Rule):
    name = "low-utilisation"
    title = "Accelerator utilisation low"
    needs = (Need.DEVICE,)
    threshold = (f"GPU busy time / window < {LOW_BUSY:.0%} (high below {VERY_LOW_BUSY:.0%}); the "
                 "window is each counted step's, as dlprof gpu draws it, or the GPU's whole span")
    stake_basis = "the GPU's idle time in those windows: the most a busier GPU could gain"
    fix = ("Find what the host does meanwhile (the largest category below; dlprof steps and dlprof "
           "top --kind op): feed data ahead of the loop, batch small ops, remove host syncs, or "
           "raise the batch size so each launch does more work.")
    source = "Holistic Trace Analysis, 'Temporal breakdown' and 'Idle time breakdown' (hta.readthedocs.io)"

    def check(self, data: RunData) -> Finding | None:
        windows = data.gpu_steps
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
        devices = ", ".join(f"rank {r} {d} {percent(b, s)}" for (r, d), b, s in
                            zip(low.index, low["busy_ns"], low["span_ns"], strict=True))
        summary = f"GPU busy {devices}; the host's largest category: {largest_host_category(data)}"
        severity = Severity.HIGH if worst < VERY_LOW_BUSY else Severity.MODERATE
        return self.finding(severity, idle, summary, evidence)


def largest_host_category(data: RunData) -> str:
    """The kind of CPU slice with the most self time, in words, with its time."""
    kinds = data.run.engine.dialect.literals(tuple(HOST_CATEGORIES))
    rows = data.run.query(
        "SELECT kind, CAST(sum(self_ns) AS BIGINT) AS spent FROM slices WHERE device = 'cpu' "
        f"AND kind IN {kinds}{data.where()} GROUP BY kind ORDER BY spent DESC LIMIT 1").rows
    if not rows:
        return "none recorded"
    kind, spent = rows[0]
    return f"{HOST_CATEGORIES[Kind(kind)]} ({duration(float(spent or 0))} self time)"
