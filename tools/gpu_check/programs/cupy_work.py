"""CUDA work without PyTorch, through CuPy: the program the cupti and cupti_metrics checks profile.

    python tools/gpu_check/programs/cupy_work.py --phase activity
    python tools/gpu_check/programs/cupy_work.py --phase metrics

``activity``: a host-to-device copy, a memset (``cupy.zeros_like``), element-wise kernels, a
fill, a cuBLAS GEMM, reductions and device-to-host copies: the same launches on every run.

``metrics``: a memory-bound kernel, ``stream_scale`` (one 4-byte load and one store per element
over 1 GiB), and a compute-bound one, ``fma_loop`` (four chains of dependent FMAs per thread and
no load at all), each launched several times and each launch long enough (about a millisecond or
more on an H100) to span many PM samples taken every 100 µs.

CuPy is imported inside :func:`main` only, so that the rest of this file (the kernel source, the
sizes) is read and tested where CuPy is not installed.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

MEMORY_BOUND = "stream_scale"
COMPUTE_BOUND = "fma_loop"

# extern "C": CUPTI names it fma_loop, unmangled. Four independent chains keep the FMA pipes full;
# the result is stored so that the compiler cannot drop the loop.
FMA_LOOP_SOURCE = r"""
extern "C" __global__ void fma_loop(float* out, int rounds) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float a = 1.0f + i * 1e-9f, b = 0.5f, c = 0.25f, d = 0.125f;
    for (int k = 0; k < rounds; ++k) {
        a = fmaf(a, 0.9999f, 0.0001f);
        b = fmaf(b, 0.9999f, 0.0001f);
        c = fmaf(c, 0.9999f, 0.0001f);
        d = fmaf(d, 0.9999f, 0.0001f);
    }
    out[i] = a + b + c + d;
}
"""


@dataclass(frozen=True)
class Sizes:
    """How much work each phase does."""

    activity_elements: int = 1 << 22  # 16 MiB of float32 copied in, worked on, reduced
    activity_rounds: int = 20  # element-wise updates
    gemm: int = 1024  # square GEMM size
    stream_elements: int = 1 << 28  # 1 GiB of float32 read and 1 GiB written per launch
    fma_threads: int = 1 << 20  # enough blocks to fill every SM several times over
    fma_block: int = 256
    fma_rounds: int = 1 << 14  # 4 x 16384 FMAs per thread: about 2 ms at an H100's FP32 peak
    launches: int = 8  # of each metrics kernel

    @property
    def fma_grid(self) -> int:
        return -(-self.fma_threads // self.fma_block)


def activity(cp: Any, sizes: Sizes) -> float:
    """Copies, a memset, element-wise kernels, a GEMM and reductions; returns a checksum."""
    import numpy

    host = numpy.arange(sizes.activity_elements, dtype=numpy.float32)
    x = cp.asarray(host)  # Memcpy HtoD
    y = cp.zeros_like(x)  # Memset
    for _ in range(sizes.activity_rounds):
        y += x * 0.5
    a = cp.ones((sizes.gemm, sizes.gemm), dtype=numpy.float32)
    c = a @ a  # cuBLAS
    total = float(y.sum()) + float(c.sum())  # reductions, Memcpy DtoH
    cp.cuda.runtime.deviceSynchronize()
    return total


def metrics(cp: Any, sizes: Sizes) -> None:
    """The memory-bound and the compute-bound kernel, ``sizes.launches`` times each."""
    scale = cp.ElementwiseKernel("float32 x", "float32 y", "y = x * 2.0f", MEMORY_BOUND)
    fma = cp.RawKernel(FMA_LOOP_SOURCE, COMPUTE_BOUND)
    source = cp.ones(sizes.stream_elements, dtype=cp.float32)
    target = cp.empty_like(source)
    out = cp.empty(sizes.fma_threads, dtype=cp.float32)
    for _ in range(sizes.launches):
        scale(source, target)
        fma((sizes.fma_grid,), (sizes.fma_block,), (out, cp.int32(sizes.fma_rounds)))
    cp.cuda.runtime.deviceSynchronize()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--phase", choices=["activity", "metrics"], required=True)
    args = parser.parse_args(argv)
    try:
        import cupy
    except ImportError as error:
        print(f"cupy_work: CuPy does not import here: {error}", file=sys.stderr)
        return 2
    sizes = Sizes()
    if args.phase == "activity":
        print(f"checksum {activity(cupy, sizes):.6g}")
    else:
        metrics(cupy, sizes)
        print(f"ran {MEMORY_BOUND} and {COMPUTE_BOUND} {sizes.launches} times each")
    return 0


if __name__ == "__main__":
    sys.exit(main())
