"""Which arithmetic a kernel ran: its number format and whether tensor (matrix) cores did it.

    mode = math_mode("cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4", "float")
    mode.precision, mode.tensor_core, mode.label      # tf32, True, "tf32 tensor core"

The peak a kernel is measured against depends on it: an fp32 matmul an A100 ran through TF32
tensor cores has a roof eight times that of one run on its CUDA cores. The kernel's name says it
when cuBLAS, cuDNN or CUTLASS name their tensor-core kernels by their instruction shape
(``s1688`` is TF32 on Ampere, ``h884``/``h1688``/``hmma`` fp16, ``i8816``/``imma`` int8,
``gmma``/``wgmma`` Hopper's warpgroup MMA, ``xmma`` cuDNN's tensor-core kernels); otherwise the
op's input type decides, on the vector units.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dlprof.hardware.devices import Device, Precision, Vendor

# Kernel-name tokens that mean tensor cores, each with the format they imply (None: from the
# dtype). Checked in order; the first that matches wins.
_TENSOR_TOKENS: list[tuple[re.Pattern[str], Precision | None]] = [
    (re.compile(r"e4m3|e5m2|fp8"), Precision.FP8),
    (re.compile(r"i8816|i16832|imma|int8.*tensorop|tensorop.*i8"), Precision.INT8),
    (re.compile(r"bf16.*(tensorop|gmma|mma|s16816)|(tensorop|gmma|mma).*bf16"), Precision.BF16),
    (re.compile(r"s1688|s16816|tf32|tensorop_s"), Precision.TF32),
    (re.compile(r"h884|h1688|h16816|hmma|tensorop_h|f16.*gmma|gmma.*f16"), Precision.FP16),
    # nvjet: cuBLAS's generated Hopper GEMMs, on tensor cores in the inputs' format.
    (re.compile(r"wgmma|gmma|xmma|tensorop|nvjet"), None),
]
_VECTOR_TOKENS: list[tuple[re.Pattern[str], Precision]] = [
    (re.compile(r"dgemm|double"), Precision.FP64),
    (re.compile(r"sgemm|scudnn|gcgemm"), Precision.FP32),
]
# Kineto's input type names -> number formats.
_DTYPES: dict[str, Precision] = {
    "double": Precision.FP64, "float": Precision.FP32, "c10::Half": Precision.FP16, "half": Precision.FP16,
    "c10::BFloat16": Precision.BF16, "bfloat16": Precision.BF16, "c10::Float8_e4m3fn": Precision.FP8,
    "c10::Float8_e5m2": Precision.FP8, "signed char": Precision.INT8, "unsigned char": Precision.INT8,
}
_TENSOR_DEFAULT = {Precision.FP32: Precision.TF32, Precision.FP64: Precision.FP64}


@dataclass(frozen=True)
class MathMode:
    """A number format and the units that ran it."""

    precision: Precision
    tensor_core: bool

    @property
    def label(self) -> str:
        return f"{self.precision} tensor core" if self.tensor_core else str(self.precision)

    @classmethod
    def from_label(cls, label: str) -> MathMode:
        """The mode a :attr:`label` names (``tf32 tensor core``)."""
        precision, _, units = label.partition(" ")
        return cls(Precision(precision), bool(units))

    def peak(self, device: Device) -> float | None:
        """The device's peak for this mode: its matrix peak for tensor-core work; its fp64 or
        fp32 vector peak otherwise (datasheets give no vector fp16 figure, so half-precision
        work off the tensor cores is held to the fp32 peak). A CPU row's bf16 and fp16 peaks
        are its vector units' own (``dlprof calibrate`` measures them), so they count."""
        own = self.tensor_core or self.precision is Precision.FP64 or (
            device.vendor is Vendor.CPU and self.precision in device.peaks)
        return device.peak_flops(self.precision if own else Precision.FP32)

    def on(self, device: Device) -> MathMode:
        """The mode the same work takes on ``device``: tensor cores of the same format where it
        has them; else, for fp16 and bf16, its fp16 tensor cores; else the vector units in fp32
        (an fp32 matmul that ran as TF32 on an A100 runs as SGEMM on a V100)."""
        if not self.tensor_core or device.peak_flops(self.precision):
            return self
        if self.precision in (Precision.BF16, Precision.FP8) and device.peak_flops(Precision.FP16):
            return MathMode(Precision.FP16, True)
        return MathMode(Precision.FP32, False)


def dtype_precision(dtypes: list[str]) -> Precision | None:
    """The format of an op's first tensor input of a known type."""
    for dtype in dtypes:
        if dtype in _DTYPES:
            return _DTYPES[dtype]
    return None


def math_mode(kernel_name: str, dtype: str | Precision | None) -> MathMode:
    """The math mode of a kernel (or of a CPU op: pass its name) from its name and input type.

    Args:
        kernel_name: the kernel's name as the trace records it.
        dtype: the launching op's first input type (Kineto's name, or a :class:`Precision`).

    Returns:
        The mode; fp32 on the vector units when neither name nor type tell.
    """
    lowered = kernel_name.lower()
    known = dtype if isinstance(dtype, Precision) or dtype is None else _DTYPES.get(dtype)
    for pattern, precision in _TENSOR_TOKENS:
        if pattern.search(lowered):
            chosen = precision or _TENSOR_DEFAULT.get(known or Precision.FP32, known or Precision.TF32)
            return MathMode(chosen, True)
    for pattern, vector in _VECTOR_TOKENS:
        if pattern.search(lowered):
            return MathMode(vector, False)
    return MathMode(known or Precision.FP32, False)
