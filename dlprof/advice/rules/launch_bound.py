"""Launch- or host-bound: the host cannot issue work as fast as the GPU runs it, so the GPU
idles while its next piece of work is being launched.

What counts is the GPU's own idle time while the host launched work onto a free stream: each
kernel, memcpy and memset whose launch delay is all launch cost (it queued behind no earlier
work on its stream, :mod:`dlprof.analysis.gpu`), from its runtime call's start until it
started, and other runtime calls over 50 us that launch nothing. A piece of work that queued is
never counted: its wait is the GPU's pace, as is a launch call that blocks on a full launch
queue. A launch cost that lasts past the call's return by more than :data:`LAUNCH_LATENCY_NS`
is cut there: a kernel that starts that late on a free stream waited for something else (an
event of another stream, a peer). Each name's first launch loads its module and is set-up, as
is the warm-up step; the time counted is the counted steps' (less dlprof's pauses), or the
whole run's where it has no steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from dlprof.advice.base import Evidence, Finding, Need, Rule, Severity, duration, percent
from dlprof.advice.data import RunData
from dlprof.analysis.gpu import Coverage, work_sql
from dlprof.keys import Kind

STAKE_SHARE = 0.05  # GPU idle while launching / the steps' time: below this launches cost too little
HIGH_SHARE = 0.15
LONG_RUNTIME_CALL_NS = 50_000  # a runtime call that launches nothing and lasts longer holds the host back
# How long after its call returns a kernel starts on a free stream (a few microseconds on the
# recorded A100, V100 and H200 runs); past it, the kernel was waiting for something else.
LAUNCH_LATENCY_NS = 20_000
# Calls that wait for the GPU or set it up: long by nature, no launch overhead.
_WAITS = r"(?i)synchronize|eventquery|malloc|free|hostalloc|getdevice|streamcreate|priorityrange|memcpy$"


@dataclass(frozen=True)
class _Launches:
    """Intervals of the host launching, on one GPU: where each starts and ends, and whose it is."""

    starts: np.ndarray
    ends: np.ndarray
    names: np.ndarray  # ``kernel <name>``, ``runtime <name>``


class LaunchBound(Rule):
    name = "launch-bound"
    title = "Launch- or host-bound: the GPU waits for the host to issue work"
    needs = (Need.DEVICE,)
    threshold = (f"the GPU idle while work is launched onto free streams (and during runtime calls over "
                 f"{LONG_RUNTIME_CALL_NS // 1000} us that launch nothing) >= {STAKE_SHARE:.0%} of the counted "
                 f"steps' time; high from {HIGH_SHARE:.0%}")
    stake_basis = ("that idle time: each launch's cost (from its call's start to its work's start, the work "
                   "queued behind nothing on its stream), each GPU's idle time within them, first launches "
                   "and queued work left out")
    fix = ("Issue fewer, larger kernels: capture the step in a CUDA graph (torch.cuda.graphs, "
           "torch.compile(mode='reduce-overhead')), fuse small ops (torch.compile), raise the batch "
           "size, and remove host syncs (.item(), .cpu(), blocking copies) from the loop.")
    source = ("PyTorch CUDA graphs documentation ('Why CUDA Graphs?'); NVIDIA Nsight Systems user guide, "
              "'CPU-bound and launch-bound workloads'")

    def check(self, data: RunData) -> Finding | None:
        work = _work(data)
        calls = _long_calls(data)
        windows = _windows(data)
        found: list[tuple[Evidence, int, str]] = []
        spans: dict[tuple[int, str], float] = {}
        for (rank, device), on_device in work.groupby(["rank", "device"]):
            low, high = windows.get(int(rank), (np.zeros(0, np.int64), np.zeros(0, np.int64)))
            launches = _clipped(_launching(on_device, calls[calls["rank"] == rank]), low, high)
            spans[(int(rank), str(device))] = float((high - low).sum())
            found += [(e, int(rank), str(device)) for e in _idle_while_launching(on_device, launches, str(device))]
        idle = {key: sum(e.time_ns for e, rank, device in found if (rank, device) == key) for key in spans}
        shares = {key: idle[key] / span for key, span in spans.items() if span > 0}
        worst = max(shares.values(), default=0.0)
        if worst < STAKE_SHARE:
            return None
        stake = sum(idle.values())
        devices = ", ".join(f"rank {rank} {device} {duration(idle[(rank, device)])} "
                            f"({percent(idle[(rank, device)], spans[(rank, device)])})"
                            for rank, device in sorted(shares, key=lambda key: -shares[key]))
        within = "the counted steps' time" if not data.counted_steps.empty else "the run"
        summary = (f"the GPU idled while work was launched onto free streams: {devices} of {within}; "
                   f"{_queued(work)} of the launched work queued behind earlier work and is not counted")
        severity = Severity.HIGH if worst >= HIGH_SHARE else Severity.MODERATE
        # The GPU's idle time is also what low utilisation and memory headroom claim.
        claims = [data.idle_claim(rank, device, ns) for (rank, device), ns in idle.items() if ns > 0]
        return self.finding(severity, stake, summary, [e for e, _, _ in found], claims)


def _work(data: RunData) -> pd.DataFrame:
    """Every kernel, memcpy and memset with its launch: its name, when its call started and
    ended, its queueing and launch cost, and whether it is its name's first launch on its GPU."""
    frame = data.run.sql(
        "SELECT w.rank, w.device, w.kind, s.name, w.start_ns, w.end_ns, w.launch_ns, "
        "w.launch_ns + r.dur_ns AS returned_ns, w.queue_ns, w.launch_cost_ns, "
        "row_number() OVER (PARTITION BY w.rank, w.device, s.name ORDER BY w.launch_ns, w.start_ns) AS nth "
        f"FROM ({work_sql(data.run.engine.dialect, data.rank)}) AS w "
        "JOIN slices s ON s.rank = w.rank AND s.id = w.id "
        f"LEFT JOIN slices r ON r.rank = w.rank AND r.kind = '{Kind.RUNTIME}' AND r.correlation_id = s.correlation_id")
    return frame.astype({"rank": "int64", "start_ns": "int64", "end_ns": "int64"})


