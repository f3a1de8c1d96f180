"""SQL that several analyses share: which slices are device work, which CPU op launched it, and
what of a slice's time was the user's (not dlprof's own pauses).

Each helper returns a query (or a condition) over the run's views, in the SQL both engines speak
(:mod:`dlprof.engine.dialect`), for an analysis to put in a ``WITH`` clause::

    f"WITH launched AS ({launched_by_op()}) SELECT ... FROM slices s LEFT JOIN launched l ..."
"""

from __future__ import annotations

from dlprof.engine.dialect import Dialect
from dlprof.keys import DEVICE_KINDS, SCOPE_LAYER_CATEGORY, Kind

DEVICE_KINDS_SQL = "(" + ", ".join(f"'{k}'" for k in sorted(DEVICE_KINDS)) + ")"
# A slice on a CPU thread, as nesting decides (a missing device is the CPU).
ON_CPU = "coalesce(device, 'cpu') = 'cpu'"


# dlprof's own pauses of the program (a save, a profiler cycle's stop and start): slices of
# their own kind, never the user's time.
IS_PAUSE = f"kind = '{Kind.PROFILER}'"


def user_time(alias: str = "") -> str:
    """A slice's time less dlprof's own pauses inside it: the user's time, wherever an analysis
    shows a slice's total time (``pause_ns`` was computed once, when the run was written; runs
    written before it read null). Self time needs nothing: a pause is a child of the slice it
    fell in, so the store's ``self_ns`` already leaves it out.

    Args:
        alias: the table alias of ``slices`` in the query (``s``), or none.
    """
    column = f"{alias}." if alias else ""
    return f"({column}dur_ns - coalesce({column}pause_ns, 0))"


def rank_condition(rank: int | None, column: str = "rank") -> str:
    """`` AND rank = N`` for one rank, nothing for every rank."""
    return "" if rank is None else f" AND {column} = {int(rank)}"


def launch_calls(with_parent: bool = True) -> str:
    """The runtime call (``cudaLaunchKernel``...) behind each correlation id of each rank.

    Args:
        with_parent: only calls inside an op (as the launching op is wanted), else every call.

    Returns:
        A query of ``rank``, ``correlation_id``, ``parent_id``, ``start_ns``, ``dur_ns``. CUPTI
        numbers a process's calls one by one, so a correlation id names one call per rank (no
        trace dlprof reads repeats one); the query relies on it rather than paying to check.
    """
    parent = " AND parent_id IS NOT NULL" if with_parent else ""
    return (
        "SELECT rank, correlation_id, parent_id, start_ns, dur_ns FROM slices "
        f"WHERE kind = '{Kind.RUNTIME}' AND correlation_id IS NOT NULL{parent}"
    )


def launches_sql(rank: int | None = None) -> str:
    """Each device slice (kernel, memcpy, memset) with the CPU op that launched it.

    Returns:
        A query of ``rank``, ``id`` (the device slice), ``dur_ns`` and ``launcher_id`` (the op;
        NULL when the trace links none).
    """
    return (
        f"SELECT w.rank, w.id, w.dur_ns, c.parent_id AS launcher_id FROM slices w "
        f"LEFT JOIN ({launch_calls()}) AS c ON w.rank = c.rank AND w.correlation_id = c.correlation_id "
        f"WHERE w.kind IN {DEVICE_KINDS_SQL}{rank_condition(rank, 'w.rank')}"
    )


def launched_by_op(rank: int | None = None) -> str:
    """Device time per op that launched it: a query of ``rank``, ``id`` (the op), ``device_ns``."""
    return (
        f"SELECT c.rank, c.parent_id AS id, CAST(sum(w.dur_ns) AS BIGINT) AS device_ns FROM slices w "
        f"JOIN ({launch_calls()}) AS c ON w.rank = c.rank AND w.correlation_id = c.correlation_id "
        f"WHERE w.kind IN {DEVICE_KINDS_SQL}{rank_condition(rank, 'w.rank')} GROUP BY c.rank, c.parent_id"
    )


def steps_sql(rank: int | None = None) -> str:
    """The CPU's training steps: ``rank``, ``name``, ``start_ns``, ``end_ns`` and ``step_index``
    (the step's position among its rank's steps, by start)."""
    return (
        "SELECT rank, name, start_ns, start_ns + dur_ns AS end_ns, CAST(row_number() OVER ("
        "PARTITION BY rank ORDER BY start_ns, pid, tid, dur_ns DESC, id) - 1 AS BIGINT) AS step_index "
        f"FROM slices WHERE kind = '{Kind.STEP}' AND device = 'cpu'{rank_condition(rank)}"
    )


def scope_layer_calls_sql(dialect: Dialect, rank: int | None = None) -> str:
    """The call each piece of a layer derived from TensorFlow name scopes belongs to: ``rank``,
    ``id`` and ``call_key``, one key per step (negative, apart from slice ids); a piece outside
    every step has none. TensorFlow's executor interleaves a layer's ops with others' (variable
    reads, the optimizer's updates), so one call of a layer (one batch) is several slices."""
    pieces = (f"SELECT rank, id, start_ns AS t FROM slices WHERE kind = {dialect.literal(str(Kind.MODULE))} "
              f"AND category = {dialect.literal(SCOPE_LAYER_CATEGORY)}{rank_condition(rank)}")
    return (f"SELECT rank, id, -1 - step_index AS call_key FROM ({step_at_sql(dialect, pieces, rank)}) AS placed "
            "WHERE step_index IS NOT NULL")


def step_at_sql(dialect: Dialect, items: str, rank: int | None = None) -> str:
    """The CPU step each item fell in by time: ``rank``, ``id``, ``step_index`` and ``step`` (the
    step's name), both null for an item outside every step.

    ``items`` is a query of ``rank``, ``id`` and ``t``. The items and the steps' starts go in time
    order per rank (a step first at an equal time): an item is in the last step started at or
    before its ``t``, if that step had not ended by then.
    """
    marks = (
        "SELECT rank, start_ns AS t, 0 AS is_item, step_index, end_ns AS step_end, name AS step_name, "
        f"CAST(NULL AS BIGINT) AS id FROM ({steps_sql(rank)}) AS steps "
        "UNION ALL SELECT rank, t, 1 AS is_item, CAST(NULL AS BIGINT), CAST(NULL AS BIGINT), CAST(NULL AS STRING), id "
        f"FROM ({items}) AS items"
    )
    frame = "OVER (PARTITION BY rank ORDER BY t, is_item ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)"
    placed = (
        f"SELECT rank, id, t, is_item, {dialect.last_non_null('step_index')} {frame} AS step_index, "
        f"{dialect.last_non_null('step_end')} {frame} AS step_end, "
        f"{dialect.last_non_null('step_name')} {frame} AS step_name FROM ({marks}) AS marks"
    )
    return (
        "SELECT rank, id, CASE WHEN t < step_end THEN step_index END AS step_index, "
        f"CASE WHEN t < step_end THEN step_name END AS step FROM ({placed}) AS placed WHERE is_item = 1"
    )
