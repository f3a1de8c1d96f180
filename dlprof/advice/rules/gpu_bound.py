"""GPU-bound: the GPU is busy nearly all of the steps' time and its kernels queue behind earlier
work, so the host runs ahead and only cheaper GPU work shortens the steps.

The two signs together: little idle time alone could be a host that just keeps up; queueing
alone, bursts of launches on a GPU that idles between them. Host-side fixes (more DataLoader
workers, CUDA graphs) gain nothing on such a run; the kernels that take the most GPU time are
where time is to be had. Collective kernels (NCCL, RCCL) are set apart: their time waits for the
other ranks, which no cheaper kernel shortens.
"""

from __future__ import annotations

from dlprof.advice.base import (
    EVIDENCE_PLACES,
    Finding,
    Need,
    Rule,
    Severity,
    Skip,
    duration,
    evidence_of,
    percent,
)
from dlprof.advice.data import RunData
from dlprof.analysis.tuning_rules import COLLECTIVE_KERNEL

LOW_IDLE = 0.10  # the GPU's own idle time / the steps' time
VERY_LOW_IDLE = 0.05
MOSTLY_QUEUED = 0.5  # kernels that waited behind earlier work on their stream / kernels launched


class GpuBound(Rule):
    name = "gpu-bound"
    title = "GPU-bound: the host runs ahead and kernels queue for the GPU"
    needs = (Need.DEVICE,)
    threshold = (f"the GPU idle < {LOW_IDLE:.0%} of the counted steps' time (less dlprof's pauses; high "
                 f"below {VERY_LOW_IDLE:.0%}) and >= {MOSTLY_QUEUED:.0%} of its launched kernels queued "
                 "behind earlier work on their stream")
    stake_basis = (f"the GPU time of its {EVIDENCE_PLACES} most costly kernels but collectives: the steps shorten "
                   "only as GPU work "
                   "does, and most where these do (all of their time, an upper bound; a rule that claims a "
                   "kernel's time too shares it)")
    fix = ("Make the GPU's work cheaper rather than the host's: mixed precision (torch.autocast with "
           "bfloat16 or float16) and TF32 for FP32 GEMMs so they run on tensor cores, fused kernels "
           "(torch.compile, fused optimizers), channels_last for convolutions; then tune the costliest "
           "kernels (dlprof tune, Nsight Compute). More workers or CUDA graphs will not help here.")
    source = ("NVIDIA Nsight Systems user guide, 'GPU-bound workloads'; Holistic Trace Analysis, "
              "'CUDA kernel launch statistics' and 'Queue length summary' (hta.readthedocs.io)")

    def check(self, data: RunData) -> Finding | None:
        times = data.gpu_time.groupby(["rank", "device"])[["busy_ns", "span_ns", "idle_ns"]].sum()
        waits = data.gpu_steps.assign(queued_ns=data.gpu_steps["queue_mean_ns"].fillna(0.0)
                                      * data.gpu_steps["launches"])
        waits = waits.groupby(["rank", "device"])[["launches", "queued", "queued_ns"]].sum()
        if not (waits["launches"] > 0).any():
            raise Skip("needs kernels linked to the runtime calls that launched them (correlation ids)")
        gpus = times.join(waits, how="inner")
        gpus = gpus[gpus["span_ns"] > 0]
        bound = gpus[(gpus["idle_ns"] < LOW_IDLE * gpus["span_ns"])
                     & (gpus["queued"] >= MOSTLY_QUEUED * gpus["launches"]) & (gpus["launches"] > 0)]
        if bound.empty:
            return None
        kernels = data.kernels
        collective = kernels["name"].str.contains(COLLECTIVE_KERNEL)
        rows = []
        apart: dict[str, float] = {}
        for device in bound.index.get_level_values("device"):
            on_device = kernels["device"] == device
            total = float(kernels.loc[on_device, "dur_ns"].sum())
            apart[device] = float(kernels.loc[on_device & collective, "dur_ns"].sum()) / total if total else 0.0
            top = kernels[on_device & ~collective].head(EVIDENCE_PLACES)
            rows += [{**k, "share": float(k["dur_ns"]) / total if total else 0.0} for k in top.to_dict("records")]
        evidence = evidence_of(
            rows, lambda r: f"kernel {r['name']} on {r['device']}",
            lambda r: f"{r['calls']} calls, {duration(r['dur_ns'])}, {r['share']:.1%} of the GPU's kernel time",
            lambda r: r["dur_ns"])
        described = "; ".join(
            f"rank {rank} {device} busy {percent(g['busy_ns'], g['span_ns'])} and idle "
            f"{percent(g['idle_ns'], g['span_ns'])} of the steps' time, {percent(g['queued'], g['launches'])} of its "
            f"kernels queued (mean wait {duration(g['queued_ns'] / g['launches'])})"
            + (f", collectives {apart[device]:.0%} of its kernel time" if apart[device] else "")
            for (rank, device), g in bound.iterrows())
        summary = f"{described}: the host runs ahead; only cheaper GPU work shortens the steps"
        worst = float((bound["idle_ns"] / bound["span_ns"]).min())
        severity = Severity.HIGH if worst < VERY_LOW_IDLE else Severity.MODERATE
        claims = [data.kernel_claim(r["name"], r["device"], float(r["dur_ns"])) for r in rows]
        return self.finding(severity, sum(c.ns for c in claims), summary, evidence, claims)
