"""Walking up the nesting the store precomputed: for each slice, its nearest enclosing slice of a kind.

The store gives every slice its direct parent; views that attribute work to something further up
(an op to the module or Python frame around it, an allocation to the op that made it) need the
nearest ancestor that passes a test, whatever lies between::

    enclosing_op = nearest_ancestor_positions(slices, slices["kind"] == Kind.OP)  # row positions

The walk is vectorised: one step up for every slice at once, as many steps as the nesting is deep.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pandas as pd

NONE = -1  # the position of a missing ancestor

Positions = npt.NDArray[np.int64]


def parent_positions(slices: pd.DataFrame) -> Positions:
    """Each slice's parent as a row position in ``slices`` (:data:`NONE` for a root, or a parent
    left out of the frame, as when one rank is selected)."""
    ids = pd.Index(slices["id"].to_numpy(dtype=np.int64))
    parents = slices["parent_id"].astype("Int64").fillna(NONE).to_numpy(dtype=np.int64)
    found: Positions = ids.get_indexer(parents).astype(np.int64)
    return found


def nearest_ancestor_positions(slices: pd.DataFrame, wanted: npt.ArrayLike,
                               include_self: bool = False) -> Positions:
    """Row positions of each slice's innermost ancestor for which ``wanted`` holds.

    Args:
        slices: slices with ``id`` and ``parent_id``, as :attr:`dlprof.store.reader.Run.slices`.
        wanted: one boolean per row of ``slices``: which slices may be the answer.
        include_self: a wanted slice is its own answer.

    Returns:
        One position per row of ``slices`` (:data:`NONE` where no ancestor is wanted).
    """
    wanted_rows = np.asarray(wanted, dtype=bool)
    parent = parent_positions(slices)
    found = np.full(len(slices), NONE, dtype=np.int64)
    current = np.arange(len(slices), dtype=np.int64) if include_self else parent.copy()
    climbing = np.flatnonzero(current != NONE)
    # Every step climbs one level, so the loop ends after the deepest nesting; the bound only
    # guards against a parent cycle in a damaged run.
    for _ in range(len(slices) + 1):
        if climbing.size == 0:
            break
        at = current[climbing]
        hit = wanted_rows[at]
        found[climbing[hit]] = at[hit]
        climbing = climbing[~hit]
        current[climbing] = parent[current[climbing]]
        climbing = climbing[current[climbing] != NONE]
    return found

