"""TAU's native profile directory, which TAU's ``pprof`` and ParaProf open as they open TAU's own::

    TauExporter().export(dlprof.load("runs/cnn"), Path("cnn.tau"))   # then: cd cnn.tau; pprof

Layout, as TAU writes it:

* one file ``profile.<rank>.0.<thread>`` per rank and thread (TAU's node is the rank; pprof, not
  ParaProf, stops at the first missing node or thread number). Threads are numbered from 0: a
  rank's CPU threads in ``dlprof pprof``'s order (first activity), then its GPU streams as TAU's
  "virtual threads", whose metadata names the device, context and stream (``CUDA Device``,
  ``CUDA Context``, ``CUDA Stream``; dlprof keeps no CUPTI context id, and PyTorch works in one
  primary context per device and process, so the process id stands for it).
* with TIME alone (a run without metrics) the files lie in the directory; with more metrics,
  one ``MULTI__<metric>`` directory per metric holds the same thread files, each with every
  timer and user event (ParaProf reads user events from whichever metric it lists first).
* per file: every name that ran on the thread, with calls, child calls, exclusive and inclusive
  value, and beside them every callpath ``A => B`` (group ``TAU_CALLPATH|<group of B>``) from the
  thread's root down, as TAU writes them with ``TAU_CALLPATH`` on; then user events: memory
  samples (allocation and free sizes, allocator totals) on the thread of the op that made them,
  every per-slice metric value, and the run's sampled counters on thread 0, each sample a slice
  owns also under ``event : callpath``.

Values: TIME is in microseconds; inclusive time counts only the outermost activation of a name
(or callpath), exclusive time is the store's self time, as in :mod:`dlprof.analysis.pprof`. A
metric of the metrics table is a value per slice, taken as measured over the whole slice and
summed as a counter is (a precomputed ratio too: divide by calls in ParaProf): a timer's
inclusive value sums its outermost activations' values, its exclusive value sums each
activation's value less its direct children's (at least 0: counters read over slightly
different windows). NaN, infinite and negative values, which no TAU reader takes, and values of
a metric named TIME are left out with a :class:`TauExportWarning`.
"""

from __future__ import annotations

import shutil
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

# The private helpers are pprof's own walk of the slice tree; the TAU file must count exactly
# as ``dlprof pprof`` prints, so it uses them rather than a copy.
from dlprof.analysis.pprof import outermost_of_name, parent_positions, pprof_tables
from dlprof.exporters.base import Exporter, ExportError, Ticker
from dlprof.exporters.tau_format import (
    CONTEXT_SEPARATOR,
    EventLine,
    FunctionLine,
    check_target,
    clean_event_name,
    clean_name,
    group_of_kind,
    join_path,
    metric_directories,
    profile_paths,
    replace_directory,
    run_attributes,
    thread_attributes,
    write_profile,
)
from dlprof.store.reader import Run
from dlprof.store.safe_files import partial_directory

TIME = "TIME"


class TauExportWarning(UserWarning):
    """Values a TAU profile cannot hold were left out of an export."""


@dataclass(frozen=True)
class Track:
    """One TAU thread: a CPU thread or a GPU stream of one rank."""

    rank: int  # TAU's node
    thread: int  # TAU's thread: CPU threads first, then GPU streams
    pid: int
    tid: int  # the OS thread id, or the stream
    device: str  # "cpu", "cuda:0", "" for slices recorded without a device


def tau_tracks(run: Run) -> list[Track]:
    """The threads of a TAU export of ``run``, in file order.

    Args:
        run: the run.

    Returns:
        Per rank, the CPU threads in ``dlprof pprof``'s order, then the GPU streams in theirs,
        numbered from 0.
    """
    tracks: list[Track] = []
    profiles = pprof_tables(run)
    for rank in sorted({p.rank for p in profiles}):
        mine = [p for p in profiles if p.rank == rank]
        ordered = sorted(mine, key=lambda p: (p.device not in ("", "cpu"), p.thread))
        tracks += [Track(rank, i, p.pid, p.tid, p.device) for i, p in enumerate(ordered)]
    return tracks


