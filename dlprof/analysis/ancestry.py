"""Walking up the nesting the store precomputed, as window queries: for each slice, its innermost
ancestor of some kind, or whether an ancestor shares its name.

The store nests each CPU thread's slices once (:mod:`dlprof.store.nesting`): children lie within
their parent, and in track order (start, then longer first, then shallower first) a slice's
ancestors are exactly the earlier slices of its thread that have not ended when it starts. So an
ancestor test needs no walk up the parent links, whose length is the nesting's depth: it is a
running count or a running maximum over the thread in that order, which both engines compute in
one sort. Device streams never nest: their slices have no ancestors.

    f"WITH enclosing AS ({nearest_ancestor(\"kind = 'op'\")}) SELECT ..."   # id, rank, ancestor_id
"""

from __future__ import annotations

from dlprof.analysis.sql import ON_CPU, rank_condition
from dlprof.engine.dialect import Dialect

# A thread, and the order of its slices in which ancestors come before what they hold.
TRACK = "rank, pid, tid"
TRACK_ORDER = "start_ns, dur_ns DESC, depth, id"
_BEFORE = "ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING"


def nested_in_same(key: str, where: str = "TRUE") -> str:
    """Whether each slice lies inside an earlier one with the same ``key`` on its thread.

    Args:
        key: an expression over ``slices`` (``name``, ``kind``).
        where: which slices take part (both as the nested and as the enclosing ones).

    Returns:
        A query of ``rank``, ``id``, ``nested`` (a boolean; false on device streams).
    """
    return (
        f"SELECT rank, id, CASE WHEN {ON_CPU} THEN coalesce(max(start_ns + dur_ns) OVER ("
        f"PARTITION BY {TRACK}, {ON_CPU}, {key} ORDER BY {TRACK_ORDER} {_BEFORE}) > start_ns, FALSE) "
        f"ELSE FALSE END AS nested FROM slices WHERE {where}"
    )


def nearest_ancestor(dialect: Dialect, wanted: str, rank: int | None = None, among: str = "TRUE") -> str:
    """The innermost ancestor of each CPU slice for which ``wanted`` holds.

    Two window passes. The first (:func:`open_levels`) counts, for each slice, the wanted slices
    open when it starts on its thread: its level among them. The second finds, among the wanted
    slices whose own level is one less, the last one before it in track order, which is its
    innermost wanted ancestor (any later one at that level would lie inside that one, and so be
    deeper).

    Args:
        dialect: the engine's dialect.
        wanted: a condition over ``slices`` (``kind = 'op'``).
        rank: only this rank's slices (None: every rank).
        among: only these slices take part, as the ones asking and as the ancestors (the
            layers among layers: one sort of a few rows instead of the whole table).

    Returns:
        A query with one row per CPU slice taking part: ``rank``, ``id``, ``dur_ns``, ``is_wanted`` (whether
        ``wanted`` holds for the slice itself), ``ancestor_id`` (its innermost wanted ancestor,
        NULL for none) and ``own_id`` (the slice itself when wanted, else ``ancestor_id``).
    """
    lookups = (
        "SELECT rank, pid, tid, level AS seeks, start_ns, dur_ns, depth, id, id AS found, FALSE AS asks "
        "FROM levels WHERE candidate "
        "UNION ALL SELECT rank, pid, tid, level - 1 AS seeks, start_ns, dur_ns, depth, id, NULL AS found, TRUE AS asks "
        "FROM levels WHERE level > 0"
    )
    last = dialect.last_non_null("found")
    return (
        f"WITH levels AS ({open_levels(wanted, rank, among)}), lookups AS ({lookups}), "
        f"answers AS (SELECT rank, id, asks, {last} OVER (PARTITION BY {TRACK}, seeks ORDER BY {TRACK_ORDER} "
        f"{_BEFORE}) AS ancestor_id FROM lookups) "
        "SELECT l.rank, l.id, l.dur_ns, l.is_wanted, a.ancestor_id, "
        "CASE WHEN l.is_wanted THEN l.id ELSE a.ancestor_id END AS own_id "
        "FROM levels l LEFT JOIN answers a ON a.asks AND a.rank = l.rank AND a.id = l.id"
    )


def open_levels(wanted: str, rank: int | None = None, among: str = "TRUE") -> str:
    """How many slices for which ``wanted`` holds are open on its thread as each CPU slice starts.

    Ends sort before starts at the same instant (a slice starting as another ends is not inside
    it), and zero-length slices hold nothing, so they are never counted as open.

    Args:
        wanted: a condition over ``slices`` (``kind = 'module'``).
        rank: only this rank's slices (None: every rank).
        among: only these slices take part (see :func:`nearest_ancestor`).

    Returns:
        A query with one row per CPU slice taking part: ``rank``, ``pid``, ``tid``, ``id``, ``start_ns``,
        ``dur_ns``, ``depth``, ``candidate`` (wanted and not zero-length), ``is_wanted``,
        ``opens`` (always true) and ``level`` (the wanted slices open around it; a candidate's own
        level is its depth among them, from 0).
    """
    selected = f"{ON_CPU}{rank_condition(rank)} AND ({among})"
    # Zero-length slices hold nothing (nesting ends a slice at its end, before anything starts there).
    candidate = f"({wanted}) AND dur_ns > 0"
    events = (
        f"SELECT rank, pid, tid, start_ns AS t, 1 AS edge, -dur_ns AS longer, depth, id, "
        f"CASE WHEN {candidate} THEN 1 ELSE 0 END AS delta, TRUE AS opens, "
        f"CASE WHEN {candidate} THEN TRUE ELSE FALSE END AS candidate, "
        f"CASE WHEN {wanted} THEN TRUE ELSE FALSE END AS is_wanted, start_ns, dur_ns "
        f"FROM slices WHERE {selected} "
        f"UNION ALL SELECT rank, pid, tid, start_ns + dur_ns AS t, 0 AS edge, 0 AS longer, 0 AS depth, id, "
        f"-1 AS delta, FALSE AS opens, FALSE AS candidate, FALSE AS is_wanted, start_ns, dur_ns "
        f"FROM slices WHERE {selected} AND {candidate}"
    )
    return (
        f"SELECT * FROM (SELECT rank, pid, tid, id, start_ns, dur_ns, depth, candidate, is_wanted, opens, "
        f"coalesce(sum(delta) OVER (PARTITION BY {TRACK} ORDER BY t, edge, longer, depth, id {_BEFORE}), 0) "
        f"AS level FROM ({events}) AS events) AS counted WHERE opens"
    )
