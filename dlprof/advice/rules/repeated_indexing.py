"""Repeated indexing in a Python loop: many small indexing ops called straight from Python in
every step, as a loop over a tensor's elements makes them. Off by default: some programs index
on purpose, and the count alone cannot tell a loop from a model with many inputs."""

from __future__ import annotations

from dlprof.advice.base import Finding, Need, Rule, Severity, duration, evidence_of
from dlprof.advice.data import RunData
from dlprof.keys import Kind

INDEXING = ("aten::select", "aten::index", "aten::slice", "aten::item", "aten::index_put_", "aten::__getitem__")
CALLS_PER_STEP = 100  # outermost indexing ops per step: more than a model's layers make


class RepeatedIndexing(Rule):
    name = "repeated-indexing"
    title = "Repeated indexing in a Python loop"
    needs = (Need.OPS, Need.STEPS)
    threshold = f">= {CALLS_PER_STEP} indexing ops per step called from Python (no op around them)"
    stake_basis = ("those ops' host time, on a GPU run too: indexing makes views and launches little, and "
                   "the loop holds the host; one vectorised op (a mask, gather, index_select) replaces it")
    fix = ("Replace the loop with one tensor operation: boolean masks, torch.gather, index_select, "
           "torch.where; read scalars once with .tolist() instead of .item() per element.")
    source = "PyTorch performance tuning guide; NumPy and PyTorch vectorisation practice"
    on_by_default = False

    def check(self, data: RunData) -> Finding | None:
        names = data.run.engine.dialect.literals(INDEXING)
        ops = data.run.sql(
            "SELECT o.name, count(*) AS calls, CAST(sum(o.dur_ns) AS BIGINT) AS dur_ns FROM slices o "
            "LEFT JOIN slices p ON p.rank = o.rank AND p.id = o.parent_id "
            f"WHERE o.kind = '{Kind.OP}' AND o.name IN {names} AND (p.kind IS NULL OR p.kind <> '{Kind.OP}')"
            f"{data.where('o.rank')} GROUP BY o.name")
        steps = len(data.steps.steps)
        looped = ops[ops["calls"] >= CALLS_PER_STEP * steps]
        if looped.empty:
            return None
        spent = float(looped["dur_ns"].sum())
        evidence = evidence_of(
            looped.to_dict("records"), lambda r: str(r["name"]),
            lambda r: f"{r['calls'] / steps:.0f} calls per step, {duration(r['dur_ns'])} in all", lambda r: r["dur_ns"])
        summary = f"{int(looped['calls'].sum())} indexing ops from Python over {steps} steps took {duration(spent)}"
        return self.finding(Severity.MODERATE, spent, summary, evidence)
