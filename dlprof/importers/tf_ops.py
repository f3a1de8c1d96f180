"""TensorFlow op names as the profiler records them: ``name:Type`` into name, types and scope.

    op = parse_op_event("StatefulPartitionedCall/mlp/dense/Relu:_MklNativeFusedMatMul")
    op.name, op.raw_type, op.op_type, op.scope
    # ("mlp/dense/Relu", "_MklNativeFusedMatMul", "MatMul", "mlp/dense")
    op.layers   # ("mlp forward", "mlp/dense forward")

The raw type is the kernel TensorFlow ran (oneDNN's ``_MklMatMul``, Grappler's fused
``_FusedMatMul``); the logical type is the op the model asked for, which tfprof's op view
groups by. An op's layers are the Keras objects whose name scopes enclose it: Keras opens a
scope named after each layer, model, loss and optimizer it calls; ops TensorFlow builds from
several ops open scopes named after themselves (``Cast``, ``MatMul``, in CamelCase), which are
not layers. Gradient ops live under ``gradient_tape/`` and count as their layer's backward.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dlprof.keys import Kind

FORWARD = "forward"
BACKWARD = "backward"
GRADIENT_SCOPE = "gradient_tape"

# What the profiler accepts as "name:Type" (as xprof's tf_op_utils does): a node name, then an
# op type in CamelCase or starting with "_" (TraceMe names such as "end: copy.2" or
# "ThreadpoolListener::Record" are not ops).
_OP_NAME = re.compile(r"[A-Za-z0-9.][A-Za-z0-9_.\\/>-]*")
_OP_TYPE = re.compile(r"[A-Z_][A-Za-z0-9_]*")
# A tf.function's call op: the executor prefixes the ops it runs with the call's node name.
_CALL_SCOPE = re.compile(r"(?:Stateful)?PartitionedCall(?:_\d+)?")
# Scopes a Keras object opens: its name (snake_case by default); CamelCase scopes are ops'.
_OBJECT_SCOPE = re.compile(r"[a-z][A-Za-z0-9_.-]*")
# Lower-case scopes TensorFlow's control flow opens inside a layer: its layers end there.
_CONTROL_FLOW_SCOPES = frozenset({"while", "cond", "body", "then", "else", "case"})
# The scopes Keras's optimizers open, named after their class (AdamW: "adam_w"), with Keras's
# "_1" suffixes: their ops update variables, they are no layer of the model.
_OPTIMIZER_SCOPE = re.compile(
    r"(?:adam|adam_w|adamw|adamax|nadam|sgd|rms_?prop|rm_sprop|adagrad|adadelta|adafactor|ftrl|lion|lamb"
    r"|loss_scale_optimizer)(?:_\d+)?")
# Kernel prefixes of oneDNN and of TensorFlow's internal ops, longest first.
_TYPE_PREFIXES = ("_MklNative", "_Mkl", "_")
# Grappler's fused ops: the op they begin with is the one the model asked for.
_FUSED_TYPES = {
    "FusedMatMul": "MatMul",
    "FusedBatchMatMulV2": "BatchMatMulV2",
    "FusedConv2D": "Conv2D",
    "FusedConv3D": "Conv3D",
    "FusedDepthwiseConv2dNative": "DepthwiseConv2dNative",
}
_COMM_TYPES = re.compile(r"(?:Collective|Nccl)")


@dataclass(frozen=True)
class TfOp:
    """One TensorFlow op, as every event of it shares."""

    name: str  # the node's name, without tf.function call prefixes
    raw_type: str  # the kernel as TensorFlow reports it: "_MklMatMul"
    op_type: str  # the logical type: "MatMul"
    scope: str | None  # the name scope: "mlp/dense"; None at the top
    layers: tuple[str, ...]  # the module slices enclosing it, outermost first

    @property
    def kind(self) -> Kind:
        return Kind.COMM if _COMM_TYPES.match(self.op_type) else Kind.OP


def parse_op_event(event_name: str) -> TfOp | None:
    """The op an event named ``name:Type`` ran, or None when the name is no op's."""
    name, colon, raw_type = event_name.partition(":")
    if not colon or not _OP_NAME.fullmatch(name) or not _OP_TYPE.fullmatch(raw_type):
        return None
    return tf_op(name, raw_type)


def tf_op(full_name: str, raw_type: str) -> TfOp:
    """An op from its node name and type (as recorded, or from XLA's op metadata)."""
    parts = full_name.split("/")
    while len(parts) > 1 and _CALL_SCOPE.fullmatch(parts[0]):
        parts = parts[1:]
    scope = "/".join(parts[:-1]) or None
    return TfOp("/".join(parts), raw_type, logical_type(raw_type), scope, layer_chain(scope))


def logical_type(raw_type: str) -> str:
    """``_MklNativeFusedMatMul`` -> ``MatMul``: the op type without its kernel's decorations."""
    bare = raw_type
    for prefix in _TYPE_PREFIXES:
        if bare.startswith(prefix) and len(bare) > len(prefix):
            bare = bare[len(prefix):]
            break
    return _FUSED_TYPES.get(bare, bare)


def layer_chain(scope: str | None) -> tuple[str, ...]:
    """The module names of the Keras objects enclosing a name scope, outermost first.

    ``gradient_tape/mlp/dense/MatMul`` gives ``("mlp backward", "mlp/dense backward")``; an
    optimizer's scope (``adam_w/...``) gives none.
    """
    if not scope:
        return ()
    parts = [p for p in scope.split("/") if not _CALL_SCOPE.fullmatch(p)]
    direction = FORWARD
    if parts and parts[0] == GRADIENT_SCOPE:
        parts, direction = parts[1:], BACKWARD
    if parts and _OPTIMIZER_SCOPE.fullmatch(parts[0]):
        return ()
    chain: list[str] = []
    for end, part in enumerate(parts, start=1):
        if part in _CONTROL_FLOW_SCOPES or not _OBJECT_SCOPE.fullmatch(part):
            break
        chain.append(f"{'/'.join(parts[:end])} {direction}")
    return tuple(chain)


def module_scope(module_name: str) -> str:
    """The scope path of a module slice's name: ``"mlp/dense backward"`` -> ``"mlp/dense"``."""
    return module_name.rsplit(" ", 1)[0]
