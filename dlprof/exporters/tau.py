"""TAU's native profile directory, which TAU's ``pprof`` and ParaProf open as they open TAU's own::

    TauExporter().export(dlprof.load("runs/cnn"), Path("cnn.tau"))   # then: cd cnn.tau; pprof

Layout, as TAU writes it:

* one file ``profile.<node>.0.<thread>`` per rank and thread. Nodes number the run's ranks from 0
  in order (pprof, not ParaProf, stops at the first missing node or thread number); every file
  says its rank (``dlprof Rank``) and the run's node-to-rank map (``dlprof Node Ranks``, ``0:2
  1:3``). Threads are numbered as ``dlprof pprof`` numbers them
  (:func:`dlprof.analysis.tau_profile.thread_numbers`): a rank's CPU threads by first activity,
  then its GPU streams as TAU's "virtual threads", whose metadata names the device, context and
  stream (``CUDA Device``, ``CUDA Context``, ``CUDA Stream``; dlprof keeps no CUPTI context id,
  and PyTorch works in one primary context per device and process, so the process id stands for
  it).
* with TIME alone (a run without metrics) the files lie in the directory; with more metrics,
  one ``MULTI__<metric>`` directory per metric holds the same thread files, each with every
  timer and user event (ParaProf reads user events from whichever metric it lists first).
* per file: TAU's top-level timer ``.TAU application`` holding the thread's whole time, every
  name that ran on the thread, with calls, child calls, exclusive and inclusive value, and beside
  them every callpath ``.TAU application => A => B`` (group ``TAU_CALLPATH|<group of B>``), as
  TAU writes them with ``TAU_CALLPATH`` on, a step named without its number (``ProfilerStep``)
  so that the steps add up (:mod:`dlprof.exporters.tau_tree`); then user events: memory samples
  (allocation and free sizes, allocator totals) on the thread of the op that made them, every
  per-slice metric value, and the run's sampled counters on thread 0, each sample a slice owns
  also under ``event : callpath``.

Values: TIME is in microseconds; inclusive time counts only the outermost activation of a name
(or callpath), exclusive time is the store's self time, as in :mod:`dlprof.analysis.tau_profile`.
A metric of the metrics table is a value per slice, taken as measured over the whole slice and
summed as a counter is (a precomputed ratio too: divide by calls in ParaProf); a slice without a
value under one with a value gets its share by time (:func:`dlprof.exporters.tau_tree.metric_values`).
A timer's inclusive value sums its outermost activations' values, its exclusive value sums each
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

from dlprof.analysis.tau_profile import tau_profiles
from dlprof.exporters.base import Exporter, ExportError, Ticker
from dlprof.exporters.tau_format import (
    CONTEXT_SEPARATOR,
    EventLine,
    FunctionLine,
    check_target,
    clean_event_name,
    metric_directories,
    profile_paths,
    run_attributes,
    thread_attributes,
    write_profile,
)
from dlprof.exporters.tau_tree import SliceTree, metric_values
from dlprof.store.reader import Run
from dlprof.store.safe_files import partial_directory, replace_directory

TIME = "TIME"


class TauExportWarning(UserWarning):
    """Values a TAU profile cannot hold were left out of an export."""


@dataclass(frozen=True)
class Track:
    """One TAU thread: a CPU thread or a GPU stream of one rank."""

    rank: int
    node: int  # TAU's node: the rank's place among the run's ranks, from 0
    thread: int  # TAU's thread, as ``dlprof pprof`` numbers it: CPU threads first, then GPU streams
    pid: int
    tid: int  # the OS thread id, or the stream
    device: str  # "cpu", "cuda:0", "" for slices recorded without a device
    wall_ns: int  # from the first slice's start to the last slice's end on this thread

    @property
    def key(self) -> tuple[int, int, int, str]:
        """(rank, pid, tid, device): the store's name of the thread."""
        return self.rank, self.pid, self.tid, self.device


def tau_tracks(run: Run) -> list[Track]:
    """The threads of a TAU export of ``run``, in file order.

    Args:
        run: the run.

    Returns:
        Per rank, its threads as ``dlprof pprof`` numbers them
        (:func:`dlprof.analysis.tau_profile.thread_numbers`). Nodes count the ranks from 0 in
        order: TAU's pprof reads nodes from 0 and stops at the first missing one, so a run of
        ranks 2 and 3 (an import of two ranks' traces) is nodes 0 and 1.
    """
    profiles = tau_profiles(run)
    node_of = {rank: node for node, rank in enumerate(sorted({p.rank for p in profiles}))}
    return [Track(p.rank, node_of[p.rank], p.thread, p.pid, p.tid, p.device, p.wall_ns) for p in profiles]


def node_ranks(tracks: list[Track]) -> str:
    """The node-to-rank map a TAU export states in its metadata: ``0:2 1:3``."""
    pairs = sorted({(t.node, t.rank) for t in tracks})
    return " ".join(f"{node}:{rank}" for node, rank in pairs)


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
            tree = SliceTree(run, [t.key for t in tracks])
        except ValueError as error:  # two slices of a rank share an id: no parents to follow
            raise ExportError(f"{run.path}: {error}") from None
        metrics = metric_names(run)
        dropped: Counter[str] = Counter()
        samples = _metric_samples(run, tree, dropped)
        functions = tree.functions(metric_values(tree, samples, metrics), [t.wall_ns for t in tracks])
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
            common = [*run_attributes(run), ("dlprof Node Ranks", node_ranks(tracks))]
            for number, out in enumerate(paths):
                metric, track = divmod(number, len(tracks))
                target = partial / out.relative_to(path)
                target.parent.mkdir(parents=True, exist_ok=True)
                where = tracks[track]
                metadata = [("Metric Name", metrics[metric]), *common, ("dlprof Rank", str(where.rank)),
                            *thread_attributes(where.pid, where.tid, where.device)]
                with target.open("w", encoding="utf-8", newline="\n") as file:
                    write_profile(file, metrics[metric], metadata,
                                  _function_lines(functions[track], metric), events.get(track, []))
            replace_directory(partial, path)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        return paths


def _metric_samples(run: Run, tree: SliceTree, dropped: Counter[str]) -> pd.DataFrame:
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


def _user_events(run: Run, tree: SliceTree, samples: pd.DataFrame,
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
    return profile_paths(path, [(t.node, t.thread) for t in tracks], directories)