def metric_names(run: Run) -> list[str]:
    """TIME, then the metrics table's other metrics with a value a TAU profile can hold, sorted."""
    metrics = run.metrics
    values = metrics["value"].astype("float64").to_numpy()
    usable = metrics["metric"][np.isfinite(values) & (values >= 0)].dropna().astype(str)
    return [TIME, *sorted(set(usable) - {TIME})]


class TauExporter(Exporter):
    """TAU's profile directory: ``profile.N.0.T`` files, or ``MULTI__<metric>`` directories of them."""

    format_name = "tau"
    file_extension = ".tau"  # the directory's name; TAU itself does not name it
    binary = False
    description = "TAU profile directory (pprof, ParaProf), a file per rank and thread"

    def output_paths(self, run: Run, path: Path) -> list[Path]:
        return _paths(path, tau_tracks(run), metric_names(run))

    def write(self, run: Run, path: Path, ticker: Ticker) -> list[Path]:
        check_target(path)
        try:
            tracks = tau_tracks(run)
            tree = _SliceTree(run, tracks)
        except ValueError as error:  # two slices of a rank share an id: no parents to follow
            raise ExportError(f"{run.path}: {error}") from None
        metrics = metric_names(run)
        dropped: Counter[str] = Counter()
        samples = _metric_samples(run, tree, dropped)
        functions = tree.functions(_metric_values(tree, samples, metrics))
        ticker.advance(len(tree.track))
        events = _user_events(run, tree, samples, dropped)
        ticker.advance(len(run.counters) + len(run.memory))
        if +dropped:  # unary plus: only the positive counts
            detail = ", ".join(f"{count} {what}" for what, count in sorted((+dropped).items()))
            warnings.warn(f"TAU export of {run.path.name}: left out {detail}", TauExportWarning,
                          stacklevel=3)
        paths = _paths(path, tracks, metrics)
        partial = partial_directory(path)
        try:
            common = run_attributes(run)
            for number, out in enumerate(paths):
                metric, track = divmod(number, len(tracks))
                target = partial / out.relative_to(path)
                target.parent.mkdir(parents=True, exist_ok=True)
                where = tracks[track]
                metadata = [("Metric Name", metrics[metric]), *common,
                            *thread_attributes(where.pid, where.tid, where.device)]
                with target.open("w", encoding="utf-8", newline="\n") as file:
                    write_profile(file, metrics[metric], metadata,
                                  _function_lines(functions[track], metric), events.get(track, []))
            replace_directory(partial, path)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        return paths


