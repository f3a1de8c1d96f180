"""Stragglers: in some steps one rank arrives late, and every other rank waits for it at the
next collective."""

from __future__ import annotations

from dlprof.advice.base import Finding, Need, Rule, Severity, duration, evidence_of
from dlprof.advice.data import RunData
from dlprof.analysis.ranks import DEFAULT_THRESHOLD_PCT


class Stragglers(Rule):
    name = "stragglers"
    title = "Straggling ranks hold the others back"
    needs = (Need.RANKS, Need.STEPS)
    threshold = (f"a rank's step time or collective arrival lags the ranks' median by more than "
                 f"{DEFAULT_THRESHOLD_PCT:.0f}% of the step's median time (as dlprof ranks measures)")
    stake_basis = "per step, the largest lag of a straggling rank, summed over steps: the others wait that long"
    fix = ("Find what the late rank does differently (dlprof ranks, then its timeline): uneven data "
           "(shard evenly, drop_last=True), its own data loading or logging, a slower or shared GPU "
           "or host, rank 0's extra work (checkpoints, evaluation).")
    source = "Holistic Trace Analysis, straggler detection; dlprof ranks"

    def check(self, data: RunData) -> Finding | None:
        steps = data.rank_steps
        late = steps[steps["straggler"].astype(bool)]
        if late.empty:
            return None
        lag = late[["step_lag_ns", "arrival_lag_ns"]].max(axis=1).clip(lower=0)
        late = late.assign(lag_ns=lag)
        per_step = late.groupby("step")["lag_ns"].max()
        evidence = evidence_of(
            late.to_dict("records"), lambda r: f"rank {r['rank']} {r['step']}",
            lambda r: (f"step lag {duration(r['step_lag_ns'])}, arrival lag {duration(r['arrival_lag_ns'])} "
                       f"(step median {duration(r['median_step_ns'])})"),
            lambda r: r["lag_ns"])
        summary = f"{len(late)} straggling rank-steps in {len(per_step)} steps"
        return self.finding(Severity.MODERATE, float(per_step.sum()), summary, evidence)
