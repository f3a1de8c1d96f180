"""TAU's flat profile (the layout TAU's ``pprof`` prints): one table per rank and thread (or
stream), and their total and mean. Not Google's pprof format, which :mod:`dlprof.exporters.pprof_proto`
writes.

    profiles = tau_profiles(run)
    profiles[0].functions  # one row per name on the first thread, by inclusive time
    total, mean = function_summaries(profiles)

TAU's ``pprof`` prints, for each node, context and thread, every timer's exclusive and inclusive
time, its calls, the calls it made to other timers (``#Subrs``) and its inclusive time per call.
In dlprof a node is a rank and a thread is one (pid, tid, device) track: a CPU thread or a GPU
stream. Slices already carry their parent and self time, so each table is a group-by on the
engine; one window query finds the slices enclosed by a slice of the same name
(:func:`dlprof.analysis.ancestry.nested_in_same`), because TAU adds only the outermost activation
of a recursive timer to its inclusive time (the inner ones lie within it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum
from typing import Self

import numpy as np
import pandas as pd

from dlprof.analysis.ancestry import nested_in_same
from dlprof.analysis.sql import rank_condition, scope_layer_calls_sql, user_time
from dlprof.analysis.threads import thread_roles
from dlprof.store.reader import Run

# The columns of a TAU profile table, in order; times in nanoseconds.
PROFILE_COLUMNS = [
    "name",
    "time_pct",  # inclusive time as a percentage of the thread's wall time
    "exclusive_ns",
    "inclusive_ns",  # outermost activations only: recursion is not counted twice
    "calls",
    "subrs",  # calls this name made directly to other slices
    "inclusive_per_call_ns",
]

# What names a thread: TAU's node is the rank; the thread is one track of slices.
THREAD_KEYS = ["rank", "pid", "tid", "device"]

# The row TAU's ``pprof -n N`` folds the rows beyond the N-th into.
OTHERS = "-others-"


class SummaryKind(StrEnum):
    """Which summary over threads: TAU's ``FUNCTION SUMMARY (total)`` and ``(mean)``."""

    TOTAL = "total"
    MEAN = "mean"


# eq=False: the generated __eq__ would compare DataFrames, whose == is elementwise and has no truth
# value; two profiles are the same only if they are the same object.
@dataclass(frozen=True, eq=False)
class ThreadProfile:
    """The flat profile of one thread or stream of one rank."""

    rank: int  # TAU's node
    thread: int  # TAU's thread number within its rank (:func:`thread_numbers`)
    pid: int
    tid: int  # the OS thread id, or the stream on a device
    device: str  # "cpu", "cuda:0"
    wall_ns: int  # from the first slice's start to the last slice's end on this track
    functions: pd.DataFrame  # PROFILE_COLUMNS, by inclusive time, descending

    role: str = ""  # what the thread was (:func:`~dlprof.analysis.threads.thread_roles`), if known

    def head(self, limit: int | None, others_ns: float | None = None) -> Self:
        """This profile with at most ``limit`` rows, the rest summed into one ``-others-`` row
        (its inclusive time ``others_ns`` where :func:`folded_inclusive` measured it)."""
        return dataclasses.replace(self, functions=fold_others(self.functions, limit, self.wall_ns, others_ns))


@dataclass(frozen=True, eq=False)
class FunctionSummary:
    """Every thread's table merged by name: summed (total) or summed and divided by threads (mean)."""

    kind: SummaryKind
    threads: int  # how many thread tables were merged
    wall_ns: float  # the threads' wall times, summed or averaged alike
    functions: pd.DataFrame  # PROFILE_COLUMNS; calls and times are fractional in the mean

    def head(self, limit: int | None, others_ns: float | None = None) -> Self:
        """This summary with at most ``limit`` rows, the rest summed into one ``-others-`` row."""
        return dataclasses.replace(self, functions=fold_others(self.functions, limit, self.wall_ns, others_ns))


