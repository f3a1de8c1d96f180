"""Slice ids that are unique across every rank and process of a job without any coordination.

An id is ``rank << 47 | slot << 39 | sequence``: 16 bits of rank, 8 bits of writer slot (one per
process or per source within a rank), 39 bits of sequence. Tools that merge ranks can therefore
concatenate tables without renumbering.
"""

from __future__ import annotations

RANK_SHIFT = 47
SLOT_SHIFT = 39
MAX_RANK = (1 << 16) - 1
MAX_SLOT = (1 << 8) - 1

# Fixed slots, so a converter in another process can number its rows without asking.
SLOT_SESSION = 0  # steps, regions, modules: recorded by dlprof in the profiled process
SLOT_KINETO = 1  # ops and kernels converted from torch.profiler's trace
SLOT_IMPORT = 2  # slices imported from a foreign trace file
SLOT_CUPTI = 3  # kernels and API calls from the cupti collector (CUPTI Activity API)
SLOT_XPLANE = 4  # ops, layers and device work converted from TensorFlow's profiler (XPlane)
# Processes forked from the profiled one (DataLoader workers) take the slots from here on, one
# per fork, wrapping around after the last.
SLOT_FORKED_FIRST = 16


def forked_slot(fork_number: int) -> int:
    """The slot of the ``fork_number``-th process forked from a rank's process (from 1)."""
    return SLOT_FORKED_FIRST + (fork_number - 1) % (MAX_SLOT + 1 - SLOT_FORKED_FIRST)


def id_base(rank: int, slot: int) -> int:
    """The first id of a (rank, slot) range."""
    if not 0 <= rank <= MAX_RANK:
        raise ValueError(f"rank {rank} is outside 0..{MAX_RANK}")
    if not 0 <= slot <= MAX_SLOT:
        raise ValueError(f"slot {slot} is outside 0..{MAX_SLOT}")
    return (rank << RANK_SHIFT) | (slot << SLOT_SHIFT)


def rank_of(slice_id: int) -> int:
    return slice_id >> RANK_SHIFT
