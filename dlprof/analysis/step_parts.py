"""Where a step's time went, on the host and on its GPUs: the SQL behind
:mod:`dlprof.analysis.steps`' breakdowns.

A slice belongs to a part of the step by what it is (:func:`part_of`): data wait (the loop waiting
for a batch, and a DataLoader fetching one on the step's own thread), communication
(collectives), forward and backward (the layers collector's module slices, autograd's
``evaluate_function`` ops, ranges and regions named ``forward`` or ``backward`` as TorchRec's
``## forward ##``), optimizer (``Optimizer.step``/``zero_grad`` ranges, ``## optimizer ##``),
compile (torch.compile compiling, :attr:`Kind.COMPILE`: set-up, carved out of the forward or
backward it happens in), profiler (dlprof's own pauses, :attr:`Kind.PROFILER`).

**On the host**, every CPU thread of the step's process counts (the main thread, autograd's,
the DataLoader's pin-memory thread): each instant of the step's span goes to the first part in
:data:`PRIORITY` that some thread of the process is in at that instant, and to ``other`` when
none is. So the parts add up to the step's span; a data wait or collective inside a forward,
backward or optimizer slice is carved out of it (a DDP all-reduce launched from a backward hook
is communication), and dlprof's pauses are carved out of everything. A DataLoader fetching on
another thread (pinning a later batch) is work beside the step, not the step waiting.

**On a GPU**, each kernel, memcpy and memset takes the part its runtime call was made in (the
first part in :data:`PRIORITY` open on the calling thread when the call started; ``other`` for
work launched outside every part or linked to no call), and each instant of the step's span on
that GPU goes to the first part of the work running then; with no work running, to ``profiler``
while dlprof holds a thread of the step's process (the GPU waits for a program dlprof paused:
dlprof's time, not the GPU's idleness), else to ``idle``. The parts and idle time add up to the
step's span, and idle is the GPU's own. (The span is the step's span on the host: a GPU running
behind gives a step's last kernels to the next step's span, under their own part.)

Both are sweeps: every slice's start and end, in time order per process (or per GPU), move a
running count of open slices per part, and the time up to the next event goes to the part the
counts name.
"""

from __future__ import annotations

from enum import StrEnum

from dlprof.analysis.sql import DEVICE_KINDS_SQL, ON_CPU, rank_condition
from dlprof.engine.dialect import Dialect
from dlprof.keys import Kind


class StepPart(StrEnum):
    """What a step's time went to, in the breakdown's order."""

    DATA_WAIT = "data_wait"
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    COMMUNICATION = "communication"
    COMPILE = "compile"  # torch.compile compiling: the program's set-up, not its step's work
    PROFILER = "profiler"  # dlprof's own pauses: never the user's time
    OTHER = "other"


# Where threads (or kernels) overlap, the first part here wins: dlprof's pauses over everything,
# compiling over the call it compiles in, a wait for data or a collective over the phase it runs
# inside.
PRIORITY = (StepPart.PROFILER, StepPart.COMPILE, StepPart.DATA_WAIT, StepPart.COMMUNICATION, StepPart.BACKWARD,
            StepPart.FORWARD, StepPart.OPTIMIZER)
IDLE = "idle"  # the GPU breakdown's time with no work running
_UPTO = "ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW"
# TorchRec's and other pipelines' ranges (``## forward ##``) and regions named after a phase.
_PHASE_NAMES = {StepPart.FORWARD: ("forward",), StepPart.BACKWARD: ("backward",),
                StepPart.OPTIMIZER: ("optimizer", "zero_grad")}


def part_of(d: Dialect, on_step_thread: str | None = None) -> str:
    """The part of a slice (a CASE over ``slices``' columns), NULL for a slice of none.

    ``on_step_thread``: a condition true on the threads that hold steps, where a DataLoader's
    fetch is the loop waiting (None: every thread).
    """
    fetch_here = f" AND {on_step_thread}" if on_step_thread else ""
    named = {part: d.literals(tuple(n for name in names for n in (name, f"## {name} ##")))
             for part, names in _PHASE_NAMES.items()}
    ranges = d.literals((Kind.USER_ANNOTATION, Kind.REGION))
    return (
        "CASE "
        f"WHEN kind = '{Kind.PROFILER}' THEN '{StepPart.PROFILER}' "
        f"WHEN kind = '{Kind.COMPILE}' THEN '{StepPart.COMPILE}' "
        f"WHEN kind = '{Kind.DATA_WAIT}' OR (kind = '{Kind.DATALOADER}'{fetch_here}) THEN '{StepPart.DATA_WAIT}' "
        f"WHEN kind = '{Kind.COMM}' THEN '{StepPart.COMMUNICATION}' "
        f"WHEN kind = '{Kind.MODULE}' AND name LIKE '% forward' THEN '{StepPart.FORWARD}' "
        f"WHEN kind = '{Kind.MODULE}' AND name LIKE '% backward' THEN '{StepPart.BACKWARD}' "
        f"WHEN kind = '{Kind.OP}' AND name LIKE 'autograd::engine::evaluate_function:%' THEN '{StepPart.BACKWARD}' "
        f"WHEN kind = '{Kind.USER_ANNOTATION}' AND (name LIKE 'Optimizer.step#%' "
        f"OR name LIKE 'Optimizer.zero_grad#%') THEN '{StepPart.OPTIMIZER}' "
        + "".join(f"WHEN kind IN {ranges} AND name IN {names} THEN '{part}' " for part, names in named.items())
        + "END"
    )


