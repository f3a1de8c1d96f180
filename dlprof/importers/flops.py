"""FLOPs of an op from its input shapes, with the formulas torch's profiler uses (``with_flops``).

Kineto's JSON trace does not carry the FLOPs torch computed, so they are recomputed here from
the recorded shapes. The same ops get a count as in torch (conv2d, mm, addmm, bmm, baddbmm, mul,
add) and the same values, so a dlprof table and ``key_averages()`` agree. One op more:
``aten::convolution_backward``, which torch's profiler leaves without FLOPs, counted as
``torch.utils.flop_counter`` counts it (a forward convolution's FLOPs for each of the input and
weight gradients asked for; for a grouped convolution's weight gradient the counter takes every
input channel, dlprof those of one group), so that a training step's convolutions count both ways.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from math import prod

Dims = Sequence[Sequence[int]]


def _matmul(dims: Dims, first: int) -> int | None:
    a, b = dims[first], dims[first + 1]
    if len(a) != 2 or len(b) != 2:
        return None
    return 2 * a[0] * a[1] * b[1]


def _batched_matmul(dims: Dims, first: int) -> int | None:
    a, b = dims[first], dims[first + 1]
    if len(a) != 3 or len(b) != 3:
        return None
    return 2 * a[0] * a[1] * a[2] * b[2]


def _pair(value: str, default: int) -> tuple[int, int]:
    """Parse a concrete input such as ``[1, 1]`` or ``2``; ``default`` when absent."""
    text = value.strip("[] ")
    if not text:
        return default, default
    parts = [int(p) for p in text.split(",")]
    return (parts[0], parts[0]) if len(parts) == 1 else (parts[0], parts[1])


def _conv2d(dims: Dims, concrete: Sequence[str]) -> int | None:
    if len(dims) < 2 or len(dims[0]) != 4 or len(dims[1]) != 4:
        return None
    batch, in_channels, height, width = dims[0]
    out_channels, _, kernel_h, kernel_w = dims[1]
    values = list(concrete) + [""] * (7 - len(concrete))
    stride = _pair(values[3], 1)
    padding = _pair(values[4], 0)
    dilation = _pair(values[5], 1)
    groups = int(values[6]) if values[6].strip().lstrip("-").isdigit() else 1
    out_h = (height + 2 * padding[0] - dilation[0] * (kernel_h - 1) - 1) // stride[0] + 1
    out_w = (width + 2 * padding[1] - dilation[1] * (kernel_w - 1) - 1) // stride[1] + 1
    return (
        2 * batch * out_h * out_w * kernel_h * kernel_w * in_channels * out_channels // max(groups, 1)
    )


def _convolution_backward(dims: Dims, concrete: Sequence[str]) -> int | None:
    """grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
    output_padding, groups, output_mask: each of grad_input and grad_weight asked for costs a
    forward convolution (the bias gradient, a sum, is left out)."""
    if len(dims) < 3 or len(dims[0]) != 4 or len(dims[2]) != 4:
        return None
    batch, out_channels, out_h, out_w = dims[0]
    _, in_channels, kernel_h, kernel_w = dims[2]
    values = list(concrete) + [""] * (11 - len(concrete))
    mask = [part.strip().lower() == "true" for part in values[10].strip("[] ").split(",")]
    grads = sum(mask[:2]) if len(mask) >= 2 else 2
    # The weight holds in_channels / groups input channels per output channel already.
    forward = 2 * batch * out_h * out_w * kernel_h * kernel_w * in_channels * out_channels
    return grads * forward


def _elementwise(dims: Dims) -> int | None:
    return prod(dims[0]) if dims and dims[0] else None


_FORMULAS: dict[str, Callable[[Dims, Sequence[str]], int | None]] = {
    "aten::mm": lambda d, c: _matmul(d, 0),
    "aten::addmm": lambda d, c: _matmul(d, 1),
    "aten::bmm": lambda d, c: _batched_matmul(d, 0),
    "aten::baddbmm": lambda d, c: _batched_matmul(d, 1),
    "aten::conv2d": _conv2d,
    "aten::convolution_backward": _convolution_backward,
    "aten::mul": lambda d, c: _elementwise(d),
    "aten::add": lambda d, c: _elementwise(d),
}

OPS_WITH_FLOPS = frozenset(_FORMULAS)


def estimate_flops(name: str, dims: Dims, concrete: Sequence[str] = ()) -> int | None:
    """FLOPs of one call of ``name`` with inputs of shapes ``dims``, or None if unknown.

    Args:
        name: the op name as torch records it (``aten::addmm``).
        dims: the shape of each input, as in Kineto's ``Input Dims``.
        concrete: the op's scalar and list inputs as text (Kineto's ``Concrete Inputs``).
    """
    formula = _FORMULAS.get(name)
    if formula is None:
        return None
    try:
        return formula(dims, concrete)
    except (IndexError, ValueError, TypeError):
        return None
