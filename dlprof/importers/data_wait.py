"""Which imported slices are the training loop waiting for its next batch: kind ``data_wait``.

Frameworks record the wait as a range of their own, which would otherwise be a plain user
annotation or op:

- PyTorch: ``enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__`` (and the
  multi-process iterator's), the range torch opens around each ``next()`` on a DataLoader, on the
  loop's thread. The time a worker spends producing the batch is the ``dataloader`` kind, in the
  worker; the wait is what the loop saw of it.
- TensorFlow: the ``IteratorGetNext`` op (and its ``Sync``/``AsOptional`` variants) on the host,
  and the ``IteratorGetNextOp::DoCompute`` range tf.data opens inside it.

    kinds = data_wait_kinds(kinds, names)        # Arrow arrays, as the Kineto importer holds them
    is_tf_data_wait("IteratorGetNext", "IteratorGetNext")  # True

Exports write ``data_wait`` slices as Kineto ``user_annotation`` events under their own names,
so a run exported and imported again classifies them the same way.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from dlprof.keys import Kind

# The prefix of torch's range around each DataLoader iteration (torch/utils/data/dataloader.py).
DATALOADER_ITERATION = "enumerate(DataLoader)#"
# tf.data's ops that hand the next element to the program, and the range inside them.
TF_GET_NEXT_TYPES = frozenset({"IteratorGetNext", "IteratorGetNextSync", "IteratorGetNextAsOptional"})
TF_GET_NEXT_RANGE = "IteratorGetNextOp::DoCompute"

# Kinds a waiting range may come as: torch writes its range as a user annotation (an op in old
# Kineto traces), TensorFlow's are ops or TraceMe ranges.
_WAITING_KINDS = (str(Kind.USER_ANNOTATION), str(Kind.OP))


def is_tf_data_wait(name: str, op_type: str | None) -> bool:
    """Whether a TensorFlow host event is the program waiting for tf.data's next element.

    Args:
        name: the event's name (an op's node name, or a TraceMe range's name).
        op_type: the op's type, None for an event that is not an op.

    Returns:
        True for IteratorGetNext ops and tf.data's range inside them.
    """
    return op_type in TF_GET_NEXT_TYPES or name == TF_GET_NEXT_RANGE


def data_wait_kinds(kind: pa.Array, name: pa.Array) -> pa.Array:
    """Kinds with the loop's waits for data made ``data_wait``.

    Args:
        kind: each slice's kind, as the importer classified it.
        name: each slice's name.

    Returns:
        ``kind`` with ``data_wait`` where a user annotation or op is a DataLoader iteration or a
        tf.data IteratorGetNext.
    """
    waiting = pc.or_(
        pc.starts_with(name, DATALOADER_ITERATION),
        pc.or_(pc.is_in(name, pa.array(sorted(TF_GET_NEXT_TYPES), pa.string())),
               pc.equal(name, TF_GET_NEXT_RANGE)),
    )
    waiting = pc.and_(waiting, pc.is_in(kind, pa.array(_WAITING_KINDS, pa.string())))
    return pc.if_else(waiting, str(Kind.DATA_WAIT), kind)
