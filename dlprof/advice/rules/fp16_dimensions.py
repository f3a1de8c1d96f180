"""Half-precision matrix multiplications whose dimensions are not multiples of 8: tensor cores
work on tiles of 8 (FP16, BF16), so such GEMMs pad or fall back to slower kernels."""

from __future__ import annotations

import json

from dlprof.advice.base import Finding, Need, Rule, Severity, Skip, duration, evidence_of
from dlprof.advice.data import RunData
from dlprof.keys import Kind

MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::linear", "aten::matmul")
HALF = ("c10::Half", "c10::BFloat16", "Half", "BFloat16")  # how torch.profiler names the dtypes
MULTIPLE = 8
EXPECTED_SAVING = 0.3  # assumed: aligned shapes run on the tensor cores' full tiles


class Fp16Dimensions(Rule):
    name = "fp16-dimensions"
    title = "Half-precision matrix multiplications with dimensions not multiples of 8"
    needs = (Need.OPS, Need.SHAPES)
    threshold = f"an FP16 or BF16 matrix multiplication with a matrix dimension not a multiple of {MULTIPLE}"
    stake_basis = f"those ops' time x {EXPECTED_SAVING:.0%}, an assumed saving once the tiles are full"
    fix = (f"Pad the dimensions to multiples of {MULTIPLE} (vocabulary, hidden and batch sizes): "
           "e.g. a vocabulary of 50257 to 50304; choose layer widths that are.")
    source = ("NVIDIA Deep Learning Performance guide, 'Tensor Core Requirements' "
              "(docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication)")

    def check(self, data: RunData) -> Finding | None:
        names = data.run.engine.dialect.literals(MATMULS)
        ops = data.run.sql(
            "SELECT name, input_shapes, input_dtypes, count(*) AS calls, CAST(sum(dur_ns) AS BIGINT) AS dur_ns "
            f"FROM slices WHERE kind = '{Kind.OP}' AND name IN {names}{data.where()} "
            "GROUP BY name, input_shapes, input_dtypes")
        half = ops[ops["input_dtypes"].map(lambda d: any(h in str(d) for h in HALF))]
        if half.empty:
            raise Skip("needs FP16 or BF16 matrix multiplications")
        odd = half[half["input_shapes"].map(_misaligned)]
        if odd.empty:
            return None
        spent = float(odd["dur_ns"].sum())
        evidence = evidence_of(
            odd.to_dict("records"), lambda r: f"{r['name']} {r['input_shapes']}",
            lambda r: f"{r['calls']} calls, {duration(r['dur_ns'])}", lambda r: r["dur_ns"] * EXPECTED_SAVING)
        summary = (f"{int(odd['calls'].sum())} half-precision matrix multiplications have a dimension not a "
                   f"multiple of {MULTIPLE} ({duration(spent)})")
        return self.finding(Severity.MODERATE, spent * EXPECTED_SAVING, summary, evidence)


def _misaligned(shapes: object) -> bool:
    """Whether any matrix input (two or more dimensions) has one of its last two dimensions off
    the multiple."""
    try:
        parsed = json.loads(str(shapes))
    except ValueError:
        return False
    matrices = [s for s in parsed if isinstance(s, list) and len(s) >= 2] if isinstance(parsed, list) else []
    return any(int(d) % MULTIPLE for s in matrices for d in s[-2:])


