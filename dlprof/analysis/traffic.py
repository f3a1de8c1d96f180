"""Bytes an op moves, from its input shapes and types, where no counter measured them.

    op_bytes("aten::addmm", "[[512],[1024,1705],[1705,512],[],[]]", '["float","float","float","Scalar","Scalar"]')

The inputs are read once and the output written once: inputs from their shapes and types; the
output from the shapes where the op's result shape follows from them (matrix products), else
as large as the largest input (element-wise ops, in place or not). Caches and re-reads are not
modelled, so this is the compulsory traffic: a floor under what DRAM counters would measure.
"""

from __future__ import annotations

from math import prod

import orjson

# Bytes per element of Kineto's input type names.
DTYPE_BYTES: dict[str, int] = {
    "double": 8, "float": 4, "c10::Half": 2, "half": 2, "c10::BFloat16": 2, "bfloat16": 2,
    "long int": 8, "long": 8, "int": 4, "short int": 2, "short": 2, "signed char": 1, "unsigned char": 1,
    "bool": 1, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "c10::complex<float>": 8,
    "c10::complex<double>": 16,
}
_MATMUL_OPERANDS = {"aten::mm": 0, "aten::addmm": 1, "aten::bmm": 0, "aten::baddbmm": 1, "aten::matmul": 0}


def parse_list(text: str | None) -> list[object]:
    """A JSON list column of the store (input shapes or types); empty when missing or malformed."""
    if not text:
        return []
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return []
    return value if isinstance(value, list) else []


def tensor_inputs(shapes_text: str | None, dtypes_text: str | None) -> list[tuple[list[int], int]]:
    """Each tensor input as (shape, bytes per element); inputs of unknown type are left out."""
    shapes, dtypes = parse_list(shapes_text), parse_list(dtypes_text)
    found = []
    for shape, dtype in zip(shapes, dtypes, strict=False):
        if isinstance(shape, list) and shape and all(isinstance(d, int) for d in shape) and dtype in DTYPE_BYTES:
            found.append((shape, DTYPE_BYTES[str(dtype)]))
    return found


def op_bytes(name: str, shapes_text: str | None, dtypes_text: str | None) -> int | None:
    """Bytes read and written by one call of ``name``, or None when no input has a known type.

    Args:
        name: the op (``aten::mm``).
        shapes_text: its ``input_shapes`` column.
        dtypes_text: its ``input_dtypes`` column.
    """
    inputs = tensor_inputs(shapes_text, dtypes_text)
    if not inputs:
        return None
    read = sum(prod(shape) * size for shape, size in inputs)
    first = _MATMUL_OPERANDS.get(name)
    if first is not None and len(inputs) > first + 1:
        (a, size), (b, _) = inputs[first], inputs[first + 1]
        if len(a) >= 2 and len(b) >= 2:
            return read + prod(a[:-1]) * b[-1] * size
    return read + max(prod(shape) * size for shape, size in inputs)