def tau_profiles(run: Run, rank: int | None = None) -> list[ThreadProfile]:
    """TAU's flat profile of every thread and stream of a run.

    Args:
        run: the run.
        rank: only this rank's threads (None: every rank).

    Returns:
        One profile per (rank, pid, tid, device), ordered by rank, then by thread number
        (:func:`thread_numbers`: CPU threads, then GPU streams, each by first activity). Each
        table has one row per distinct slice name on that track with :data:`PROFILE_COLUMNS`:
        exclusive time is the sum of self times; inclusive time sums only the activations not
        nested in a slice of the same name; ``calls`` counts every activation (the pieces of one
        call of a TensorFlow scope layer as one); ``subrs`` counts
        their direct children; ``time_pct`` is inclusive time over the track's wall time.

    Raises:
        ValueError: two slices of one rank share an id, so parents cannot be told apart.
    """
    only = rank_condition(rank)
    repeated = run.query(f"SELECT rank, id FROM slices WHERE TRUE{only} GROUP BY rank, id "
                         "HAVING count(*) > 1 ORDER BY rank, id LIMIT 1").rows
    if repeated:
        raise ValueError(f"rank {repeated[0][0]}: slice id {repeated[0][1]} is used twice")
    by_name = run.sql(
        f"WITH nesting AS ({nested_in_same('name', f'TRUE{only}')}), "
        f"children AS (SELECT rank, parent_id AS id, count(*) AS subrs FROM slices "
        f"WHERE parent_id IS NOT NULL{only} GROUP BY rank, parent_id), "
        "flat AS (SELECT s.rank, coalesce(s.pid, 0) AS pid, coalesce(s.tid, 0) AS tid, "
        "coalesce(s.device, '') AS device, coalesce(s.name, '') AS name, s.start_ns, coalesce(s.dur_ns, 0) AS dur_ns, "
        f"coalesce({user_time('s')}, 0) AS user_ns, "
        "coalesce(s.self_ns, 0) AS self_ns, coalesce(c.subrs, 0) AS subrs, n.nested, scope_calls.call_key "
        "FROM slices s "
        "JOIN nesting n ON n.rank = s.rank AND n.id = s.id "
        f"LEFT JOIN children c ON c.rank = s.rank AND c.id = s.id "
        f"LEFT JOIN ({scope_layer_calls_sql(run.engine.dialect, rank)}) AS scope_calls "
        f"ON scope_calls.rank = s.rank AND scope_calls.id = s.id WHERE TRUE{rank_condition(rank, 's.rank')}) "
        "SELECT rank, pid, tid, device, name, CAST(sum(self_ns) AS BIGINT) AS exclusive_ns, "
        "CAST(coalesce(sum(user_ns) FILTER (WHERE NOT nested), 0) AS BIGINT) AS inclusive_ns, "
        # The pieces of one call of a TensorFlow scope layer are one call.
        "count(*) - count(call_key) + count(DISTINCT call_key) AS calls, "
        "CAST(sum(subrs) AS BIGINT) AS subrs, min(start_ns) AS first_ns, "
        "max(start_ns + dur_ns) AS last_ns FROM flat GROUP BY rank, pid, tid, device, name"
    )
    if by_name.empty:
        return []
    tracks = by_name.groupby(THREAD_KEYS, sort=False).agg(first_ns=("first_ns", "min"), last_ns=("last_ns", "max"))
    tracks = thread_numbers(tracks.reset_index())
    tracks["wall_ns"] = tracks["last_ns"] - tracks["first_ns"]
    columns = ["name", "exclusive_ns", "inclusive_ns", "calls", "subrs"]
    tables = {key: table[columns].astype({c: "int64" for c in columns[1:]})
              for key, table in by_name.groupby(THREAD_KEYS, sort=False)}
    roles = thread_roles(run, rank)
    profiles = []
    for track in tracks.itertuples(index=False):
        key = (track.rank, track.pid, track.tid, track.device)
        profiles.append(
            ThreadProfile(
                rank=int(track.rank),
                thread=int(track.thread),
                pid=int(track.pid),
                tid=int(track.tid),
                device=str(track.device),
                wall_ns=int(track.wall_ns),
                functions=_finish(tables[key], float(track.wall_ns)),
                role=roles.get((int(track.rank), int(track.pid), int(track.tid)), "") if track.device == "cpu" else "",
            )
        )
    return profiles


def thread_numbers(tracks: pd.DataFrame) -> pd.DataFrame:
    """TAU's thread numbers, the one numbering ``dlprof pprof`` and the TAU export share.

    Within a rank, its CPU threads come first, then its GPU streams (TAU's "virtual threads"),
    each in order of first activity (thread 0 is the main thread, as a rule); the keys break ties
    so the numbering does not change between two readings of one run.

    Args:
        tracks: one row per track: :data:`THREAD_KEYS` and ``first_ns``.

    Returns:
        The tracks in thread order, with a ``thread`` column counting from 0 within each rank.
    """
    on_device = ~tracks["device"].isin(["", "cpu"])
    ordered = tracks.assign(on_device=on_device).sort_values(["rank", "on_device", "first_ns", "pid", "device", "tid"])
    ordered["thread"] = ordered.groupby("rank").cumcount()
    return ordered.drop(columns="on_device")


