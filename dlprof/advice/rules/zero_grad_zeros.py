"""``zero_grad`` writing zeros: gradients are filled with zeros (``set_to_none=False``) instead
of being dropped, which costs a memory pass per parameter and makes the next backward add to
them rather than assign."""

from __future__ import annotations

from dlprof.advice.base import Finding, Need, Rule, Severity, Skip, duration, evidence_of
from dlprof.advice.data import RunData

ZERO_GRAD_RANGE = "Optimizer.zero_grad#%"  # torch's range around Optimizer.zero_grad
ZEROING_OPS = ("aten::zero_", "aten::fill_")


class ZeroGradZeros(Rule):
    name = "zero-grad-zeros"
    title = "zero_grad writes zeros instead of dropping gradients"
    needs = (Need.OPS,)
    threshold = "any aten::zero_ or aten::fill_ inside Optimizer.zero_grad"
    stake_basis = "the time of those zeroing ops, summed: set_to_none skips them entirely"
    fix = ("Call optimizer.zero_grad(set_to_none=True) (the default since PyTorch 2.0) or "
           "model.zero_grad(set_to_none=True); code that reads .grad must then handle None.")
    source = ("PyTorch performance tuning guide, 'Use parameter.grad = None instead of "
              "model.zero_grad() or optimizer.zero_grad()'")

    def check(self, data: RunData) -> Finding | None:
        if data.named(ZERO_GRAD_RANGE).empty:
            raise Skip("needs zero_grad calls (torch's Optimizer.zero_grad# ranges)")
        inside = data.ops_inside(ZERO_GRAD_RANGE)
        zeroing = inside[inside["name"].isin(ZEROING_OPS)]
        if zeroing.empty:
            return None
        spent = float(zeroing["dur_ns"].sum())
        evidence = evidence_of(
            zeroing.to_dict("records"), lambda r: f"{r['name']} in {r['container']}",
            lambda r: f"{r['calls']} calls, {duration(r['dur_ns'])}", lambda r: r["dur_ns"])
        summary = f"{int(zeroing['calls'].sum())} zeroing ops inside zero_grad took {duration(spent)}"
        return self.finding(Severity.MODERATE, spent, summary, evidence)
