"""What each CPU track of a run is, in words: ``main``, ``autograd``, ``DataLoader worker 2``.

    roles = thread_roles(run)
    roles[(0, 5137, 6494)]      # 'autograd'

A run stores threads as (pid, tid) numbers. What they were is read from what ran on them: the
thread that ran the steps is the process's main thread, one that ran autograd's engine is its
backward thread, a process that loaded batches (dataloader slices) besides the main one is a
DataLoader worker, numbered by first activity; Kineto's GPU user annotations and its own
overhead come on tracks of their own, which are named as such. Anything else keeps its numbers.
"""

from __future__ import annotations

from dlprof.analysis.sql import ON_CPU, rank_condition
from dlprof.keys import Kind
from dlprof.store.reader import Run

MAIN = "main"
AUTOGRAD = "autograd"
GPU_ANNOTATIONS = "GPU annotations"
PROFILER_OVERHEAD = "profiler overhead"
_AUTOGRAD_ENGINE = "autograd::engine::%"
# Kinds an imported Kineto trace keeps from its categories, on tracks of their own: its overhead
# category is read as dlprof's own profiler kind (runs imported before that hold "overhead").
GPU_ANNOTATION_KIND = "gpu_user_annotation"
OVERHEAD_KINDS = ("overhead", str(Kind.PROFILER))

Track = tuple[int, int, int]  # rank, pid, tid


def thread_roles(run: Run, rank: int | None = None) -> dict[Track, str]:
    """Each CPU thread's role in words, by (rank, pid, tid); threads of no known role are left out.

    Returns:
        ``main`` (the first thread that ran steps), ``main (pid N)`` for the first such thread
        of another process,
        ``autograd``, ``DataLoader worker N`` (from 0, by first activity within the rank),
        ``GPU annotations``, ``profiler overhead``.
    """
    rows = run.query(
        "SELECT rank, coalesce(pid, -1) AS pid, coalesce(tid, -1) AS tid, min(start_ns) AS first_ns, "
        f"count(CASE WHEN kind = '{Kind.STEP}' THEN 1 END) AS steps, "
        f"count(CASE WHEN name LIKE '{_AUTOGRAD_ENGINE}' THEN 1 END) AS backward, "
        f"count(CASE WHEN kind = '{Kind.DATALOADER}' THEN 1 END) AS batches, "
        f"count(CASE WHEN kind = '{GPU_ANNOTATION_KIND}' THEN 1 END) AS annotations, "
        f"count(CASE WHEN kind IN {run.engine.dialect.literals(OVERHEAD_KINDS)} THEN 1 END) AS overhead, count(*) AS slices "
        f"FROM slices WHERE {ON_CPU}{rank_condition(rank)} GROUP BY rank, coalesce(pid, -1), coalesce(tid, -1) "
        "ORDER BY rank, first_ns, pid, tid").rows
    roles: dict[Track, str] = {}
    main_thread: dict[int, tuple[int, int]] = {}  # per rank, the first thread that ran steps
    for rank_, pid, tid, _, steps, *_ in rows:
        if steps and int(rank_) not in main_thread:
            main_thread[int(rank_)] = (int(pid), int(tid))
    workers: dict[int, list[int]] = {}
    for rank_, pid, tid, _, steps, backward, batches, annotated, overhead, slices in rows:
        key = (int(rank_), int(pid), int(tid))
        main = main_thread.get(key[0], (None, None))[0]
        if steps and main_thread.get(key[0]) == (pid, tid):
            roles[key] = MAIN
        elif steps and pid != main and not any(r == key[0] and p == pid for r, p, _ in roles):
            roles[key] = f"{MAIN} (pid {pid})"
        elif backward:
            roles[key] = AUTOGRAD if pid == main else f"{AUTOGRAD} (pid {pid})"
        elif annotated == slices:
            roles[key] = GPU_ANNOTATIONS
        elif overhead == slices:
            roles[key] = PROFILER_OVERHEAD
        elif batches and pid != main:
            numbered = workers.setdefault(key[0], [])
            if pid not in numbered:
                numbered.append(int(pid))
            roles[key] = f"DataLoader worker {numbered.index(int(pid))}"
    return roles
