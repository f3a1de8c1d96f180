"""Unsteady steps: step times vary widely, so something intermittent (a sync, a GC pause, a
slow batch, a checkpoint) holds some steps back.

A step's time is the user's: its duration less dlprof's own pauses (a save inside a step is
dlprof's, never an uneven step of the program's)."""

from __future__ import annotations

from dlprof.advice.base import Finding, Need, Rule, Severity, Skip, duration, evidence_of
from dlprof.advice.data import RunData

HIGH_VARIATION = 0.30  # coefficient of variation (std / mean) of the counted steps' times
MODERATE_VARIATION = 0.15
MIN_STEPS = 3  # fewer steps give no meaningful spread


class UnsteadySteps(Rule):
    name = "unsteady-steps"
    title = "Unsteady step times"
    needs = (Need.STEPS,)
    threshold = (f"coefficient of variation (std / mean) of the counted steps' times (less dlprof's pauses) "
                 f">= {HIGH_VARIATION}: "
                 f"high; {MODERATE_VARIATION} to {HIGH_VARIATION}: moderate; at least {MIN_STEPS} steps")
    stake_basis = "each counted step's time above the median step, summed: what the slow steps cost over a typical one"
    fix = ("Compare a slow step with a typical one (dlprof steps RUN -n 0, then the timeline): look for "
           "host synchronisations (.item(), .cpu(), printing losses), garbage collection, uneven batches, "
           "logging or checkpoints inside some steps, and other processes sharing the machine.")
    source = "dlprof's step statistics; the coefficient of variation as a measure of jitter"

    def check(self, data: RunData) -> Finding | None:
        steps = data.counted_steps
        for rank, of_rank in steps.groupby("rank"):
            if len(of_rank) < MIN_STEPS:
                raise Skip(f"needs at least {MIN_STEPS} counted steps (rank {rank} has {len(of_rank)})")
        median = steps.groupby("rank")["user_ns"].transform("median")
        spread = steps.groupby("rank")["user_ns"].agg(["mean", "std"])
        variation = spread["std"] / spread["mean"]
        worst_rank = variation.idxmax()
        worst = float(variation.max())
        if worst < MODERATE_VARIATION:
            return None
        excess = (steps["user_ns"] - median).clip(lower=0)
        slow = steps.assign(median_ns=median, excess_ns=excess)
        rows = slow[slow["excess_ns"] > 0].to_dict("records")
        evidence = evidence_of(
            rows, lambda s: f"rank {s['rank']} {s['step']}",
            lambda s: f"{duration(s['user_ns'])} against a median of {duration(s['median_ns'])}",
            lambda s: s["excess_ns"])
        severity = Severity.HIGH if worst >= HIGH_VARIATION else Severity.MODERATE
        summary = (f"step times vary by {worst:.2f} (std / mean) on rank {worst_rank}, over "
                   f"{len(steps)} counted steps")
        return self.finding(severity, float(excess.sum()), summary, evidence)
