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
    stake_basis = ("the time of those zeroing ops, summed (on a GPU run, the GPU time of the kernels "
                   "zero_grad launches): set_to_none skips them entirely")
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
        device_ns = _zero_grad_device_ns(data) if data.has_device else 0.0
        spent = data.time_spent(float(zeroing["dur_ns"].sum()), device_ns)
        evidence = evidence_of(
            zeroing.to_dict("records"), lambda r: f"{r['name']} in {r['container']}",
            lambda r: f"{r['calls']} calls, {duration(r['dur_ns'])} on the host", lambda r: r["dur_ns"])
        summary = (f"{int(zeroing['calls'].sum())} zeroing ops inside zero_grad took {duration(spent)} "
                   f"of {data.time_word}")
        return self.finding(Severity.MODERATE, spent, summary, evidence)


def _zero_grad_device_ns(data: RunData) -> float:
    """The GPU time of everything launched inside zero_grad: with ``set_to_none`` it launches nothing."""
    launched = data.device_time_under(f"name LIKE {data.run.engine.dialect.literal(ZERO_GRAD_RANGE)}")
    return float(launched["device_ns"].sum())
