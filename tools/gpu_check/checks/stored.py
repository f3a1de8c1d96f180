"""dlprof's side of the comparisons: what a run stored, read back with ``dlprof.load``.

    run = dlprof.load(path)
    work = device_work(run, Link.OP)         # kernels, copies, memsets with their launching op
    part = run_complete(run, ["cupti"])      # complete, and the named collectors were active

A kernel is linked to its launch through the store's correlation ids: the runtime or driver call
with the same correlation id (per rank), and for :attr:`Link.OP` that call's parent op, as
``dlprof top --group-by op`` finds it (:func:`dlprof.analysis.aggregate.launches`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from enum import Enum
from typing import Any

import pandas as pd

from dlprof.analysis.aggregate import launches
from dlprof.keys import DEVICE_KINDS, Kind, RunStatus
from dlprof.store.reader import Run
from tools.gpu_check.compare import Work
from tools.gpu_check.report import Part, Status


class Link(Enum):
    """What a piece of device work is linked to."""

    OP = "the op that made the launching call"
    API_CALL = "the CUDA API call that launched it"


def device_work(run: Run, link: Link, rename: Callable[[str, str], str] | None = None) -> list[Work]:
    """Every kernel, memcpy and memset of the run, with what launched it.

    Args:
        run: the run.
        link: what ``launcher`` names: the launching call's op, or the call itself.
        rename: (kind, stored name) -> the name the comparison uses; by default the stored name.
    """
    slices = run.slices
    device = slices[slices["kind"].isin([str(k) for k in DEVICE_KINDS])]
    names = slices.set_index("id")["name"].astype(str)
    if link is Link.OP:
        linked = launches(run).set_index("id")["launcher_id"]
        launcher = device["id"].map(linked).map(names)
    else:
        calls = slices[(slices["kind"] == str(Kind.RUNTIME)) & slices["correlation_id"].notna()]
        calls = calls.drop_duplicates(["rank", "correlation_id"])
        keyed = calls.set_index(["rank", "correlation_id"])["name"].astype(str)
        index = pd.MultiIndex.from_frame(device[["rank", "correlation_id"]])
        launcher = pd.Series(keyed.reindex(index).to_numpy(), index=device.index)
    work = []
    for kind, name, dur, by in zip(device["kind"].astype(str), device["name"].astype(str),
                                   device["dur_ns"], launcher, strict=True):
        work.append(Work(kind, rename(kind, name) if rename else name, int(dur),
                         None if pd.isna(by) else str(by)))
    return work


def api_calls(run: Run) -> list[str]:
    """The names of the run's CUDA runtime and driver calls, one per call."""
    slices = run.slices
    return [str(n) for n in slices.loc[slices["kind"] == str(Kind.RUNTIME), "name"]]


def run_complete(run: Run, collectors: Iterable[str]) -> Part:
    """The run was saved complete and each named collector was active (their notes as figures)."""
    wanted = list(collectors)
    info = {c.name: c for c in run.manifest.collectors}
    figures: dict[str, Any] = {"status": str(run.status), "slices": len(run.slices),
                               "notes": {n: info[n].notes for n in wanted if n in info and info[n].notes}}
    inactive = [n for n in wanted if n not in info or not info[n].active]
    what = f"the run is complete with {', '.join(wanted)} active"
    if run.status is not RunStatus.COMPLETE:
        return Part(what, Status.FAILED, f"the run is {run.status}: {run.manifest.error}", figures)
    if inactive:
        why = "; ".join(f"{n}: {' '.join(info[n].notes) if n in info else 'not in the manifest'}"
                        for n in inactive)
        return Part(what, Status.FAILED, f"not active: {why}", figures)
    return Part(what, Status.PASSED, f"{len(run.slices)} slices", figures)


SPAN_SLACK_NS = 1_000_000  # a clock mapping's uncertainty is microseconds; a wrong one is seconds


def within_span(run: Run, clock: str) -> Part:
    """Every kernel, copy and memset lies within the run's own span, so the device clock
    (``clock`` in the manifest) was mapped onto epoch nanoseconds.

    Args:
        run: the run.
        clock: the clock domain that maps the device work ("cupti", "kineto").
    """
    slices = run.slices
    device = slices[slices["kind"].isin([str(k) for k in DEVICE_KINDS])]
    start, end = run.manifest.start_ns, run.manifest.end_ns
    domains = {c.name: c for c in run.manifest.clocks}
    figures: dict[str, Any] = {"device_work": len(device),
                               "clock": domains[clock].method if clock in domains else None}
    what = f"device work lies within the run's span (the {clock} clock mapped to epoch ns)"
    if device.empty:
        return Part(what, Status.FAILED, "no device work recorded", figures)
    if clock not in domains:
        return Part(what, Status.FAILED, f"the manifest has no {clock} clock", figures)
    first = int(device["start_ns"].min())
    last = int((device["start_ns"] + device["dur_ns"]).max())
    figures |= {"first_after_start_ms": (first - start) / 1e6, "last_before_end_ms": (end - last) / 1e6}
    inside = first >= start - SPAN_SLACK_NS and last <= end + SPAN_SLACK_NS
    detail = (f"first {(first - start) / 1e6:.3f} ms after the run's start, last "
              f"{(end - last) / 1e6:.3f} ms before its end")
    return Part(what, Status.PASSED if inside else Status.FAILED, detail, figures)
