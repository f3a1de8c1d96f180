"""One manifest for a run of several ranks, from the manifests its ranks wrote.

Each rank of a distributed job writes its own manifest (``ranks/<rank>.json``): its host,
status, exit code, clocks and collectors. None of them alone knows how the job ended, so the
reader combines them: the job failed if any rank failed, and the error says which rank::

    job = combine(ranks={0: m0, 1: m1}, base=m0, alive=lambda m: False)
    job.status, job.error      # failed, "rank 1 failed: RuntimeError: boom"
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from dlprof.keys import RunStatus
from dlprof.store.manifest import Manifest

# The job's status is the worst of its ranks', in this order.
_SEVERITY = (
    RunStatus.COMPLETE,
    RunStatus.DEGRADED,
    RunStatus.RUNNING,
    RunStatus.INTERRUPTED,
    RunStatus.KILLED,
    RunStatus.FAILED,
)


def rank_status(manifest: Manifest, alive: Callable[[Manifest], bool]) -> RunStatus:
    """A rank's status as a reader reports it: ``killed`` when left running by a writer gone."""
    if manifest.status is RunStatus.RUNNING and not alive(manifest):
        return RunStatus.KILLED
    return manifest.status


def combine(
    ranks: dict[int, Manifest], base: Manifest | None, alive: Callable[[Manifest], bool]
) -> Manifest:
    """The job's manifest: ``base`` (``run.json``, if any) updated from every rank's own.

    Args:
        ranks: each rank's manifest, by rank; not empty.
        base: the job's ``run.json``, written by rank 0 (None when rank 0 never started).
        alive: whether a manifest's writer process still runs.

    Returns:
        A manifest whose status is the worst rank's, whose error and exit code name the rank
        that ended worst first, and whose counts, ranks and span cover every rank.
    """
    first = ranks[min(ranks)]
    job = dataclasses.replace(base if base is not None else first)
    statuses = {rank: rank_status(manifest, alive) for rank, manifest in ranks.items()}
    worst = max(statuses.values(), key=_SEVERITY.index)
    # Never written: the combined manifest is the reader's, so it may say KILLED.
    job.status = worst
    # The rank that ended first is the cause; the others often fail because it went away.
    culprits = sorted(
        (rank for rank, status in statuses.items() if status is worst),
        key=lambda rank: (ranks[rank].end_ns or float("inf"), rank),
    )
    if worst is not RunStatus.COMPLETE:
        culprit = ranks[culprits[0]]
        ended = "was killed" if worst is RunStatus.KILLED else f"ended {worst}"
        job.error = f"rank {culprits[0]} {ended}" + (f": {culprit.error}" if culprit.error else "")
        job.exit_code = culprit.exit_code
    else:
        job.error = ""
        job.exit_code = next((m.exit_code for m in ranks.values() if m.exit_code), first.exit_code)
    job.ranks = sorted(ranks)
    job.world_size = max([job.world_size, *(m.world_size for m in ranks.values())])
    starts = [m.start_ns for m in ranks.values() if m.start_ns]
    job.start_ns = min(starts) if starts else job.start_ns
    job.end_ns = max(m.end_ns for m in ranks.values())
    job.counts = {}
    for manifest in ranks.values():
        for table, count in manifest.counts.items():
            job.counts[table] = job.counts.get(table, 0) + count
    job.degraded = [f"rank {rank}: {line}" for rank, manifest in sorted(ranks.items()) for line in manifest.degraded]
    return job