# The parts a sweep counts: the host's (other is what none of them holds) and a GPU's (work
# launched outside every part is busy time all the same).
_HOST_PARTS = tuple(str(p) for p in PRIORITY)
_DEVICE_PARTS = (*_HOST_PARTS, str(StepPart.OTHER))
# A GPU with no work running while dlprof holds the program: swept after every part of work,
# then counted in the profiler part.
_PAUSED = "paused"
_SWEPT_PARTS = (*_DEVICE_PARTS, _PAUSED)


def _counts(part_column: str, parts: tuple[str, ...], sign: int = 1) -> str:
    """One column per part: ``sign`` where ``part_column`` names it, else 0."""
    return ", ".join(f"CASE WHEN {part_column} = '{p}' THEN {sign} ELSE 0 END" for p in parts)


def _winner(parts: tuple[str, ...], suffix: str = "") -> str:
    """The first of ``parts`` whose running count is positive, else NULL."""
    return "CASE " + " ".join(f"WHEN n_{p}{suffix} > 0 THEN '{p}'" for p in parts) + " END"


def _running(partition: str, parts: tuple[str, ...]) -> str:
    """Each part's running count, the step window the sweep is in (odd: inside window
    ``(state - 1) / 2``) and the time to the next event."""
    order = f"PARTITION BY {partition} ORDER BY t, edge"
    sums = ", ".join(f"sum(n_{p}) OVER ({order} {_UPTO}) AS n_{p}" for p in parts)
    return f"{sums}, max(edge) OVER ({order} {_UPTO}) AS state, lead(t) OVER ({order}) - t AS length"


def _sweep(rows: str, steps: str, keys: str, parts: tuple[str, ...]) -> str:
    """Segments of time per ``keys``: each with the part that wins it and the step window it is in.

    ``rows`` has the keys, ``start_ns``, ``end_ns`` and ``part``; ``steps`` the keys,
    ``step_index``, ``start_ns`` and ``end_ns``. Each step's start and end are events with no
    part (edge ``2i + 1`` and ``2i + 2``: at one instant after the rows' starts and ends).
    """
    zeros = ", ".join("0" for _ in parts)
    columns = ", ".join(f"n_{p}" for p in parts)
    events = (
        f"SELECT {keys}, start_ns, 0, {_counts('part', parts)} FROM {rows} AS r1 "
        f"UNION ALL SELECT {keys}, end_ns, 0, {_counts('part', parts, -1)} FROM {rows} AS r2 "
        f"UNION ALL SELECT {keys}, start_ns, 2 * step_index + 1, {zeros} FROM {steps} AS s1 "
        f"UNION ALL SELECT {keys}, end_ns, 2 * step_index + 2, {zeros} FROM {steps} AS s2"
    )
    return (f"SELECT {keys}, {_winner(parts)} AS part, state, length FROM (SELECT {keys}, {_running(keys, parts)} "
            f"FROM ({events}) AS e ({keys}, t, edge, {columns})) AS r")


def _summed(swept: str, keys: str, dialect: Dialect, parts: tuple[str, ...]) -> str:
    """Time per step window and part from a sweep's segments."""
    sums = ", ".join(f"CAST(coalesce(sum(CASE WHEN part = '{p}' THEN length END), 0) AS BIGINT) AS {p}_ns"
                     for p in parts)
    window = dialect.int_div("state - 1", "2")
    return (f"SELECT {keys}, {window} AS step_index, {sums} FROM ({swept}) AS s "
            f"WHERE length > 0 AND state % 2 = 1 GROUP BY {keys}, {window}")


def _classified(d: Dialect, rank: int | None, keys: str, steps: str | None = None) -> str:
    """The CPU slices that belong to a part: the keys, ``start_ns``, ``end_ns``, ``part``. With
    ``steps``, a DataLoader's fetch counts as data wait only on a thread that holds steps."""
    source, on_step_thread = "slices", None
    if steps is not None:
        source = (f"slices LEFT JOIN (SELECT DISTINCT rank AS step_rank, pid AS step_pid, tid AS step_tid "
                  f"FROM {steps} AS st) AS held ON held.step_rank = slices.rank AND held.step_pid = slices.pid "
                  "AND held.step_tid = slices.tid")
        on_step_thread = "held.step_tid IS NOT NULL"
    return (f"(SELECT * FROM (SELECT {keys}, start_ns, start_ns + dur_ns AS end_ns, "
            f"{part_of(d, on_step_thread)} AS part FROM {source} WHERE {ON_CPU}{rank_condition(rank)}) AS c "
            "WHERE part IS NOT NULL)")