def _long_calls(data: RunData) -> pd.DataFrame:
    """Runtime calls over :data:`LONG_RUNTIME_CALL_NS` that launch no work, but each name's first
    (it loads modules, creates contexts) and the calls that wait for the GPU or set it up."""
    numbered = (f"SELECT c.rank, c.name, c.start_ns, c.dur_ns, w.id AS work_id, "
                "row_number() OVER (PARTITION BY c.rank, c.name ORDER BY c.start_ns) AS nth "
                f"FROM slices c LEFT JOIN slices w ON w.rank = c.rank AND w.correlation_id = c.correlation_id "
                f"AND w.kind IN ('{Kind.KERNEL}', '{Kind.MEMCPY}', '{Kind.MEMSET}') "
                f"WHERE c.kind = '{Kind.RUNTIME}'{data.where('c.rank')}")
    calls = data.run.sql(f"SELECT rank, name, start_ns, start_ns + dur_ns AS end_ns FROM ({numbered}) AS c "
                         f"WHERE nth > 1 AND work_id IS NULL AND dur_ns > {LONG_RUNTIME_CALL_NS}")
    calls = calls[~calls["name"].str.contains(_WAITS, regex=True)]
    return calls.astype({"rank": "int64", "start_ns": "int64", "end_ns": "int64"})


def _windows(data: RunData) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per rank, the time that counts: each counted step's start and end (with none, the run's
    CPU span), dlprof's pauses cut out."""
    steps = data.counted_steps
    if steps.empty:
        rows = data.run.query(f"SELECT rank, min(start_ns), max(start_ns + dur_ns) FROM slices "
                              f"WHERE device = 'cpu'{data.where()} GROUP BY rank").rows
        found = {int(rank): (np.array([low], np.int64), np.array([high], np.int64)) for rank, low, high in rows}
    else:
        found = {int(rank): (of_rank["start_ns"].to_numpy(np.int64),
                             (of_rank["start_ns"] + of_rank["dur_ns"]).to_numpy(np.int64))
                 for rank, of_rank in steps.sort_values("start_ns").groupby("rank")}
    # dlprof's pauses of the process that runs the steps (a DataLoader worker's hold no launch).
    pauses = data.run.sql(
        "SELECT p.rank, p.start_ns, p.start_ns + p.dur_ns AS end_ns FROM slices p JOIN (SELECT DISTINCT rank, pid "
        f"FROM slices WHERE kind = '{Kind.STEP}') AS s ON s.rank = p.rank AND s.pid = p.pid "
        f"WHERE p.kind = '{Kind.PROFILER}'{data.where('p.rank')}")
    for rank, (low, high) in found.items():
        held = pauses[pauses["rank"] == rank]
        if not held.empty:
            found[rank] = _less(low, high, Coverage(held["start_ns"].to_numpy(np.int64),
                                                    held["end_ns"].to_numpy(np.int64)))
    return found


