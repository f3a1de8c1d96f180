"""Device time of host slices: the kernels, copies and memsets each op, layer, region or step
launched, inclusive and self.

    times = device_times(run, Kind.MODULE)     # rank, id, device_ns, self_device_ns per layer call

A piece of device work is tied to the runtime call that launched it (``cudaLaunchKernel``...) by
its correlation id, within a rank. A slice's *inclusive* device time is the device time of every
runtime call made inside it:

- ops, layers and every other kind nest on their own thread, so a call is inside one when it
  starts on that slice's thread within its span (the store's nesting puts a thread's slices
  inside one another, so that is its subtree). A layer's backward is the layers collector's
  slice on the thread autograd ran it on, so its device time is the work autograd launched
  there while it ran. (Autograd's sequence numbers say the same: each backward node carries the
  number of the forward op that made it, and on the H200 run the two attributions agree to the
  nanosecond for every block and its sublayers; the slices also hold what no forward op made,
  the gradient accumulation into parameters and a backward hook's collectives, so they are the
  ones used.)
- steps and regions hold the whole process while they last (the step's backward runs on
  autograd's thread, its batch may be pinned on the DataLoader's), so a call is inside one when it
  starts within its span on any thread of its process.

A slice's *self* device time is its inclusive time less that of the slices of its own kind
directly inside it: an op's own launches (and those of the runtime calls and Python frames
under it, but no inner op's), a layer's outside its sublayers, as a layer's self time is.

Inclusive time is one sweep per thread (per process for steps and regions) over the slices'
edges and the calls in time order: a running sum of the calls' device time, read at each
slice's end and start. Self time places each slice under its innermost ancestor of its kind
(:func:`dlprof.analysis.ancestry.nearest_ancestor`). Both are a fixed number of sorts whatever
the depth.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlprof.analysis.ancestry import nearest_ancestor, nested_in_same
from dlprof.analysis.sql import DEVICE_KINDS_SQL, ON_CPU, rank_condition
from dlprof.engine.dialect import Dialect
from dlprof.keys import Kind

if TYPE_CHECKING:
    import pandas as pd

    from dlprof.store.reader import Run

# Kinds whose slices hold their whole process while they last, not only their thread.
PROCESS_WIDE_KINDS = (Kind.STEP, Kind.REGION)
DEVICE_TIME_COLUMNS = ["rank", "id", "device_ns", "self_device_ns"]


def calls_with_device_time_sql(rank: int | None = None) -> str:
    """Each runtime call that launched device work, with that work's time: a query of ``rank``,
    ``pid``, ``tid``, ``id``, ``start_ns`` and ``device_ns``.

    CUPTI numbers a process's calls one by one, so a correlation id names one call per rank (as
    :func:`dlprof.analysis.sql.launch_calls` relies on); several pieces of work may share it (a
    CUDA graph's kernels), and their times add up.
    """
    work = (f"SELECT rank, correlation_id, sum(dur_ns) AS device_ns FROM slices "
            f"WHERE kind IN {DEVICE_KINDS_SQL} AND correlation_id IS NOT NULL{rank_condition(rank)} "
            "GROUP BY rank, correlation_id")
    return (
        "SELECT c.rank, c.pid, c.tid, c.id, c.start_ns, w.device_ns FROM slices c "
        f"JOIN ({work}) AS w ON w.rank = c.rank AND w.correlation_id = c.correlation_id "
        f"WHERE c.kind = '{Kind.RUNTIME}'{rank_condition(rank, 'c.rank')}"
    )


def inclusive_device_time_sql(selected: str, process_wide: bool, rank: int | None = None) -> str:
    """The device time launched inside each selected CPU slice (see the module's docstring).

    Args:
        selected: a condition over ``slices``: which CPU slices get a figure.
        process_wide: count the calls of every thread of a slice's process (steps, regions),
            else only those of its own thread.
        rank: only this rank's slices.

    Returns:
        A query of ``rank``, ``id``, ``device_ns`` (0 for a slice that launched nothing).
    """
    track = "rank, pid" if process_wide else "rank, pid, tid"
    chosen = f"({selected}) AND {ON_CPU}{rank_condition(rank)}"
    # At one instant ends come first (a slice starting as another ends is not inside it), then
    # starts, then calls (a call at a slice's start is inside it).
    edges = (
        f"SELECT rank, pid, tid, start_ns + dur_ns AS t, 0 AS edge, id, -1 AS sign, "
        f"CAST(0 AS BIGINT) AS device_ns FROM slices WHERE {chosen} "
        f"UNION ALL SELECT rank, pid, tid, start_ns, 1, id, 1, CAST(0 AS BIGINT) FROM slices WHERE {chosen} "
        f"UNION ALL SELECT rank, pid, tid, start_ns, 2, CAST(NULL AS BIGINT), 0, CAST(device_ns AS BIGINT) "
        f"FROM ({calls_with_device_time_sql(rank)}) AS calls"
    )
    swept = (
        f"SELECT rank, id, sign, sum(device_ns) OVER (PARTITION BY {track} ORDER BY t, edge "
        f"ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS launched FROM ({edges}) AS e"
    )
    # Launched by the end less launched by the start.
    return (f"SELECT rank, id, CAST(-sum(sign * launched) AS BIGINT) AS device_ns FROM ({swept}) AS s "
            "WHERE id IS NOT NULL GROUP BY rank, id")


def device_time_sql(dialect: Dialect, kind: str, rank: int | None = None) -> str:
    """Inclusive and self device time of every CPU slice of one kind.

    Args:
        dialect: the engine's dialect.
        kind: the slices' kind (``op``, ``module``, ``region``, ``step``...).
        rank: only this rank's slices.

    Returns:
        A query of :data:`DEVICE_TIME_COLUMNS`, one row per CPU slice of ``kind``.
    """
    of_kind = f"kind = {dialect.literal(str(kind))}"
    inclusive = inclusive_device_time_sql(of_kind, kind in PROCESS_WIDE_KINDS, rank)
    placed = nearest_ancestor(dialect, of_kind, rank, among=of_kind)
    inner = (f"SELECT p.rank, p.ancestor_id AS id, sum(i.device_ns) AS inner_ns FROM ({placed}) AS p "
             "JOIN inclusive i ON i.rank = p.rank AND i.id = p.id WHERE p.ancestor_id IS NOT NULL "
             "GROUP BY p.rank, p.ancestor_id")
    return (
        f"WITH inclusive AS ({inclusive}) "
        "SELECT i.rank, i.id, i.device_ns, CAST(greatest(i.device_ns - coalesce(n.inner_ns, 0), 0) AS BIGINT) "
        f"AS self_device_ns FROM inclusive i LEFT JOIN ({inner}) AS n ON n.rank = i.rank AND n.id = i.id"
    )


def device_times(run: Run, kind: str, rank: int | None = None) -> pd.DataFrame:
    """Inclusive and self device time of every CPU slice of one kind (see the module's docstring).

    Args:
        run: the run.
        kind: the slices' kind.
        rank: only this rank's slices.

    Returns:
        :data:`DEVICE_TIME_COLUMNS`, one row per slice, in no order; zeros on a run without
        device work.
    """
    table = run.sql(f"SELECT * FROM ({device_time_sql(run.engine.dialect, kind, rank)}) AS d")
    return table.astype({"rank": "int64", "id": "int64", "device_ns": "int64", "self_device_ns": "int64"})


def grouped_device_time_sql(dialect: Dialect, selection: str, keys: list[str], kind: str,
                            rank: int | None = None) -> str:
    """Device time per group of selected slices of one kind, as ``dlprof top`` shows it.

    Args:
        dialect: the engine's dialect.
        selection: a query of the selected slices with ``rank``, ``id`` and the ``keys``.
        keys: the columns that make a group (``name``, ``input_shapes``).
        kind: the selected slices' kind.
        rank: only this rank's slices.

    Returns:
        A query of the keys, ``device_ns`` (inclusive: the work launched inside any slice of the
        group, once, however the group's slices nest in one another, as an op dispatched to
        itself under autocast does) and ``self_device_ns``.
    """
    key_list = ", ".join(f"s.{k}" for k in keys)
    same = ", ".join("coalesce(input_shapes, '')" if k == "input_shapes" else k for k in keys)
    nested = nested_in_same(same, f"kind = {dialect.literal(str(kind))}")
    return (
        f"SELECT {key_list}, CAST(sum(CASE WHEN n.nested THEN 0 ELSE d.device_ns END) AS BIGINT) AS device_ns, "
        f"CAST(sum(d.self_device_ns) AS BIGINT) AS self_device_ns FROM ({selection}) AS s "
        f"JOIN ({device_time_sql(dialect, kind, rank)}) AS d ON d.rank = s.rank AND d.id = s.id "
        f"LEFT JOIN ({nested}) AS n ON n.rank = s.rank AND n.id = s.id GROUP BY {key_list}"
    )