class _SliceTree:
    """The run's slices as arrays: thread, parent, cleaned name and callpath of each."""

    def __init__(self, run: Run, tracks: list[Track]) -> None:
        slices = run.slices
        rank = slices["rank"].astype("int64").to_numpy()
        keys = pd.MultiIndex.from_arrays([
            rank,
            slices["pid"].fillna(0).astype("int64").to_numpy(),
            slices["tid"].fillna(0).astype("int64").to_numpy(),
            slices["device"].fillna("").astype(str).to_numpy(),
        ])
        known = pd.MultiIndex.from_tuples([(t.rank, t.pid, t.tid, t.device) for t in tracks])
        self.track = np.asarray(known.get_indexer(keys), dtype=np.int64)  # index into tracks
        self.parent = parent_positions(slices)
        self.ids = pd.MultiIndex.from_arrays([rank, slices["id"].astype("int64").to_numpy()])
        self.dur_ns = slices["dur_ns"].fillna(0).astype("int64").to_numpy()
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
        self.path_code, self.paths = _callpaths(self.parent, self.name_code, self.names)

    def positions(self, rank: pd.Series, slice_id: pd.Series) -> np.ndarray:
        """Row positions of the slices named by (rank, slice id) pairs; -1 where none is."""
        wanted = pd.MultiIndex.from_arrays([rank.astype("int64").to_numpy(),
                                            slice_id.astype("Int64").fillna(-1).to_numpy(np.int64)])
        return np.asarray(self.ids.get_indexer(wanted), dtype=np.int64)

    def functions(self, values: list[tuple[np.ndarray, np.ndarray]]) -> list[pd.DataFrame]:
        """Each thread's timers: flat names, then callpaths, each by TIME inclusive, descending.

        Args:
            values: per metric, each slice's (inclusive, exclusive) value.

        Returns:
            Per track, a table of ``name, group, calls, subrs`` and ``excl<m>``, ``incl<m>``.
        """
        flat = self._table(self.name_code, self.names, np.ones(len(self.parent), bool), values, "")
        # A root slice has no callpath entry, as in TAU: its flat entry is its whole path.
        paths = self._table(self.path_code, self.paths, self.parent >= 0, values, "TAU_CALLPATH|")
        both = pd.concat([flat.assign(order=0), paths.assign(order=1)], ignore_index=True)
        both = both.sort_values(["track", "order", "incl0", "name"],
                                ascending=[True, True, False, True], kind="stable")
        tables = dict(iter(both.groupby("track", sort=False)))
        return [tables[t] for t in range(len(tables))]

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
    """Every slice's callpath from its thread's root, as a code into distinct path texts.

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
        components.append((components[above_id] if above_id >= 0 else ()) + (names[leaf],))
    # Paths cut to the length readers take may coincide: one text, one timer.
    codes, texts = pd.factorize(pd.Series([join_path(c) for c in components], dtype=object))
    return np.asarray(codes, dtype=np.int64)[path], np.asarray(texts, dtype=object)


def _metric_samples(run: Run, tree: _SliceTree, dropped: Counter[str]) -> pd.DataFrame:
    """The metrics table's values a TAU profile can hold: ``position, metric, value``."""
    metrics = run.metrics
    value = metrics["value"].astype("float64").to_numpy()
    position = tree.positions(metrics["rank"], metrics["slice_id"])
    finite = np.isfinite(value)
    dropped["NaN or infinite metric values"] += int((~finite).sum())
    dropped["negative metric values"] += int((finite & (value < 0)).sum())
    name = metrics["metric"].astype(str).to_numpy()
    usable = finite & (value >= 0) & metrics["metric"].notna().to_numpy()
    dropped["metric values of slices not in the run"] += int((usable & (position < 0)).sum())
    dropped[f"values of a metric named {TIME}"] += int((usable & (name == TIME)).sum())
    keep = usable & (position >= 0) & (name != TIME)
    return pd.DataFrame({"position": position[keep], "metric": name[keep], "value": value[keep]})