def _less(low: np.ndarray, high: np.ndarray, cut: Coverage) -> tuple[np.ndarray, np.ndarray]:
    """The windows ``[low, high)``, in time order, with the time ``cut`` covers taken out."""
    starts: list[int] = []
    ends: list[int] = []
    for a, b in zip(low.tolist(), high.tolist(), strict=True):
        block = int(np.searchsorted(cut.ends, a, side="right"))  # the first cut ending after a
        while block < len(cut.starts) and cut.starts[block] < b:
            if cut.starts[block] > a:
                starts.append(a)
                ends.append(int(cut.starts[block]))
            a = max(a, int(cut.ends[block]))
            block += 1
        if b > a:
            starts.append(a)
            ends.append(b)
    return np.array(starts, np.int64), np.array(ends, np.int64)


def _launching(work: pd.DataFrame, calls: pd.DataFrame) -> _Launches:
    """The host's launching on one GPU: each launch of work that queued behind nothing (but each
    name's first), from its call's start to its start, at most :data:`LAUNCH_LATENCY_NS` past
    the call's return; and the rank's long calls that launch nothing."""
    free = work[(work["queue_ns"] == 0) & (work["nth"] > 1) & work["launch_ns"].notna()]
    called = free["start_ns"] - free["launch_cost_ns"]
    latest = free["returned_ns"].fillna(free["start_ns"]) + LAUNCH_LATENCY_NS
    ends = np.minimum(free["start_ns"], latest)
    names = [f"{kind} {name}" for kind, name in zip(free["kind"], free["name"], strict=True)]
    return _Launches(
        np.concatenate([called.to_numpy(np.int64), calls["start_ns"].to_numpy(np.int64)]),
        np.concatenate([ends.to_numpy(np.int64), calls["end_ns"].to_numpy(np.int64)]),
        np.array(names + [f"runtime {name}" for name in calls["name"]], dtype=object))


def _clipped(launches: _Launches, low: np.ndarray, high: np.ndarray) -> _Launches:
    """The launches within the windows ``[low, high)``, each cut to the window its end lies in."""
    window = np.searchsorted(low, launches.ends, side="left") - 1
    safe = np.maximum(window, 0)
    starts = np.maximum(launches.starts, low[safe]) if len(low) else launches.starts
    ends = np.minimum(launches.ends, high[safe]) if len(high) else launches.ends
    keep = (window >= 0) & (ends > starts) if len(low) else np.zeros(len(starts), dtype=bool)
    return _Launches(starts[keep], ends[keep], launches.names[keep])


def _idle_while_launching(work: pd.DataFrame, launches: _Launches, device: str) -> list[Evidence]:
    """The GPU's idle time within the launches, each name's share of it as evidence.

    Launches overlap (a call begins before the last one's work starts), so their union is taken
    first and each merged stretch is put down to the launch that opened it.
    """
    if not len(launches.starts):
        return []
    busy = Coverage(work["start_ns"].to_numpy(np.int64), work["end_ns"].to_numpy(np.int64))
    order = np.argsort(launches.starts, kind="stable")
    starts, names = launches.starts[order], launches.names[order]
    merged = Coverage(starts, launches.ends[order])
    idle = (merged.ends - merged.starts) - busy.within(merged.starts, merged.ends)
    opener = names[np.searchsorted(starts, merged.starts)]
    count = pd.Series(launches.names).value_counts()
    found: dict[str, float] = {}
    for name, gap in zip(opener, idle, strict=True):
        if gap > 0:
            found[str(name)] = found.get(str(name), 0.0) + float(gap)
    return [Evidence(f"{name} on {device}", f"{_what(name, int(count[name]))}; the GPU idled {duration(ns)} meanwhile",
                     ns) for name, ns in found.items()]


def _what(name: str, count: int) -> str:
    if name.startswith("runtime "):
        return f"{count} calls over {LONG_RUNTIME_CALL_NS // 1000} us that launch nothing"
    return f"{count} launches onto a free stream"


def _queued(work: pd.DataFrame) -> str:
    launched = work[work["launch_ns"].notna()]
    return percent(float((launched["queue_ns"] > 0).sum()), float(len(launched)))
