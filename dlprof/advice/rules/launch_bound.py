"""Launch- or host-bound: the host cannot issue work as fast as the GPU runs it, so the GPU
waits on launches rather than on work.

Four signs, each measured on its own: launch calls take a large part of the steps; kernels run
shorter than the calls that launch them; runtime calls last long; kernels start long after their
launch while their GPU has nothing else to do. The last counts only the idle part of a delay: a
kernel queued behind others on a busy GPU also starts late, and that wait is no host cost.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dlprof.advice.base import Claim, Evidence, Finding, Need, Rule, Severity, duration, percent
from dlprof.advice.data import RunData
from dlprof.analysis.gpu import Coverage
from dlprof.analysis.sql import DEVICE_KINDS_SQL
from dlprof.keys import Kind

LAUNCH_SHARE = 0.15  # launch calls' time / the steps' time
LONG_RUNTIME_CALL_NS = 50_000  # a runtime call longer than this holds the host back
LONG_DELAY_NS = 100_000  # a launch delay longer than this, while the GPU idles, is host-bound
STAKE_SHARE = 0.05  # of the window: below this the signs cost too little to report
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                "hipLaunchKernel", "hipExtLaunchKernel", "cudaLaunchCooperativeKernel")
# Calls that wait for the GPU or set it up: long by nature, no launch overhead.
_WAITS = r"(?i)synchronize|eventquery|malloc|free|hostalloc|getdevice|streamcreate|priorityrange|memcpy$"


class LaunchBound(Rule):
    name = "launch-bound"
    title = "Launch- or host-bound: the GPU waits for the host to issue work"
    needs = (Need.DEVICE,)
    threshold = (f"launch calls >= {LAUNCH_SHARE:.0%} of the steps' time, or the other signs (kernels "
                 f"shorter than their launch, runtime calls over {LONG_RUNTIME_CALL_NS // 1000} us, "
                 f"launch delays over {LONG_DELAY_NS // 1000} us while the GPU is idle) adding up to "
                 f">= {STAKE_SHARE:.0%} of the steps' time")
    stake_basis = ("the launch time kernels shorter than their launch leave uncovered (launch - kernel), "
                   f"runtime calls' time past {LONG_RUNTIME_CALL_NS // 1000} us, and the idle part of launch "
                   f"delays over {LONG_DELAY_NS // 1000} us, summed")
    fix = ("Issue fewer, larger kernels: capture the step in a CUDA graph (torch.cuda.graphs, "
           "torch.compile(mode='reduce-overhead')), fuse small ops (torch.compile), raise the batch "
           "size, and remove host syncs (.item(), .cpu(), blocking copies) from the loop.")
    source = ("PyTorch CUDA graphs documentation ('Why CUDA Graphs?'); NVIDIA Nsight Systems user guide, "
              "'CPU-bound and launch-bound workloads'")

    def check(self, data: RunData) -> Finding | None:
        work = _work(data)
        window = _span(data)
        launches = work[work["launch_name"].isin(LAUNCH_CALLS)]
        launch_share = float(launches["launch_dur"].sum()) / window if window else 0.0
        idle = _idle_delays(work)
        evidence = [*_short_kernels(work), *_long_calls(data), *(e for e, _, _ in idle)]
        stake = sum(e.time_ns for e in evidence)
        if launch_share < LAUNCH_SHARE and stake < STAKE_SHARE * window:
            return None
        summary = (f"launch calls take {launch_share:.1%} of the run's {duration(window)}; the other "
                   f"signs add {duration(stake)} ({percent(stake, window)})")
        severity = Severity.HIGH if launch_share >= LAUNCH_SHARE else Severity.MODERATE
        # The host's own costs are this rule's alone; the GPU's idle time is also low utilisation's.
        own = stake - sum(e.time_ns for e, _, _ in idle)
        claims = [Claim(f"{self.name}: host", own),
                  *(data.idle_claim(rank, device, e.time_ns) for e, rank, device in idle)]
        return self.finding(severity, stake, summary, evidence, claims)


def _work(data: RunData) -> pd.DataFrame:
    """Every kernel, memcpy and memset with its launch call's name, start and duration."""
    frame = data.run.sql(
        "SELECT w.rank, w.name, w.kind, w.device, w.start_ns, w.dur_ns, r.name AS launch_name, "
        "r.start_ns AS launch_ns, r.dur_ns AS launch_dur FROM slices w LEFT JOIN slices r "
        f"ON r.rank = w.rank AND r.kind = '{Kind.RUNTIME}' AND r.correlation_id = w.correlation_id "
        f"WHERE w.kind IN {DEVICE_KINDS_SQL}{data.where('w.rank')}")
    return frame.astype({"start_ns": "int64", "dur_ns": "int64"})