def _metric_values(tree: _SliceTree, samples: pd.DataFrame,
                   metrics: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each slice's (inclusive, exclusive) value of each metric; TIME in nanoseconds.

    TIME stays in integer nanoseconds until a line is written, so that sums are exact and print
    as the microseconds they are (``1043.285``, not ``1043.2849999999999``).
    """
    n = len(tree.parent)
    values = [(tree.dur_ns, tree.self_ns)]
    nested = tree.parent >= 0
    by_metric = dict(iter(samples.groupby("metric", sort=False)))
    for metric in metrics[1:]:
        rows = by_metric.get(metric, samples.iloc[:0])
        inclusive = np.bincount(rows["position"].to_numpy(np.int64), weights=rows["value"].to_numpy(),
                                minlength=n)
        in_children = np.bincount(tree.parent[nested], weights=inclusive[nested], minlength=n)
        values.append((inclusive, np.maximum(inclusive - in_children, 0.0)))
    return values


def _user_events(run: Run, tree: _SliceTree, samples: pd.DataFrame,
                 dropped: Counter[str]) -> dict[int, list[EventLine]]:
    """Each thread's user events: memory samples, per-slice metric values, sampled counters.

    Returns:
        Per track index, its events by name; an event a slice owns comes twice, as itself and
        as ``event : callpath``.
    """
    tracks = pd.Series(tree.track)
    ranks = run.slices["rank"].astype("int64")
    main_track = tracks.groupby(ranks.to_numpy()).min()  # thread 0 of each rank
    parts = [pd.DataFrame({"track": tree.track[samples["position"]], "event": samples["metric"],
                           "context": tree.path_code[samples["position"]], "value": samples["value"]})]

    memory = run.memory
    owner = tree.positions(memory["rank"], memory["slice_id"])
    track = np.where(owner >= 0, tree.track[np.maximum(owner, 0)],
                     memory["rank"].astype("int64").map(main_track).fillna(-1).to_numpy(np.int64))
    context = np.where(owner >= 0, tree.path_code[np.maximum(owner, 0)], -1)
    device = " [" + memory["device"].fillna("cpu").astype(str) + "]"
    size = memory["bytes"].astype("Float64")
    for label, column, keep in (
        ("Allocation size (bytes)", size, size > 0),
        ("Free size (bytes)", -size, size < 0),
        ("Total allocated (bytes)", memory["total_allocated"].astype("Float64"), None),
        ("Total reserved (bytes)", memory["total_reserved"].astype("Float64"), None),
    ):
        chosen = column.notna() if keep is None else keep.fillna(False)
        chosen = chosen.to_numpy(bool)
        parts.append(pd.DataFrame({"track": track[chosen], "event": (label + device)[chosen].to_numpy(),
                                   "context": context[chosen],
                                   "value": column[chosen].to_numpy("float64")}))

    counters = run.counters[run.counters["value"].notna()]  # a null is a missed sample
    value = counters["value"].astype("float64").to_numpy()
    finite = np.isfinite(value)
    dropped["NaN or infinite counter samples"] += int((~finite).sum())
    unit = counters["unit"].fillna("").astype(str)
    name = counters["track"].astype(str) + np.where(unit != "", " (" + unit + ")", "")
    parts.append(pd.DataFrame({
        "track": counters["rank"].astype("int64").map(main_track).fillna(-1).to_numpy(np.int64)[finite],
        "event": name.to_numpy()[finite], "context": -1, "value": value[finite]}))

    frame = pd.concat(parts, ignore_index=True)
    if frame.empty:
        return {}
    dropped["samples of ranks without slices"] += int((frame["track"] < 0).sum())
    frame = frame[frame["track"] >= 0]
    # Cleaned before grouping: two names that clean alike are one event, as for timers.
    frame = frame.assign(event=frame["event"].map({e: clean_event_name(e) for e in frame["event"].unique()}))
    flat = _statistics(frame, ["track", "event"]).rename(columns={"event": "name"})
    in_context = _statistics(frame[frame["context"] >= 0], ["track", "event", "context"])
    in_context["name"] = [event + CONTEXT_SEPARATOR + tree.paths[path] for event, path
                          in zip(in_context["event"], in_context["context"].astype("int64"), strict=True)]
    table = pd.concat([flat, in_context], ignore_index=True)
    stats = table[["maximum", "minimum", "mean", "sum_squares"]].to_numpy("float64")
    finite_rows = np.isfinite(stats).all(axis=1)
    dropped["user events whose statistics overflow"] += int((~finite_rows).sum())
    table = table[finite_rows].sort_values(["track", "name"], kind="stable")
    return {
        int(t): [EventLine(str(r.name), int(r.samples), float(r.maximum), float(r.minimum), float(r.mean),
                           float(r.sum_squares)) for r in rows.itertuples(index=False)]
        for t, rows in table.groupby("track", sort=False)
    }


def _statistics(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """TAU's per-event statistics: count, max, min, mean and sum of squares of the samples."""
    grouped = frame.assign(square=frame["value"] ** 2).groupby(keys, sort=False)
    return grouped.agg(samples=("value", "size"), maximum=("value", "max"), minimum=("value", "min"),
                       mean=("value", "mean"), sum_squares=("square", "sum")).reset_index()


def _function_lines(table: pd.DataFrame, metric: int) -> list[FunctionLine]:
    scale = 1000.0 if metric == 0 else 1.0  # TIME: nanoseconds to TAU's microseconds
    return [
        FunctionLine(name, int(calls), int(subrs), float(excl) / scale, float(incl) / scale, group)
        for name, calls, subrs, excl, incl, group in zip(
            table["name"], table["calls"], table["subrs"], table[f"excl{metric}"],
            table[f"incl{metric}"], table["group"], strict=True)
    ]


def _paths(path: Path, tracks: list[Track], metrics: list[str]) -> list[Path]:
    directories = metric_directories(metrics) if len(metrics) > 1 else []
    return profile_paths(path, [(t.rank, t.thread) for t in tracks], directories)
