"""Single-tensor optimizer: the optimizer updates parameters one tensor at a time (torch's
``_single_tensor_adam`` and kin) rather than with its multi-tensor (foreach) or fused kernels."""

from __future__ import annotations

from dlprof.advice.base import Finding, Need, Rule, Severity, Skip, duration, evidence_of
from dlprof.advice.data import RunData

STEP_RANGE = "Optimizer.step#%"  # torch's range around every optimizer step
BATCHED = ("_foreach_", "_fused_")  # the ops of a multi-tensor or fused implementation
FUSED = "Fused"  # in the class name of an optimizer with its own fused kernels (apex's FusedAdam)
MIN_OPS_PER_STEP = 4  # fewer per-tensor ops than this in a step is no loop over parameters
EXPECTED_SAVING = 0.5  # assumed share of the optimizer's time foreach saves


class SingleTensorOptimizer(Rule):
    name = "single-tensor-optimizer"
    title = "Optimizer updates one tensor at a time"
    needs = (Need.OPS,)
    threshold = (f"an optimizer step runs no _foreach_ or _fused_ op and at least {MIN_OPS_PER_STEP} "
                 "per-tensor ops (or a _single_tensor_ function is recorded)")
    stake_basis = (f"the optimizer steps' time (on a GPU run, the GPU time of their kernels) x "
                   f"{EXPECTED_SAVING:.0%}, an assumed saving: foreach launches one op per group of tensors "
                   "instead of one per tensor")
    fix = ("Use the multi-tensor implementation: torch.optim.Adam(params, foreach=True), or "
           "fused=True on the GPU; do not pass foreach=False, and keep parameters on one device "
           "and dtype so that torch chooses foreach by itself.")
    source = ("PyTorch torch.optim documentation, 'Algorithms: foreach and fused implementations' "
              "(pytorch.org/docs/stable/optim.html)")

    def check(self, data: RunData) -> Finding | None:
        steps = data.named(STEP_RANGE)
        if steps.empty:
            raise Skip("needs optimizer steps (torch's Optimizer.step# ranges)")
        inside = data.ops_inside(STEP_RANGE)
        single = data.named("%_single_tensor_%")
        flagged = []
        for row in steps.to_dict("records"):
            ops = inside[inside["container"] == row["name"]]
            batched = FUSED in str(row["name"]) or ops["name"].str.contains("|".join(BATCHED), regex=True).any()
            top = ops[ops["depth"] == ops["depth"].min()] if not ops.empty else ops
            per_step = top["calls"].sum() / row["calls"]
            if (not batched and per_step >= MIN_OPS_PER_STEP) or not single.empty:
                flagged.append({**row, "per_step": per_step,
                                "top_op": str(top["name"].iloc[0]) if not top.empty else "(no op)"})
        if not flagged:
            return None
        device = _device_time(data) if data.has_device else {}
        for row in flagged:
            row["spent_ns"] = data.time_spent(row["dur_ns"], device.get(row["name"], 0.0))
        spent = sum(float(r["spent_ns"]) for r in flagged)
        evidence = evidence_of(
            flagged, lambda r: str(r["name"]),
            lambda r: (f"{r['calls']} steps, {duration(r['spent_ns'] / r['calls'])} of {data.time_word} each, "
                       f"{r['per_step']:.0f} ops per step (most time: {r['top_op']})"),
            lambda r: r["spent_ns"] * EXPECTED_SAVING)
        summary = (f"{len(flagged)} optimizer(s) update tensor by tensor; their steps take {duration(spent)} "
                   f"of {data.time_word}")
        return self.finding(Severity.MODERATE, spent * EXPECTED_SAVING, summary, evidence)


def _device_time(data: RunData) -> dict[str, float]:
    """The GPU time of the kernels each optimizer's steps launched, by the step range's name."""
    launched = data.device_time_under(f"name LIKE {data.run.engine.dialect.literal(STEP_RANGE)}")
    return {str(k): float(v) for k, v in launched.groupby("op")["device_ns"].sum().items()}
