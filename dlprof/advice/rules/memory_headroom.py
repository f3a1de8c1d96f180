"""Memory far below the device's: the program's peak uses a small part of the GPU's memory, so
a larger batch (or a larger model) would fit and amortise each step's fixed costs."""

from __future__ import annotations

from dlprof.advice.base import Finding, Need, Rule, Severity, Skip, duration, evidence_of, percent
from dlprof.advice.data import RunData
from dlprof.analysis.memory import memory_peaks

LOW_SHARE = 0.25  # peak allocated / the device's memory


class MemoryHeadroom(Rule):
    name = "memory-headroom"
    title = "GPU memory far below the device's: room for a larger batch"
    needs = (Need.DEVICE, Need.MEMORY, Need.DEVICE_PROPERTIES)
    threshold = f"peak allocated memory < {LOW_SHARE:.0%} of the GPU's memory"
    stake_basis = ("the GPU's own idle time in the counted steps (dlprof's pauses left out): a larger batch "
                   "fills it with work, at most "
                   "all of it (an upper bound); the same time low utilisation claims, so only one of them "
                   "counts it")
    fix = ("Raise the batch size until the peak nears the device's memory (scale the learning rate "
           "with it), or pack more work per step (longer sequences, several micro-batches at once).")
    source = "PyTorch performance tuning guide; NVIDIA Deep Learning Performance guide, 'Batch size'"

    def check(self, data: RunData) -> Finding | None:
        peaks = memory_peaks(data.run, data.rank)
        peaks = peaks[peaks["device"].astype(str).str.startswith("cuda")]
        totals = {device: float(p.get("totalGlobalMem") or 0) for device, p in data.devices.items()}
        peaks = peaks.assign(total=peaks["device"].map(totals).fillna(0.0))
        peaks = peaks[peaks["total"] > 0]
        if peaks.empty:
            raise Skip("needs memory records of a GPU whose memory size the run records")
        low = peaks[peaks["peak_bytes"] < LOW_SHARE * peaks["total"]]
        if low.empty:
            return None
        idle = [data.gpu_idle.get((int(rank), str(device)), 0.0) for rank, device in zip(low["rank"], low["device"],
                                                                                          strict=True)]
        rows = low.assign(idle_ns=idle).to_dict("records")
        evidence = evidence_of(
            rows, lambda r: f"rank {r['rank']} {r['device']}",
            lambda r: (f"peak {r['peak_bytes'] / 2**30:.2f} GiB of {r['total'] / 2**30:.1f} GiB "
                       f"({percent(r['peak_bytes'], r['total'])}); GPU idle {duration(r['idle_ns'])}"),
            lambda r: r["idle_ns"])
        summary = f"{len(low)} GPU(s) peak below {LOW_SHARE:.0%} of their memory"
        claims = [data.idle_claim(r["rank"], r["device"], r["idle_ns"]) for r in rows]
        return self.finding(Severity.MODERATE, sum(c.ns for c in claims), summary, evidence, claims)
