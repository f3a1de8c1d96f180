"""XLA's compiled modules, as XPlane's ``/host:metadata`` plane carries them: each HLO
instruction's TensorFlow (or JAX) op.

A model compiled with XLA (``jit_compile=True``, JAX) records HLO instructions (``MatMul.12``,
``broadcast_maximum_fusion``) instead of TensorFlow ops. The profiler stores each module's
``HloProto``; its instructions carry ``OpMetadata`` naming the framework op they came from::

    module, ops = hlo_ops(serialized)
    ops["MatMul.12"]   # HloOp(opcode="dot", tf_name="gradient_tape/mlp/dense/MatMul/MatMul", tf_type="MatMul")

Only the few fields this needs are decoded, by a small protobuf wire reader: XLA's generated
protobuf modules import all of TensorFlow, and a JAX profile must not need TensorFlow for that.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

# Field numbers in xla/service/hlo.proto and xla/xla_data.proto.
_PROTO_MODULE = 1  # HloProto.hlo_module
_MODULE_NAME, _MODULE_COMPUTATIONS = 1, 3  # HloModuleProto
_COMPUTATION_INSTRUCTIONS, _COMPUTATION_ID, _COMPUTATION_ROOT = 2, 5, 6  # HloComputationProto
_INSTRUCTION_NAME, _INSTRUCTION_OPCODE, _INSTRUCTION_METADATA = 1, 2, 7  # HloInstructionProto
_INSTRUCTION_ID, _INSTRUCTION_CALLED = 35, 38
_METADATA_OP_TYPE, _METADATA_OP_NAME = 1, 2  # OpMetadata

_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


class HloFormatError(ValueError):
    """Bytes that are not a well-formed protobuf message."""


@dataclass(frozen=True)
class HloOp:
    """One HLO instruction and the framework op it was compiled from."""

    opcode: str  # "dot", "fusion", "copy"
    tf_name: str  # the op's full name; "" where XLA recorded none (copies, tuples)
    tf_type: str  # "MatMul"; "" where XLA recorded none


def hlo_ops(serialized: bytes) -> tuple[str, dict[str, HloOp]]:
    """The module's name and, by instruction name, what each instruction was compiled from.

    A fusion whose own metadata is empty takes its fused computation's root's (else the first
    fused instruction's that has one), so the time of every fusion lands on some op.

    Raises:
        HloFormatError: the bytes are not a serialized ``HloProto``.
    """
    module = b""
    for number, _, value in _fields(serialized):
        if number == _PROTO_MODULE and isinstance(value, bytes):
            module = value
    name = ""
    computations: list[_Computation] = []
    for number, _, value in _fields(module):
        if number == _MODULE_NAME and isinstance(value, bytes):
            name = value.decode("utf-8", "replace")
        elif number == _MODULE_COMPUTATIONS and isinstance(value, bytes):
            computations.append(_computation(value))
    by_id = {c.id: c for c in computations}
    ops: dict[str, HloOp] = {}
    for computation in computations:
        for instruction in computation.instructions:
            tf_name, tf_type = instruction.tf_name, instruction.tf_type
            if not tf_name:
                tf_name, tf_type = _called_op(instruction, by_id)
            ops[instruction.name] = HloOp(instruction.opcode, tf_name, tf_type)
    return name, ops


@dataclass
class _Instruction:
    name: str = ""
    opcode: str = ""
    tf_name: str = ""
    tf_type: str = ""
    id: int = 0
    called: tuple[int, ...] = ()


@dataclass
class _Computation:
    id: int
    root: int
    instructions: list[_Instruction]


def _computation(data: bytes) -> _Computation:
    computation = _Computation(id=0, root=-1, instructions=[])
    for number, _, value in _fields(data):
        if number == _COMPUTATION_INSTRUCTIONS and isinstance(value, bytes):
            computation.instructions.append(_instruction(value))
        elif number == _COMPUTATION_ID and isinstance(value, int):
            computation.id = value
        elif number == _COMPUTATION_ROOT and isinstance(value, int):
            computation.root = value
    return computation


def _instruction(data: bytes) -> _Instruction:
    instruction = _Instruction()
    called: list[int] = []
    for number, wire, value in _fields(data):
        if isinstance(value, bytes) and number == _INSTRUCTION_NAME:
            instruction.name = value.decode("utf-8", "replace")
        elif isinstance(value, bytes) and number == _INSTRUCTION_OPCODE:
            instruction.opcode = value.decode("utf-8", "replace")
        elif isinstance(value, bytes) and number == _INSTRUCTION_METADATA:
            for field, _, text in _fields(value):
                if field == _METADATA_OP_TYPE and isinstance(text, bytes):
                    instruction.tf_type = text.decode("utf-8", "replace")
                elif field == _METADATA_OP_NAME and isinstance(text, bytes):
                    instruction.tf_name = text.decode("utf-8", "replace")
        elif number == _INSTRUCTION_ID and isinstance(value, int):
            instruction.id = value
        elif number == _INSTRUCTION_CALLED:
            # Repeated int64: packed (one length-delimited run) or one varint per entry.
            if wire == _LENGTH and isinstance(value, bytes):
                called.extend(_packed_varints(value))
            elif isinstance(value, int):
                called.append(value)
    instruction.called = tuple(called)
    return instruction


def _called_op(instruction: _Instruction, by_id: dict[int, _Computation]) -> tuple[str, str]:
    """The op a fused (or otherwise called) computation's root, else first named instruction, came from."""
    for computation_id in instruction.called:
        computation = by_id.get(computation_id)
        if computation is None:
            continue
        named = [i for i in computation.instructions if i.tf_name]
        root = next((i for i in named if i.id == computation.root), None)
        chosen = root or (named[0] if named else None)
        if chosen is not None:
            return chosen.tf_name, chosen.tf_type
    return "", ""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise HloFormatError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise HloFormatError("varint longer than 10 bytes")


def _fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """Each field of a message: (field number, wire type, integer or bytes)."""
    pos, end = 0, len(data)
    while pos < end:
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == _VARINT:
            value, pos = _varint(data, pos)
        elif wire == _LENGTH:
            length, pos = _varint(data, pos)
            if pos + length > end:
                raise HloFormatError("field runs past the end of its message")
            value = data[pos : pos + length]
            pos += length
        elif wire in (_FIXED64, _FIXED32):
            size = 8 if wire == _FIXED64 else 4
            value = int.from_bytes(data[pos : pos + size], "little")
            pos += size
        else:
            raise HloFormatError(f"unknown wire type {wire}")
        yield number, wire, value


def _packed_varints(data: bytes) -> Iterator[int]:
    pos = 0
    while pos < len(data):
        value, pos = _varint(data, pos)
        yield value