def function_summaries(profiles: list[ThreadProfile]) -> list[FunctionSummary]:
    """TAU's summaries over threads: every thread's rows merged by name, then the mean.

    As in TAU, the mean divides by the number of threads, including those on which a name never
    ran, and percentages are of the threads' wall times summed (or averaged: the ratio is the
    same).

    Args:
        profiles: the thread profiles to merge, from :func:`tau_profiles`.

    Returns:
        The total and the mean summary, in that order; empty when there are no profiles.
    """
    if not profiles:
        return []
    merged = pd.concat([p.functions for p in profiles], ignore_index=True)
    summed = merged.groupby("name", sort=False).agg(
        exclusive_ns=("exclusive_ns", "sum"),
        inclusive_ns=("inclusive_ns", "sum"),
        calls=("calls", "sum"),
        subrs=("subrs", "sum"),
    ).reset_index()
    wall_ns = float(sum(p.wall_ns for p in profiles))
    count = len(profiles)
    mean = summed.copy()
    for column in ("exclusive_ns", "inclusive_ns", "calls", "subrs"):
        mean[column] = mean[column].astype("float64") / count
    return [
        FunctionSummary(SummaryKind.TOTAL, count, wall_ns, _finish(summed, wall_ns)),
        FunctionSummary(SummaryKind.MEAN, count, wall_ns / count, _finish(mean, wall_ns / count)),
    ]


def fold_others(functions: pd.DataFrame, limit: int | None, wall_ns: float,
                inclusive_ns: float | None = None) -> pd.DataFrame:
    """The first ``limit`` rows of a TAU profile table and, below them, the rest summed as ``-others-``.

    This is what TAU's ``pprof -n`` prints. TAU's ``-others-`` inclusive time is a plain sum, which
    counts a slice nested in another folded one twice and can read over 100%; given the time the
    folded slices cover (``inclusive_ns``, :func:`folded_inclusive`), that is shown instead.

    Args:
        functions: a table with :data:`PROFILE_COLUMNS`, sorted.
        limit: rows to keep (None or 0: all, and no ``-others-`` row).
        wall_ns: the wall time the percentages are of.
        inclusive_ns: the folded rows' inclusive time, each nested slice counted once; None for
            the plain sum.

    Returns:
        A table with at most ``limit + 1`` rows.
    """
    if not limit or len(functions) <= limit:
        return functions
    rest = functions.iloc[limit:]
    calls = rest["calls"].sum()
    inclusive = rest["inclusive_ns"].sum() if inclusive_ns is None else inclusive_ns
    others = pd.DataFrame(
        {
            "name": [OTHERS],
            "time_pct": [100.0 * inclusive / wall_ns if wall_ns else 0.0],
            "exclusive_ns": [rest["exclusive_ns"].sum()],
            "inclusive_ns": [inclusive],
            "calls": [calls],
            "subrs": [rest["subrs"].sum()],
            "inclusive_per_call_ns": [inclusive / calls if calls else 0.0],
        }
    )
    kept = functions.iloc[:limit]
    return pd.concat([kept, others.astype(kept.dtypes.to_dict())], ignore_index=True)