def _span(data: RunData) -> float:
    rows = data.run.query(f"SELECT max(start_ns + dur_ns) - min(start_ns) FROM slices WHERE device = 'cpu'{data.where()}").rows
    return float(rows[0][0] or 0) if rows else 0.0


def _short_kernels(work: pd.DataFrame) -> list[Evidence]:
    """Kernels shorter than their launch, measured against the shortest launch of their name: a
    first launch also loads the module, and a launch into a full queue waits for the GPU."""
    kernels = work[(work["kind"] == Kind.KERNEL) & work["launch_dur"].notna()]
    launch = kernels.groupby("name")["launch_dur"].transform("min")
    short = kernels.assign(launch=launch)[kernels["dur_ns"] < launch]
    by_name = short.assign(lost=short["launch"] - short["dur_ns"]).groupby("name").agg(
        calls=("lost", "size"), lost=("lost", "sum"), kernel=("dur_ns", "mean"), launch=("launch", "min"))
    return [Evidence(f"kernel {name}", f"{int(r.calls)} calls shorter than their launch "
                     f"({duration(r.kernel)} against {duration(r.launch)})", float(r.lost))
            for name, r in by_name.iterrows()]


def _long_calls(data: RunData) -> list[Evidence]:
    """Runtime calls over :data:`LONG_RUNTIME_CALL_NS`, but each name's first (which loads
    modules and creates contexts) and the calls that wait for the GPU or set it up."""
    numbered = (f"SELECT rank, name, dur_ns, row_number() OVER (PARTITION BY rank, name ORDER BY start_ns) AS nth "
                f"FROM slices WHERE kind = '{Kind.RUNTIME}'{data.where()}")
    calls = data.run.sql(
        f"SELECT name, count(*) AS calls, CAST(sum(dur_ns - {LONG_RUNTIME_CALL_NS}) AS BIGINT) AS past "
        f"FROM ({numbered}) AS r WHERE nth > 1 AND dur_ns > {LONG_RUNTIME_CALL_NS} GROUP BY name")
    calls = calls[~calls["name"].str.contains(_WAITS, regex=True)]
    return [Evidence(f"runtime {r['name']}", f"{r['calls']} calls over {LONG_RUNTIME_CALL_NS // 1000} us",
                     float(r["past"])) for r in calls.to_dict("records")]


def _idle_delays(work: pd.DataFrame) -> list[tuple[Evidence, int, str]]:
    """The GPU's idle time while launched kernels waited over :data:`LONG_DELAY_NS` to start.

    Kernels launched back to back behind one late kernel all wait through the same gap, so the
    waits are merged first (their union per GPU) and each merged gap is put down to the kernel
    whose launch opened it.

    Returns:
        Each kernel name's evidence per GPU, with the GPU's rank and device.
    """
    found: dict[tuple[str, str, int], list[float]] = {}
    for (rank, device), on_device in work.groupby(["rank", "device"]):
        starts = on_device["start_ns"].to_numpy(dtype=np.int64)
        busy = Coverage(starts, starts + on_device["dur_ns"].to_numpy(dtype=np.int64))
        kernels = on_device[(on_device["kind"] == Kind.KERNEL) & on_device["launch_ns"].notna()]
        ended = kernels.assign(launch_end=kernels["launch_ns"] + kernels["launch_dur"])
        late = ended[ended["start_ns"] - ended["launch_end"] > LONG_DELAY_NS].sort_values("launch_end")
        if late.empty:
            continue
        # From the launch call's end: a long call is the host's cost, counted apart.
        launched = late["launch_end"].to_numpy(dtype=np.int64)
        waits = Coverage(launched, late["start_ns"].to_numpy(dtype=np.int64))
        idle = (waits.ends - waits.starts) - busy.within(waits.starts, waits.ends)
        opener = late["name"].to_numpy()[np.searchsorted(launched, waits.starts)]
        for name, gap in zip(opener, idle, strict=True):
            if gap > 0:
                found.setdefault((str(name), str(device), int(rank)), []).append(float(gap))
    return [(Evidence(f"kernel {name} on {device}",
                      f"{len(gaps)} launches waited over {LONG_DELAY_NS // 1000} us while the GPU idled",
                      sum(gaps)), rank, device) for (name, device, rank), gaps in found.items()]
