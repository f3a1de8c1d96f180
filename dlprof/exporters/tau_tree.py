"""The run's slices as TAU's timers, for :mod:`dlprof.exporters.tau`: flat names and callpaths per
thread, each thread under one top-level timer, with TIME and the metrics table's values::

    tree = SliceTree(run, tracks)
    tables = tree.functions(metric_values(tree, samples, ["TIME", "perf:task-clock"]), walls)

What TAU's readers need, and how it is given them:

* **A top-level timer per thread**, :data:`APPLICATION` (``.TAU application``, as TAU names its
  own): it holds the thread's whole time, from its first slice's start to its last slice's end,
  and every callpath starts with it. ParaProf and pprof give a timer's percentage of the
  largest inclusive value on the thread; without it that would be the longest slice's, where
  ``dlprof pprof`` gives a share of the thread's time.
* **Steps without their number in callpaths**: a step slice is ``ProfilerStep#41`` as a flat
  timer, ``ProfilerStep`` in a callpath, so ParaProf's call graph adds up the work of every step
  under one node rather than one per step.
* **Metric values consistent with time**: the metrics table may hold a value for a slice (a
  layer, a step) and none for the slices inside it (its ops). A slice without a value under one
  with a value gets a share of what its measured ancestor's value leaves to unmeasured slices,
  in proportion to its time, so that exclusive = inclusive - children's inclusive holds for a
  metric as for time, and a layer's exclusive value is its share alone, not its ops' too.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

# The private helpers are pprof's own walk of the slice tree; the TAU file must count exactly
# as ``dlprof pprof`` prints, so it uses them rather than a copy.
from dlprof.analysis.pprof import outermost_of_name, parent_positions
from dlprof.exporters.tau_format import clean_name, group_of_kind, join_path
from dlprof.keys import Kind
from dlprof.store.reader import Run

APPLICATION = ".TAU application"  # TAU's own top-level timer of every thread
APPLICATION_GROUP = "TAU_DEFAULT"
_STEP_NUMBER = re.compile(r"\s*#\s*\d+\s*$")


class SliceTree:
    """The run's slices as arrays: TAU thread, parent, cleaned name and callpath of each."""

    def __init__(self, run: Run, track_keys: list[tuple[int, int, int, str]]) -> None:
        """Args:
            run: the run.
            track_keys: (rank, pid, tid, device) of each TAU thread, in file order.
        """
        slices = run.slices
        rank = slices["rank"].astype("int64").to_numpy()
        keys = pd.MultiIndex.from_arrays([
            rank,
            slices["pid"].fillna(0).astype("int64").to_numpy(),
            slices["tid"].fillna(0).astype("int64").to_numpy(),
            slices["device"].fillna("").astype(str).to_numpy(),
        ])
        known = pd.MultiIndex.from_tuples(track_keys)
        self.track = np.asarray(known.get_indexer(keys), dtype=np.int64)  # index into the tracks
        self.tracks = len(track_keys)
        self.parent = parent_positions(slices)
        self.ids = pd.MultiIndex.from_arrays([rank, slices["id"].astype("int64").to_numpy()])
        # The user's time: dlprof's own pauses inside a slice are not its (their own timers hold them).
        self.dur_ns = (slices["dur_ns"].fillna(0) - slices["pause_ns"].fillna(0)).astype("int64").to_numpy()
        self.self_ns = slices["self_ns"].fillna(0).astype("int64").to_numpy()
        self.children = np.bincount(self.parent[self.parent >= 0], minlength=len(self.parent))
        # Names are cleaned once per distinct name; two names that clean alike are one timer.
        raw_codes, raw_names = pd.factorize(slices["name"].fillna("").astype(str))
        clean_codes, names = pd.factorize(pd.Series([clean_name(n) for n in raw_names], dtype=object))
        self.name_code = np.asarray(clean_codes, dtype=np.int64)[raw_codes]
        self.names = np.asarray(names, dtype=object)
        kind_codes, kinds = pd.factorize(slices["kind"].fillna("").astype(str))
        by_kind = np.asarray([group_of_kind(k) for k in kinds] or [""], dtype=object)[kind_codes]
        # TAU gives a timer one group on every thread: its first slice's, should a foreign trace
        # give one name two kinds (AMD's user annotations, on the CPU and on the GPU).
        distinct, first = np.unique(self.name_code, return_index=True)
        of_name = np.empty(len(self.names), dtype=object)
        of_name[distinct] = by_kind[first]
        self.group = of_name[self.name_code]  # each slice's timer's group
        # In a callpath a step slice is its kind of step, without its number.
        is_step = (slices["kind"] == Kind.STEP).to_numpy(dtype=bool)
        pair_codes, pairs = pd.factorize(self.name_code * 2 + is_step)
        components = [_STEP_NUMBER.sub("", self.names[p // 2]) or self.names[p // 2] if p % 2 else self.names[p // 2]
                      for p in pairs.tolist()]
        component_codes, component_names = pd.factorize(pd.Series(components, dtype=object))
        self.path_code, self.paths = _callpaths(self.parent, np.asarray(component_codes, np.int64)[pair_codes],
                                                np.asarray(component_names, dtype=object))

    def positions(self, rank: pd.Series, slice_id: pd.Series) -> np.ndarray:
        """Row positions of the slices named by (rank, slice id) pairs; -1 where none is."""
        wanted = pd.MultiIndex.from_arrays([rank.astype("int64").to_numpy(),
                                            slice_id.astype("Int64").fillna(-1).to_numpy(np.int64)])
        return np.asarray(self.ids.get_indexer(wanted), dtype=np.int64)

    def functions(self, values: list[tuple[np.ndarray, np.ndarray]], wall_ns: list[int]) -> list[pd.DataFrame]:
        """Each thread's timers: :data:`APPLICATION`, flat names, then callpaths, each by TIME
        inclusive, descending.

        Args:
            values: per metric, each slice's (inclusive, exclusive) value; TIME first.
            wall_ns: each thread's whole time, from its first slice's start to its last's end.

        Returns:
            Per track, a table of ``name, group, calls, subrs`` and ``excl<m>``, ``incl<m>``.
        """
        every = np.ones(len(self.parent), bool)
        flat = self._table(self.name_code, self.names, every, values, "")
        paths = self._table(self.path_code, self.paths, every, values, "TAU_CALLPATH|")
        both = pd.concat([self._application(values, wall_ns), flat.assign(order=1), paths.assign(order=2)],
                         ignore_index=True)
        both = both.sort_values(["track", "order", "incl0", "name"],
                                ascending=[True, True, False, True], kind="stable")
        tables = dict(iter(both.groupby("track", sort=False)))
        return [tables[t] for t in range(self.tracks)]

    def _application(self, values: list[tuple[np.ndarray, np.ndarray]], wall_ns: list[int]) -> pd.DataFrame:
        """The top-level timer of each thread: its whole time, the rest of it outside any slice."""
        roots = self.parent < 0
        data: dict[str, object] = {
            "track": np.arange(self.tracks), "order": 0, "name": APPLICATION, "group": APPLICATION_GROUP,
            "calls": 1, "subrs": np.bincount(self.track[roots], minlength=self.tracks),
        }
        for m, (inclusive, _) in enumerate(values):
            in_roots = np.bincount(self.track[roots], weights=inclusive[roots], minlength=self.tracks)
            # TIME: the thread's whole time; a metric: only what its slices measured.
            whole = np.maximum(np.asarray(wall_ns, dtype=np.float64), in_roots) if m == 0 else in_roots
            data[f"incl{m}"] = whole
            data[f"excl{m}"] = whole - in_roots
        return pd.DataFrame(data)

    def _table(self, key: np.ndarray, names: np.ndarray, mask: np.ndarray,
               values: list[tuple[np.ndarray, np.ndarray]], group_prefix: str) -> pd.DataFrame:
        outermost = outermost_of_name(self.parent, key)
        data: dict[str, np.ndarray] = {"track": self.track, "key": key,
                                       "calls": np.ones(len(key), np.int64), "subrs": self.children}
        for m, (inclusive, exclusive) in enumerate(values):
            data[f"excl{m}"] = exclusive
            data[f"incl{m}"] = np.where(outermost, inclusive, 0)
        table = pd.DataFrame(data)[mask].groupby(["track", "key"], sort=False).sum().reset_index()
        # Every slice of a timer has the group of its (innermost) name; take the first's.
        distinct, first = np.unique(key, return_index=True)
        first_of = np.zeros(len(names), dtype=np.int64)
        first_of[distinct] = first
        codes = table["key"].to_numpy()
        table["name"] = names[codes]
        table["group"] = group_prefix + pd.Series(self.group[first_of[codes]], dtype=object)
        return table


def _callpaths(parent: np.ndarray, name_code: np.ndarray,
               names: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every slice's callpath from :data:`APPLICATION`, as a code into distinct path texts.

    Paths are interned a tree level at a time, all slices of a level at once: a path is its
    parent's path and its own name, so each distinct (parent path, name) pair is built once.

    Returns:
        The path code of each slice, and the text of each code.
    """
    n, width = len(parent), max(len(names), 1)
    path = np.full(n, -1, dtype=np.int64)
    prefixes: list[np.ndarray] = []
    leaves: list[np.ndarray] = []
    level = np.flatnonzero(parent < 0)
    for _ in range(n + 1):  # a damaged store may link parents in a loop: stop after n levels
        if level.size == 0:
            level = np.flatnonzero(path < 0)  # only slices in such a loop: take them as roots
            if level.size == 0:
                break
            above = np.full(level.size, -1, dtype=np.int64)
        else:
            above = np.where(parent[level] >= 0, path[np.maximum(parent[level], 0)], -1)
        keys = (above + 1) * width + name_code[level]
        unique, inverse = np.unique(keys, return_inverse=True)
        path[level] = sum(len(p) for p in prefixes) + inverse.ravel()
        prefixes.append(unique // width - 1)
        leaves.append(unique % width)
        level = np.flatnonzero(np.isin(parent, level) & (path < 0))
    if not prefixes:
        return path, np.asarray([], dtype=object)
    components: list[tuple[str, ...]] = []
    for above_id, leaf in zip(np.concatenate(prefixes).tolist(), np.concatenate(leaves).tolist(),
                              strict=True):
        components.append((components[above_id] if above_id >= 0 else (APPLICATION,)) + (names[leaf],))
    # Paths cut to the length readers take may coincide: one text, one timer.
    codes, texts = pd.factorize(pd.Series([join_path(c) for c in components], dtype=object))
    return np.asarray(codes, dtype=np.int64)[path], np.asarray(texts, dtype=object)


def metric_values(tree: SliceTree, samples: pd.DataFrame, metrics: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each slice's (inclusive, exclusive) value of each metric; TIME in nanoseconds.

    TIME stays in integer nanoseconds until a line is written, so that sums are exact and print
    as the microseconds they are (``1043.285``, not ``1043.2849999999999``). A metric's value of
    a slice without one is shared out from its measured ancestor (:func:`_shared_out`); a
    slice's exclusive value is its inclusive value less its children's (at least 0: counters
    read over slightly different windows).

    Args:
        tree: the slices.
        samples: ``position, metric, value``: the metrics table's values by slice position.
        metrics: TIME, then the metrics.
    """
    n = len(tree.parent)
    values = [(tree.dur_ns, tree.self_ns)]
    nested = tree.parent >= 0
    by_metric = dict(iter(samples.groupby("metric", sort=False)))
    for metric in metrics[1:]:
        rows = by_metric.get(metric, samples.iloc[:0])
        positions = rows["position"].to_numpy(np.int64)
        measured = np.bincount(positions, minlength=n) > 0
        inclusive = np.bincount(positions, weights=rows["value"].to_numpy(), minlength=n)
        inclusive = _shared_out(tree, inclusive, measured)
        in_children = np.bincount(tree.parent[nested], weights=inclusive[nested], minlength=n)
        values.append((inclusive, np.maximum(inclusive - in_children, 0.0)))
    return values


def _shared_out(tree: SliceTree, inclusive: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """Values for the slices without one, from the nearest measured ancestor, by time.

    A slice with a value (measured, or given one here) leaves to its unmeasured children what its
    measured children do not account for, over the time they do not cover; each unmeasured child
    takes that value per nanosecond times its duration. Slices with no measured ancestor keep 0.
    """
    n = len(tree.parent)
    parent = tree.parent
    duration = tree.dur_ns.astype(np.float64)
    nested = parent >= 0
    counted = nested & measured  # measured children: their values and times are their own
    value_of_counted = np.bincount(parent[counted], weights=inclusive[counted], minlength=n)
    time_of_counted = np.bincount(parent[counted], weights=duration[counted], minlength=n)
    known = measured.copy()
    result = inclusive.copy()
    level = np.flatnonzero(~nested)
    for _ in range(n + 1):  # a loop of parents in a damaged store: stop after n levels
        children = np.flatnonzero(nested & np.isin(parent, level))
        if children.size == 0:
            break
        above = parent[children]
        given = ~measured[children] & known[above]
        take, source = children[given], above[given]
        left = np.maximum(result[source] - value_of_counted[source], 0.0)
        room = duration[source] - time_of_counted[source]
        result[take] = np.where(room > 0, left * duration[take] / np.where(room > 0, room, 1.0), 0.0)
        known[take] = True
        level = children
    return result
