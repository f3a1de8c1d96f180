"""Which imported slices are torch.compile compiling: kind ``compile``.

Dynamo and Inductor time their phases (tracing bytecode, AOT autograd, lowering, code
generation, compiling and loading the generated code) and, while a profiler records, open a range
for each (torch/_dynamo/utils.py), which Kineto writes as ordinary ``cpu_op`` events among the
program's ops. Only ranges torch names as its own are taken, three ways:

- ``<key> (dynamo_timed)``: ``dynamo_timed``'s range around each timed phase;
- ``<phase>_data: ...compile_id=<id>``: the annotation torch's compile event logger opens right
  after a phase starts, with the phase's metadata (the compile id always among it);
- ``<phase>``: the logger's own range of that phase (``dynamo``, ``inductor_compile``,
  ``bytecode_tracing``...), taken only where the same trace holds its ``<phase>_data`` annotation
  (Kineto writes the two one after the other; of a trace ``dlprof import`` reads in pieces, a
  phase whose annotation begins the next piece stays an op).

What runs the compiled code is not compiling and stays as it was: ``Torch-Compiled Region``,
``CompiledFunction``, ``## Call CompiledFxGraph ##``, and Dynamo's guard check on each call
(``TorchDynamo Cache Lookup``); so do the ops Dynamo and Inductor run while compiling (on fake
tensors), nested under the phases.

    kinds = compile_kinds(kinds, names)     # Arrow arrays, as the Kineto importer holds them
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from dlprof.keys import Kind

# The suffix of dynamo_timed's range, and the pattern of the compile event logger's annotation.
DYNAMO_TIMED_SUFFIX = " (dynamo_timed)"
_PHASE_DATA = r"^(?P<phase>.+)_data: (?:.*, )?compile_id="
_RANGE_KINDS = pa.array([str(Kind.OP), str(Kind.USER_ANNOTATION)], pa.string())


def compile_kinds(kind: pa.Array, name: pa.Array) -> pa.Array:
    """Kinds with torch.compile's compile phases made ``compile``.

    Args:
        kind: each slice's kind, as the importer classified it.
        name: each slice's name.

    Returns:
        ``kind`` with ``compile`` where an op or user annotation is one of torch's compile ranges
        (see the module's docstring).
    """
    ranges = pc.is_in(kind, _RANGE_KINDS)
    data = pc.and_(ranges, pc.match_substring_regex(name, _PHASE_DATA))
    phases = pc.unique(pc.struct_field(pc.extract_regex(name.filter(data), _PHASE_DATA), "phase"))
    compiling = pc.or_(pc.or_(data, pc.ends_with(name, DYNAMO_TIMED_SUFFIX)), pc.is_in(name, phases))
    return pc.if_else(pc.and_(ranges, compiling), str(Kind.COMPILE), kind)