def folded_inclusive(run: Run, profiles: list[ThreadProfile], limit: int, rank: int | None = None
                     ) -> tuple[dict[tuple[int, int, int, str], int], int]:
    """The time the rows each ``-others-`` row folds cover, a slice nested in another folded one
    counted once: per thread (names past its ``limit`` first), and over all threads for the
    total summary (names past the summary's ``limit`` first).

    Args:
        run: the run.
        profiles: every thread's profile, whole (:func:`tau_profiles`).
        limit: the rows each table keeps.
        rank: the rank the profiles are of (None: every rank).

    Returns:
        Per thread (:data:`THREAD_KEYS`), and for the total summary, the folded slices' time.
    """
    dialect = run.engine.dialect
    kept = [(p.rank, p.pid, p.tid, p.device, str(name)) for p in profiles for name in p.functions["name"].head(limit)]
    total = function_summaries(profiles)
    summary_kept = list(total[0].functions["name"].head(limit)) if total else []
    if not kept:
        return {}, 0
    listed = " UNION ALL ".join(
        f"SELECT {r} AS rank, {pid} AS pid, {tid} AS tid, {dialect.literal(d)} AS device, {dialect.literal(n)} AS name"
        for r, pid, tid, d, n in kept)
    in_summary = dialect.literals(tuple(summary_kept)) if summary_kept else "('')"
    track = "rank, pid, tid, device"
    marked = (
        "SELECT s.rank, coalesce(s.pid, 0) AS pid, coalesce(s.tid, 0) AS tid, coalesce(s.device, '') AS device, "
        "s.start_ns, coalesce(s.dur_ns, 0) AS dur_ns, "
        f"coalesce({user_time('s')}, 0) AS user_ns, coalesce(s.depth, 0) AS depth, s.id, "
        "k.name IS NULL AS folded, coalesce(s.name, '') NOT IN " + in_summary + " AS summary_folded "
        "FROM slices s LEFT JOIN (" + listed + ") AS k ON k.rank = s.rank AND k.pid = coalesce(s.pid, 0) "
        "AND k.tid = coalesce(s.tid, 0) AND k.device = coalesce(s.device, '') AND k.name = coalesce(s.name, '') "
        f"WHERE TRUE{rank_condition(rank, 's.rank')}"
    )
    ends = "max(start_ns + dur_ns) OVER (PARTITION BY {track}, {flag} ORDER BY start_ns, dur_ns DESC, depth, id " \
           "ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)"
    rows = run.query(
        f"WITH marked AS ({marked}), nested AS (SELECT *, coalesce({ends.format(track=track, flag='folded')} "
        f"> start_ns, FALSE) AS inside, coalesce({ends.format(track=track, flag='summary_folded')} > start_ns, FALSE) "
        "AS summary_inside FROM marked) "
        # The user's time, as the table's inclusive times (dlprof's pauses left out).
        f"SELECT {track}, CAST(coalesce(sum(user_ns) FILTER (WHERE folded AND NOT inside), 0) AS BIGINT), "
        "CAST(coalesce(sum(user_ns) FILTER (WHERE summary_folded AND NOT summary_inside), 0) AS BIGINT) "
        f"FROM nested GROUP BY {track} ORDER BY {track}").rows
    per_thread = {(int(r), int(pid), int(tid), str(d)): int(ns) for r, pid, tid, d, ns, _ in rows}
    return per_thread, sum(int(ns) for *_, ns in rows)


def _finish(table: pd.DataFrame, wall_ns: float) -> pd.DataFrame:
    """Add the derived columns to per-name sums and sort as TAU does (inclusive, descending)."""
    table = table.assign(
        time_pct=100.0 * table["inclusive_ns"] / wall_ns if wall_ns else 0.0,
        inclusive_per_call_ns=table["inclusive_ns"] / table["calls"].where(table["calls"] > 0),
    )
    table["inclusive_per_call_ns"] = table["inclusive_per_call_ns"].fillna(0.0).astype("float64")
    table = table.sort_values(
        ["inclusive_ns", "name"], ascending=[False, True], kind="stable"
    ).reset_index(drop=True)
    return table[PROFILE_COLUMNS]


def parent_positions(slices: pd.DataFrame) -> np.ndarray:
    """For each slice, the row position of its parent in ``slices``, or -1 for a root.

    Ids are looked up within the slice's rank: the store makes them unique across ranks, but a
    hand-made or imported store need only keep them unique within one.
    """
    ranks = slices["rank"].astype("int64").to_numpy()
    keys = pd.MultiIndex.from_arrays([ranks, slices["id"].astype("int64").to_numpy()])
    if not keys.is_unique:
        repeated = keys[keys.duplicated()][0]
        raise ValueError(f"rank {repeated[0]}: slice id {repeated[1]} is used twice")
    parent_ids = slices["parent_id"].astype("Int64").fillna(-1).to_numpy(dtype=np.int64)
    wanted = pd.MultiIndex.from_arrays([ranks, parent_ids])
    # A parent missing from the table (cut off by a rank filter, say) makes its child a root.
    return np.asarray(keys.get_indexer(wanted), dtype=np.int64)


def outermost_of_name(parent: np.ndarray, name_code: np.ndarray) -> np.ndarray:
    """True for each slice with no ancestor of the same name.

    Walks every slice's ancestors one level per pass, all slices at once, so the cost is the
    depth of the deepest slice times a vector operation, not a Python loop per slice.
    """
    nested = np.zeros(len(parent), dtype=bool)
    ancestor = parent.copy()
    active = np.flatnonzero(ancestor >= 0)
    # A damaged store could link parents in a loop; no chain is longer than the slice count.
    for _ in range(len(parent)):
        if active.size == 0:
            break
        above = ancestor[active]
        nested[active] |= name_code[above] == name_code[active]
        ancestor[active] = parent[above]
        active = active[(ancestor[active] >= 0) & ~nested[active]]
    return ~nested
