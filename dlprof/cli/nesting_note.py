"""The line under a table of nested slices that says how many of the run's slices nesting moved.

A table built on the nesting (a layer's self time, a tree's attribution) is only as true as the
times it nests; when the store had to move slices to make one tree (:mod:`dlprof.store.nesting`),
the reader should know it where the figures are, not only in ``dlprof info``.

    print_nesting_note(run)   # after top's or tree's tables, for a person
"""

from __future__ import annotations

import sys

from dlprof.store.manifest import Manifest
from dlprof.store.reader import Run
from dlprof.viewers.screen import wrapped

# The counts of the manifest's ``normalised`` that changed a slice's recorded times, with a word
# for each; overlaps on a device are counted but kept as recorded.
_MOVES = {
    "aligned_to_autograd": "backward layers aligned to autograd's nodes",
    "clipped_to_parent": "ended at their parent's end",
    "moved_past_parent": "started after the slice they began in",
    "extended_over_parent": "started earlier to hold the slice they began in",
    "ended_at_open_slice": "regions ended where a step began",
    "negative_durations": "negative durations made zero",
}


def nesting_note(manifest: Manifest) -> str | None:
    """One line on the slices whose times nesting changed, or None when it changed none."""
    moved = {key: manifest.normalised.get(key, 0) for key in _MOVES}
    total = sum(moved.values())
    if not total:
        return None
    parts = ", ".join(f"{count:,} {_MOVES[key]}" for key, count in moved.items() if count)
    return f"Nesting changed the times of {total:,} slices to make one tree ({parts}); dlprof info says how."


def print_nesting_note(loaded: Run) -> None:
    """Print :func:`nesting_note`'s line for the run, if any."""
    line = nesting_note(loaded.manifest)
    if line:
        print(wrapped(line, sys.stdout))
