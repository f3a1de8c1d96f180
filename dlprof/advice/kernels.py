"""What a GEMM or convolution kernel's name says about how it computes: on tensor cores, or
on the ordinary FP32 units (SIMT), as cuBLAS, cuDNN and CUTLASS name their kernels.

    math_units("ampere_sgemm_128x64_nn")                       # Units.FP32_SIMT
    math_units("cutlass_80_tensorop_s1688gemm_64x64_32x6_tn")  # Units.TENSOR_CORES
    math_units("vectorized_elementwise_kernel<...>")          # None: no GEMM or convolution

:class:`GemmUnitsRule` is what the rules on them share: which kernels miss the tensor cores, on
which GPUs, and what that puts at stake.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from enum import StrEnum
from typing import ClassVar

import pandas as pd

from dlprof.advice.base import Finding, Need, Rule, Severity, Skip, duration, evidence_of, percent
from dlprof.advice.data import RunData

# tensorop (CUTLASS), xmma / hmma / gmma (cuDNN and cuBLAS's tensor-core kernels), nvjet (cuBLAS's
# generated Hopper kernels, all on tensor cores), the MMA shapes in names (h884, s1688, h16816,
# i8816), tf32 and half-precision GEMMs.
_TENSOR = re.compile(r"tensorop|xmma|hmma|wgmma|gmma|nvjet|[hsib]\d{3,5}gemm|16816|1688|884gemm|tf32|"
                     r"(?:fp16|bf16|f16)\w*(?:gemm|conv)", re.IGNORECASE)
# Single-precision SIMT GEMMs and convolutions: sgemm, scudnn, complex-FP32 (fft) convolutions.
_FP32 = re.compile(r"sgemm|scudnn|gcgemm|cgemm|fft2d|winograd|implicit_convolve_sgemm|_s\d+x\d+_(?:nn|nt|tn|tt)\b",
                   re.IGNORECASE)
# Half-precision kernels that still miss the tensor cores (hgemm without an MMA shape).
_HALF_SIMT = re.compile(r"hgemm|hcudnn", re.IGNORECASE)


class Units(StrEnum):
    """The units a GEMM or convolution kernel runs on."""

    TENSOR_CORES = "tensor cores"
    FP32_SIMT = "FP32 units"
    HALF_SIMT = "FP16 without tensor cores"


def math_units(kernel: str) -> Units | None:
    """The units a kernel's name says it runs on, or None for a kernel that is no GEMM or
    convolution (elementwise, reductions, layout changes)."""
    if _TENSOR.search(kernel):
        return Units.TENSOR_CORES
    if _FP32.search(kernel):
        return Units.FP32_SIMT
    if _HALF_SIMT.search(kernel):
        return Units.HALF_SIMT
    return None


def gemm_kernels(kernels: pd.DataFrame, capability: Callable[[str], float | None]) -> pd.DataFrame:
    """The GEMM and convolution kernels among ``kernels`` (``name``, ``device``, ``calls``,
    ``dur_ns``), with ``units`` (:func:`math_units`) and their GPU's compute ``capability``
    (missing where the run does not say)."""
    units = kernels["name"].astype(str).map(math_units)
    found = kernels.assign(units=units, capability=kernels["device"].astype(str).map(capability))
    return found[found["units"].notna()].reset_index(drop=True)


class GemmUnitsRule(Rule):
    """A rule on GEMM and convolution kernels that miss the units they could run on: subclasses
    say from which compute capability they judge and which kernels miss."""

    min_capability: ClassVar[float]
    min_share: ClassVar[float] = 0.10  # of the GEMM and convolution kernel time
    # Assumed: tensor cores run these several times faster; half their time is a conservative gain.
    expected_saving: ClassVar[float] = 0.5
    needs = (Need.DEVICE, Need.DEVICE_PROPERTIES)

    def missed(self, gemms: pd.DataFrame) -> pd.Series:
        """Which of ``gemms`` (:func:`gemm_kernels`' rows) miss the units."""
        raise NotImplementedError

    def check(self, data: RunData) -> Finding | None:
        gemms = gemm_kernels(data.kernels, data.compute_capability)
        gemms = gemms[gemms["capability"] >= self.min_capability]
        if gemms.empty:
            raise Skip(f"needs GEMM or convolution kernels on a GPU of compute capability >= {self.min_capability}")
        missed = gemms[self.missed(gemms)]
        spent, total = float(missed["dur_ns"].sum()), float(gemms["dur_ns"].sum())
        if missed.empty or spent < self.min_share * total:
            return None
        evidence = evidence_of(
            missed.to_dict("records"), lambda r: f"{r['name']} on {r['device']} (sm {r['capability']:.1f})",
            lambda r: f"{r['calls']} calls, {duration(r['dur_ns'])} on {r['units']}",
            lambda r: r["dur_ns"] * self.expected_saving)
        summary = (f"{duration(spent)} of {duration(total)} GEMM and convolution kernel time "
                   f"({percent(spent, total)}) ran on {', '.join(sorted(set(missed['units'])))}")
        severity = Severity.HIGH if spent >= 0.5 * total else Severity.MODERATE
        claims = [data.kernel_claim(str(r["name"]), str(r["device"]), float(r["dur_ns"]), self.expected_saving)
                  for r in missed.to_dict("records")]
        return self.finding(severity, spent * self.expected_saving, summary, evidence, claims)
