"""Tensor cores unused: matrix multiplications and convolutions run on the ordinary units of a
GPU that has tensor cores (compute capability 7.0 and up).

On Volta and Turing (7.x) FP32 work never reaches the tensor cores: only FP16 does, so FP32
GEMMs there call for mixed precision. From Ampere (8.0) on, FP32 GEMMs can use TF32, which
:mod:`~dlprof.advice.rules.fp32_without_tf32` reports; this rule then reports only half-
precision kernels that miss the tensor cores.
"""

from __future__ import annotations

import pandas as pd

from dlprof.advice.kernels import GemmUnitsRule, Units

FIRST_TF32 = 8.0  # Ampere: FP32 GEMMs from here on are the TF32 rule's


class TensorCoresUnused(GemmUnitsRule):
    name = "tensor-cores-unused"
    title = "Tensor cores unused by matrix multiplications and convolutions"
    min_capability = 7.0  # Volta
    threshold = (f"on compute capability >= {min_capability}, GEMM or convolution kernels without a "
                 f"tensor-op kernel name taking >= {GemmUnitsRule.min_share:.0%} of the GEMM and "
                 f"convolution kernel time (FP32 ones only below {FIRST_TF32})")
    stake_basis = f"those kernels' time x {GemmUnitsRule.expected_saving:.0%}, an assumed saving on tensor cores"
    fix = ("Train in mixed precision: with torch.autocast(device_type='cuda', dtype=torch.float16) "
           "(with torch.cuda.amp.GradScaler) or dtype=torch.bfloat16 from Ampere on; keep GEMM "
           "dimensions multiples of 8.")
    source = ("NVIDIA Deep Learning Performance guide, 'Matrix Multiplication Background' and "
              "'Mixed precision training' (docs.nvidia.com/deeplearning/performance)")

    def missed(self, gemms: pd.DataFrame) -> pd.Series:
        fp32_before_tf32 = (gemms["units"] == Units.FP32_SIMT) & (gemms["capability"] < FIRST_TF32)
        return fp32_before_tf32 | (gemms["units"] == Units.HALF_SIMT)
