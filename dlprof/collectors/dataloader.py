"""DataLoader batches: one slice per batch fetched, in the worker process that made it.

torch.profiler sees only the training loop's side (``enumerate(DataLoader)#...__next__``, the
wait for the next batch). This collector times the other side: each worker's fetch of a batch
(reading samples and collating them), with the batch's tensor bytes, so a data-loading stall
shows on the timeline as the worker that was still busy. Workers forked after the session
started record into their own copy of the session (see :mod:`dlprof.recording.forks`); with
``num_workers=0`` the fetch runs in the loop's own thread and is timed there.

The fetch itself is the program's (its dataset, its collate): what it raises passes through
untouched. What dlprof does around it is guarded: a failure there stops the collector
(``Collector.hook_failed``; in a worker, the worker's recording) and the batch goes to the
program as fetched.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from dlprof.collectors.base import Collector, CollectorContext
from dlprof.keys import Kind

FETCH = "DataLoader.fetch"
# How deep into a batch's tuples, lists and dicts tensor bytes are counted.
_BATCH_DEPTH = 3


class DataLoaderCollector(Collector):
    name = "dataloader"
    description = "DataLoader batches fetched, per worker process"
    requires = ("torch", "torch")
    framework = "torch"
    default = True

    def start(self, context: CollectorContext) -> None:
        from torch.utils.data._utils import fetch

        slices = context.slices
        kind, name = slices.kind_code(Kind.DATALOADER), slices.intern(FETCH)
        saved = context.save_if_full
        collector = self
        self._patched: list[tuple[type, Any]] = []
        for fetcher in (fetch._MapDatasetFetcher, fetch._IterableDatasetFetcher):
            original = fetcher.fetch

            def timed_fetch(self: Any, indices: Any, _original: Any = original) -> Any:
                start = time.perf_counter_ns()
                batch = _original(self, indices)  # the program's: what it raises is its own
                try:
                    end = time.perf_counter_ns()
                    slices.record(kind, name, threading.get_native_id(), start, end, batch_bytes(batch))
                    saved()
                except Exception as failure:  # noqa: BLE001  dlprof's failure is never the program's
                    collector.hook_failed("its DataLoader fetch wrapper", failure)
                return batch

            fetcher.fetch = timed_fetch  # type: ignore[method-assign]
            self._patched.append((fetcher, original))

    def stop(self) -> None:
        for fetcher, original in self._patched:
            fetcher.fetch = original  # type: ignore[attr-defined]
        self._patched.clear()


def batch_bytes(batch: Any, depth: int = _BATCH_DEPTH) -> int:
    """Bytes of the tensors in a batch (tuples, lists and dicts of them, as collate makes); a
    sparse COO tensor's are those of its indices and values."""
    if getattr(batch, "is_sparse", False) is True and hasattr(batch, "_values"):
        # torch has no nbytes for a sparse tensor (it raises): its parts have.
        return int(batch._indices().nbytes + batch._values().nbytes)
    nbytes = getattr(batch, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if depth == 0:
        return 0
    if isinstance(batch, dict):
        return sum(batch_bytes(value, depth - 1) for value in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(batch_bytes(item, depth - 1) for item in batch)
    return 0


COLLECTOR = DataLoaderCollector