def host_parts_sql(d: Dialect, steps: str, rank: int | None) -> str:
    """Per step: ``rank``, ``step_index`` and each part's host time but other's.

    Args:
        d: the engine's dialect.
        steps: a table or parenthesised query of steps (``rank``, ``pid``, ``tid``, ``step_index``,
            ``start_ns``, ``end_ns``); a rank's steps do not overlap.
        rank: only this rank.
    """
    return _summed(_sweep(_classified(d, rank, "rank, pid", steps), steps, "rank, pid", _HOST_PARTS),
                   "rank", d, _HOST_PARTS)


def device_parts_sql(d: Dialect, steps: str, rank: int | None) -> str:
    """Per step and GPU: ``rank``, ``device``, ``step_index``, each part's time (other included;
    profiler's holds the GPU's idle time while dlprof held the program) and ``parts_ns``, their
    sum; idle time is the step's span less ``parts_ns``.

    Args: as :func:`host_parts_sql`.
    """
    # Each piece is named once (a CTE): written out in place, the parquet was read about 26 times.
    classified = "dp_classified"
    columns = ", ".join(f"n_{p}" for p in _HOST_PARTS)
    zeros = ", ".join("0" for _ in _HOST_PARTS)
    # Each call's part: its thread's classified slices swept, read at the call (at one instant
    # ends come before starts, and starts before calls).
    thread_events = (
        f"SELECT rank, pid, tid, end_ns, -1, {_counts('part', _HOST_PARTS, -1)}, CAST(NULL AS BIGINT) "
        f"FROM {classified} AS a "
        f"UNION ALL SELECT rank, pid, tid, start_ns, 0, {_counts('part', _HOST_PARTS)}, CAST(NULL AS BIGINT) "
        f"FROM {classified} AS b "
        f"UNION ALL SELECT rank, pid, tid, start_ns, 1, {zeros}, correlation_id FROM slices "
        f"WHERE kind = '{Kind.RUNTIME}' AND correlation_id IS NOT NULL AND {ON_CPU}{rank_condition(rank)}"
    )
    order = "PARTITION BY rank, pid, tid ORDER BY t, edge"
    at_calls = (f"SELECT rank, correlation_id, {_winner(_HOST_PARTS, '_open')} AS part FROM (SELECT rank, "
                "correlation_id, " + ", ".join(f"sum(n_{p}) OVER ({order} {_UPTO}) AS n_{p}_open" for p in _HOST_PARTS)
                + f" FROM ({thread_events}) AS e (rank, pid, tid, t, edge, {columns}, correlation_id)) AS r "
                "WHERE correlation_id IS NOT NULL")
    work_query = (
        f"(SELECT w.rank, w.device, w.start_ns, w.start_ns + w.dur_ns AS end_ns, "
        f"coalesce(c.part, '{StepPart.OTHER}') AS part FROM slices w LEFT JOIN ({at_calls}) AS c "
        f"ON c.rank = w.rank AND c.correlation_id = w.correlation_id "
        f"WHERE w.kind IN {DEVICE_KINDS_SQL}{rank_condition(rank, 'w.rank')})"
    )
    work, gpus, gpu_steps = "dp_work", "dp_gpus", "dp_gpu_steps"
    gpu_steps_query = (f"(SELECT s.rank, g.device, s.step_index, s.start_ns, s.end_ns FROM {steps} s "
                       f"JOIN {gpus} AS g ON g.rank = s.rank)")
    # dlprof's pauses on the steps' process, on each GPU of its rank: they win an instant only
    # where no work runs (last in the sweep's order).
    paused_query = (
        f"(SELECT p.rank, g.device, p.start_ns, p.start_ns + p.dur_ns AS end_ns, '{_PAUSED}' AS part "
        f"FROM slices p JOIN (SELECT DISTINCT rank, pid FROM {steps} AS sp) AS held "
        "ON held.rank = p.rank AND held.pid = p.pid "
        f"JOIN {gpus} AS g ON g.rank = p.rank WHERE p.kind = '{Kind.PROFILER}' AND coalesce(p.device, 'cpu') = 'cpu'"
        f"{rank_condition(rank, 'p.rank')})"
    )
    rows = "dp_rows"
    rows_query = f"(SELECT * FROM {work} AS w1 UNION ALL SELECT * FROM {paused_query} AS w2)"
    swept = _summed(_sweep(rows, gpu_steps, "rank, device", _SWEPT_PARTS), "rank, device", d, _SWEPT_PARTS)
    columns = ", ".join(f"{p}_ns + {_PAUSED}_ns AS {p}_ns" if p == StepPart.PROFILER else f"{p}_ns"
                        for p in _DEVICE_PARTS)
    held = " + ".join(f"{p}_ns" for p in _SWEPT_PARTS)
    named = {classified: _classified(d, rank, "rank, pid, tid"), work: work_query,
             gpus: f"(SELECT DISTINCT rank, device FROM {work} AS w)", gpu_steps: gpu_steps_query, rows: rows_query}
    ctes = ", ".join(f"{name} AS {query}" for name, query in named.items())
    return f"WITH {ctes} SELECT rank, device, step_index, {columns}, {held} AS parts_ns FROM ({swept}) AS b"
