"""FP32 matrix multiplications without TF32 on Ampere or later: FP32 GEMMs and convolutions run
on the FP32 units while the GPU's tensor cores could run them in TF32."""

from __future__ import annotations

import pandas as pd

from dlprof.advice.kernels import GemmUnitsRule, Units


class Fp32WithoutTf32(GemmUnitsRule):
    name = "fp32-without-tf32"
    title = "FP32 matrix multiplications without TF32"
    min_capability = 8.0  # Ampere
    threshold = (f"on compute capability >= {min_capability}, FP32 SIMT GEMM or convolution kernels "
                 f"(sgemm, scudnn, fft) taking >= {GemmUnitsRule.min_share:.0%} of the GEMM and "
                 "convolution kernel time")
    stake_basis = f"those kernels' time x {GemmUnitsRule.expected_saving:.0%}, an assumed saving with TF32"
    fix = ("Allow TF32 where FP32's 23-bit mantissa is not needed: "
           "torch.set_float32_matmul_precision('high') (or torch.backends.cuda.matmul.allow_tf32 = True) "
           "and torch.backends.cudnn.allow_tf32 = True; or train in bf16 with torch.autocast.")
    source = ("PyTorch CUDA semantics, 'TensorFloat-32 (TF32) on Ampere (and later) devices' "
              "(pytorch.org/docs/stable/notes/cuda.html)")

    def missed(self, gemms: pd.DataFrame) -> pd.Series:
        return gemms["units"] == Units.FP32_SIMT
