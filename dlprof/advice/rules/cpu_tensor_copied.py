"""Tensors made on the CPU then copied to the GPU: host-to-device copies from pageable memory,
each staged through a pinned buffer and synchronous with the host."""

from __future__ import annotations

from dlprof.advice.base import Finding, Need, Rule, Severity, duration, evidence_of, percent
from dlprof.advice.data import RunData
from dlprof.keys import Kind

PAGEABLE_TO_DEVICE = "Memcpy HtoD (Pageable%"  # CUPTI's name for such a copy
MIN_SHARE = 0.01  # of the GPUs' busy time


class CpuTensorCopied(Rule):
    name = "cpu-tensor-copied"
    title = "Tensors made on the CPU, then copied to the GPU"
    needs = (Need.DEVICE,)
    threshold = f"host-to-device copies from pageable memory taking >= {MIN_SHARE:.0%} of the GPUs' busy time"
    stake_basis = "those copies' device time: a tensor made on the GPU needs none, a pinned one overlaps"
    fix = ("Create tensors where they are used (torch.zeros(..., device='cuda'), torch.randn(..., "
           "device=...)); for data that must come from the host, pin it (DataLoader(pin_memory=True) "
           "or tensor.pin_memory()) and copy with .to(device, non_blocking=True).")
    source = ("PyTorch performance tuning guide, 'Create tensors directly on the target device' "
              "and 'Use pinned memory'; CUDA C++ Best Practices Guide, 'Pinned Memory'")

    def check(self, data: RunData) -> Finding | None:
        copies = data.named(PAGEABLE_TO_DEVICE, Kind.MEMCPY)
        spent = float(copies["dur_ns"].sum())
        busy = float(data.gpu[data.gpu["step"] == "all"]["busy_ns"].sum())
        if copies.empty or spent < MIN_SHARE * busy:
            return None
        launched = data.launched_kernels(("aten::to", "aten::copy_", "aten::_to_copy"))
        launched = launched[launched["kernel"].isin(set(copies["name"]))]
        source_rows = launched.to_dict("records") if not launched.empty else copies.assign(op="(no op linked)",
                                                                                            kernel=copies["name"]).to_dict("records")
        evidence = evidence_of(
            source_rows, lambda r: f"{r['op']}: {r['kernel']}",
            lambda r: f"{r['calls']} copies, {duration(r['dur_ns'])} on the device", lambda r: r["dur_ns"])
        summary = (f"{int(copies['calls'].sum())} pageable host-to-device copies took {duration(spent)}, "
                   f"{percent(spent, busy)} of the GPUs' busy time")
        return self.finding(Severity.MODERATE, spent, summary, evidence)
