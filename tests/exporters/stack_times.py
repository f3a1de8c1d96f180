"""What a stack profile's flat time of a row should be, from the store."""

from __future__ import annotations

from typing import Any

from dlprof.store.reader import Run


def stack_self_ns(run: Run, kind: str, row: Any) -> int:
    """A row's time with no frame above it on the stack: top's self time, except for layers.

    top's self time of a layer is its time outside inner layers (its ops count as its own), while
    a profile's flat time of a frame is its time outside every frame it called.
    """
    if kind != "module":
        return int(row.self_ns)
    return int(run.slices.loc[(run.slices["kind"] == kind) & (run.slices["name"] == row.name), "self_ns"].sum())
