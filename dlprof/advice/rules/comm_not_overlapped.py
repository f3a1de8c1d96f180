"""Communication not overlapped with compute: collectives run while nothing computes, so each
step waits for them in full."""

from __future__ import annotations

from dlprof.advice.base import Finding, Need, Rule, Severity, Skip, duration, evidence_of, percent
from dlprof.advice.data import RunData
from dlprof.analysis.ranks import summary_of

MIN_COMM_SHARE = 0.05  # of the window: less communication than this is not worth overlapping
LOW_OVERLAP = 0.5  # share of the communication time during which compute ran


class CommNotOverlapped(Rule):
    name = "comm-not-overlapped"
    title = "Communication not overlapped with compute"
    needs = (Need.RANKS,)
    threshold = (f"a rank communicating >= {MIN_COMM_SHARE:.0%} of its time with < {LOW_OVERLAP:.0%} of it "
                 "overlapped by compute (as dlprof ranks measures)")
    stake_basis = ("the exposed communication (communication - overlap) of the rank with the most: "
                   "ranks wait for each other, so the slowest one's sets the pace")
    fix = ("Let communication run under the backward pass: DistributedDataParallel overlaps its "
           "all-reduce buckets with backward (tune bucket_cap_mb, gradient_as_bucket_view=True); avoid "
           "syncs that force a collective to finish early; with FSDP, prefetch (forward_prefetch, "
           "backward_prefetch).")
    source = "Holistic Trace Analysis, 'Communication computation overlap' (hta.readthedocs.io)"

    def check(self, data: RunData) -> Finding | None:
        ranks = summary_of(data.rank_steps)
        if (ranks["comm_ns"] <= 0).all():
            raise Skip("needs communication (comm slices or collective kernels)")
        exposed = ranks.assign(exposed_ns=ranks["comm_ns"] - ranks["overlap_ns"])
        poor = exposed[(exposed["comm_pct"] >= 100 * MIN_COMM_SHARE)
                       & (exposed["overlap_ns"] < LOW_OVERLAP * exposed["comm_ns"])]
        if poor.empty:
            return None
        evidence = evidence_of(
            poor.to_dict("records"), lambda r: f"rank {r['rank']} ({r['measured_on']})",
            lambda r: (f"communication {duration(r['comm_ns'])} ({r['comm_pct']:.1f}% of its time), "
                       f"{percent(r['overlap_ns'], r['comm_ns'])} overlapped"),
            lambda r: r["exposed_ns"])
        summary = f"{len(poor)} of {len(ranks)} ranks leave most of their communication exposed"
        severity = Severity.HIGH if (poor["overlap_ns"] <= 0).all() else Severity.MODERATE
        return self.finding(severity, float(poor["exposed_ns"].max()), summary, evidence)
