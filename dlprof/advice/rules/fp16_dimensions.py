"""Half-precision matrix multiplications whose dimensions are not multiples of 8: tensor cores
work on tiles of 8 (FP16, BF16), so such GEMMs pad or fall back to slower kernels.

On a GPU run the time at stake is the GPU time of the GEMM kernels those ops launch (a
vocabulary of 50257 words makes cuBLAS fall back to CUTLASS's ``align1`` kernels, a few times
slower than the aligned ones), not the ops' host time; the summary says what the run's aligned
GEMMs of the same precision achieve, and so about what padding gains.
"""

from __future__ import annotations

import json
import re

import pandas as pd

from dlprof.advice.base import Finding, Need, Rule, Severity, Skip, duration, evidence_of, percent
from dlprof.advice.data import RunData
from dlprof.keys import Kind

MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::linear", "aten::matmul")
HALF = ("c10::Half", "c10::BFloat16", "Half", "BFloat16")  # how torch.profiler names the dtypes
MULTIPLE = 8
EXPECTED_SAVING = 0.3  # assumed on a CPU run: aligned shapes run on full tiles
HIGH_SHARE = 0.2  # of all kernel time: the misaligned GEMMs set the pace
# CUTLASS names its kernels' operand alignment in elements: align1, align2, align4 are the
# fallbacks for leading dimensions off a multiple of 8 half-precision elements.
_ALIGNMENT = re.compile(r"_align([124])\b")


class Fp16Dimensions(Rule):
    name = "fp16-dimensions"
    title = "Half-precision matrix multiplications with dimensions not multiples of 8"
    needs = (Need.OPS, Need.SHAPES)
    threshold = f"an FP16 or BF16 matrix multiplication with a matrix dimension not a multiple of {MULTIPLE}"
    stake_basis = ("on a GPU run, the GPU time of the GEMM kernels those ops launch (all of it: padded "
                   "GEMMs run on full tiles, at the throughput the summary gives, an upper bound); on a "
                   f"CPU run, those ops' time x {EXPECTED_SAVING:.0%}, an assumed saving")
    fix = (f"Pad the dimensions to multiples of {MULTIPLE} (vocabulary, hidden and batch sizes): "
           "e.g. a vocabulary of 50257 to 50304; choose layer widths that are.")
    source = ("NVIDIA Deep Learning Performance guide, 'Tensor Core Requirements' "
              "(docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication)")

    def check(self, data: RunData) -> Finding | None:
        names = data.run.engine.dialect.literals(MATMULS)
        ops = data.run.sql(
            "SELECT name, input_shapes, input_dtypes, count(*) AS calls, CAST(sum(dur_ns) AS BIGINT) AS dur_ns, "
            f"sum(flops) AS flops FROM slices WHERE kind = '{Kind.OP}' AND name IN {names}{data.where()} "
            "GROUP BY name, input_shapes, input_dtypes")
        half = ops[ops["input_dtypes"].map(lambda d: any(h in str(d) for h in HALF))]
        if half.empty:
            raise Skip("needs FP16 or BF16 matrix multiplications")
        half = half.assign(misaligned=half["input_shapes"].map(_misaligned))
        odd = half[half["misaligned"]]
        if odd.empty:
            return None
        if data.has_device:
            return self._on_gpu(data, half)
        spent = float(odd["dur_ns"].sum())
        evidence = evidence_of(
            odd.to_dict("records"), lambda r: f"{r['name']} {r['input_shapes']}",
            lambda r: f"{r['calls']} calls, {duration(r['dur_ns'])}", lambda r: r["dur_ns"] * EXPECTED_SAVING)
        summary = (f"{int(odd['calls'].sum())} half-precision matrix multiplications have a dimension not a "
                   f"multiple of {MULTIPLE} ({duration(spent)})")
        return self.finding(Severity.MODERATE, spent * EXPECTED_SAVING, summary, evidence)

    def _on_gpu(self, data: RunData, half: pd.DataFrame) -> Finding | None:
        """The GEMM kernels the misaligned ops launched, and their GPU time."""
        launched = data.device_time_under(f"kind = '{Kind.OP}' AND name IN {data.run.engine.dialect.literals(MATMULS)}")
        gemms = launched[launched["kind"] == Kind.KERNEL]  # not the memsets some GEMMs launch
        signature = ["op", "input_shapes", "input_dtypes"]
        ops = half.rename(columns={"name": "op"})[[*signature, "misaligned", "flops"]]
        gemms = gemms.merge(ops, on=signature, how="inner")
        slowed = gemms[gemms["misaligned"]]
        if slowed.empty:
            return None
        spent = float(slowed["device_ns"].sum())
        all_kernels = float(data.kernels["dur_ns"].sum())
        evidence = evidence_of(
            slowed.to_dict("records"), lambda r: f"{r['op']} {r['input_shapes']}",
            lambda r: (f"{r['launches']} launches of {_kernel_words(str(r['kernel']))}, "
                       f"{duration(r['device_ns'])} of GPU time"),
            lambda r: r["device_ns"])
        summary = (f"{int(slowed['launches'].sum())} half-precision GEMM kernels launched by matrix "
                   f"multiplications with a dimension not a multiple of {MULTIPLE} take {duration(spent)} of "
                   f"GPU time, {percent(spent, all_kernels)} of all kernel time"
                   f"{_throughputs(gemms)}")
        claims = [data.kernel_claim(str(r["kernel"]), str(r["device"]), float(r["device_ns"]))
                  for r in slowed.to_dict("records")]
        severity = Severity.HIGH if spent >= HIGH_SHARE * all_kernels else Severity.MODERATE
        return self.finding(severity, spent, summary, evidence, claims)


def _kernel_words(kernel: str) -> str:
    """A kernel named for the evidence: its alignment when CUTLASS names it."""
    found = _ALIGNMENT.search(kernel)
    tail = f" (CUTLASS align{found.group(1)}: operands not 16-byte aligned)" if found else ""
    return f"{kernel}{tail}"


def _throughputs(gemms: pd.DataFrame) -> str:
    """What the misaligned GEMMs achieve against the run's aligned ones, and the time padding
    would give at the aligned ones' throughput; empty where the ops carry no FLOPs."""
    rates = {}
    for misaligned, part in gemms.groupby("misaligned"):
        # Each op's FLOPs once per signature, against all its kernels' time.
        flops = float(part.drop_duplicates(["op", "input_shapes", "input_dtypes"])["flops"].fillna(0).sum())
        time = float(part["device_ns"].sum())
        if flops > 0 and time > 0:
            rates[bool(misaligned)] = (flops, time)
    if True not in rates or False not in rates:
        return ""
    (odd_flops, odd_ns), (even_flops, even_ns) = rates[True], rates[False]
    odd_rate, even_rate = odd_flops / odd_ns, even_flops / even_ns
    padded = odd_flops / even_rate
    return (f"; they run at {odd_rate / 1e3:.0f} TFLOP/s where the run's aligned ones reach "
            f"{even_rate / 1e3:.0f} TFLOP/s: padded, about {duration(padded)} instead of {duration(odd_ns)}")


def _misaligned(shapes: object) -> bool:
    """Whether any matrix input (two or more dimensions) has one of its last two dimensions off
    the multiple."""
    try:
        parsed = json.loads(str(shapes))
    except ValueError:
        return False
    matrices = [s for s in parsed if isinstance(s, list) and len(s) >= 2] if isinstance(parsed, list) else []
    return any(int(d) % MULTIPLE for s in matrices for d in s[-2:])
