"""Input-bound: the training loop waits for its next batch for a large part of each step."""

from __future__ import annotations

from dlprof.advice.base import Finding, Need, Rule, Severity, duration, evidence_of, percent
from dlprof.advice.data import RunData

HIGH_SHARE = 0.20  # of the step time spent waiting for data: the input pipeline sets the pace
MODERATE_SHARE = 0.05  # worth a look: a worker or prefetching usually removes it


class InputBound(Rule):
    name = "input-bound"
    title = "Input-bound: steps wait for the next batch"
    needs = (Need.STEPS,)
    threshold = (f"data wait >= {HIGH_SHARE:.0%} of the step time (less dlprof's pauses): high; "
                 f"{MODERATE_SHARE:.0%} to {HIGH_SHARE:.0%}: moderate")
    stake_basis = "the data wait of the counted steps, summed: all of it is gained if batches are ready in time"
    fix = ("Load batches ahead of the loop: DataLoader(num_workers=N, pin_memory=True, "
           "prefetch_factor=2, persistent_workers=True); move decoding and augmentation into the "
           "workers or onto the GPU; cache a small dataset in memory.")
    source = ("PyTorch performance tuning guide, 'Enable asynchronous data loading and augmentation' "
              "(pytorch.org/tutorials/recipes/recipes/tuning_guide.html)")

    def check(self, data: RunData) -> Finding | None:
        steps = data.counted_steps
        wait, total = float(steps["data_wait_ns"].sum()), float(steps["user_ns"].sum())
        share = wait / total if total else 0.0
        if share < MODERATE_SHARE:
            return None
        severity = Severity.HIGH if share >= HIGH_SHARE else Severity.MODERATE
        rows = steps.to_dict("records")
        evidence = evidence_of(
            rows, lambda s: f"rank {s['rank']} {s['step']}",
            lambda s: f"waited {duration(s['data_wait_ns'])} of {duration(s['user_ns'])} "
                      f"({percent(s['data_wait_ns'], s['user_ns'])})",
            lambda s: s["data_wait_ns"])
        summary = (f"data wait is {share:.1%} of the time of {len(steps)} counted steps "
                   f"({duration(wait)} of {duration(total)})")
        return self.finding(severity, wait, summary, evidence)
