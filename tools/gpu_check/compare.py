"""The comparisons the GPU check makes, as pure functions over plain records.

Each side of a comparison is a list of :class:`Work` items: what dlprof stored, and what the
reference (torch.profiler's own events, or CUPTI's own records counted by a bare tracer) saw of
the same program run the same way. Each function returns a :class:`Part` with the figures it was
judged on, so a failure says by how much::

    part = compare_calls(ours, theirs, "kernel")
    part.status, part.detail        # (Status.FAILED, "2 of 37 names differ: ...")

Standard library only, so that the comparisons are tested on recorded traces without a GPU and
run unchanged where one is.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tools.gpu_check.report import Part, Status

DEVICE_KINDS = ("kernel", "memcpy", "memset")
TIME_TOLERANCE = 0.02  # device time of two runs of one program: within 2 %
UNLINKED = "(no launching op)"
_LISTED = 10  # mismatches named in a part's figures


@dataclass(frozen=True)
class Work:
    """One piece of device work (a kernel, a copy, a memset) as one side saw it."""

    kind: str  # kernel, memcpy or memset
    name: str  # spelled the same way on both sides of a comparison
    dur_ns: int
    launcher: str | None = None  # the op (or API call) that launched it; None when not linked


def compare_counts(what: str, ours: Counter[str], theirs: Counter[str]) -> Part:
    """Whether two multisets of names are equal, naming the names whose counts differ.

    Args:
        what: the claim, as the report shows it.
        ours: dlprof's count per name.
        theirs: the reference's count per name.
    """
    names = sorted(set(ours) | set(theirs), key=lambda n: (-abs(ours[n] - theirs[n]), n))
    differing = [n for n in names if ours[n] != theirs[n]]
    figures: dict[str, Any] = {"dlprof": sum(ours.values()), "reference": sum(theirs.values()),
                               "names": len(names)}
    if not names:
        return Part(what, Status.COULD_NOT_RUN, "neither side recorded any", figures)
    if not differing:
        return Part(what, Status.PASSED,
                    f"{figures['dlprof']} on both sides, {len(names)} names, every count equal", figures)
    figures["differing"] = [{"name": n, "dlprof": ours[n], "reference": theirs[n]}
                            for n in differing[:_LISTED]]
    return Part(what, Status.FAILED,
                f"{len(differing)} of {len(names)} names differ (dlprof {figures['dlprof']}, "
                f"reference {figures['reference']} in all)", figures)


def compare_calls(ours: Sequence[Work], theirs: Sequence[Work], kind: str) -> Part:
    """Calls per name of one kind of device work, dlprof against the reference."""
    return compare_counts(f"{kind} calls per name equal the reference's",
                          Counter(w.name for w in ours if w.kind == kind),
                          Counter(w.name for w in theirs if w.kind == kind))


def compare_time(ours: Sequence[Work], theirs: Sequence[Work], kind: str,
                 tolerance: float = TIME_TOLERANCE) -> Part:
    """Total device time of one kind, dlprof against the reference, within ``tolerance``.

    The two sides are two runs of one program, so their times differ by the GPU's own run-to-run
    variation; the names that moved most are listed to tell noise from a wrong translation.
    """
    what = f"{kind} device time within {tolerance:.0%} of the reference's"
    ours_ns = sum(w.dur_ns for w in ours if w.kind == kind)
    theirs_ns = sum(w.dur_ns for w in theirs if w.kind == kind)
    figures: dict[str, Any] = {"dlprof_ms": round(ours_ns / 1e6, 4), "reference_ms": round(theirs_ns / 1e6, 4)}
    if theirs_ns == 0 and ours_ns == 0:
        return Part(what, Status.COULD_NOT_RUN, f"neither side recorded a {kind}", figures)
    if theirs_ns == 0:
        return Part(what, Status.FAILED, f"the reference recorded no {kind} time", figures)
    ratio = ours_ns / theirs_ns
    figures["ratio"] = round(ratio, 4)
    figures["largest_moves"] = _largest_moves(ours, theirs, kind)
    detail = f"dlprof {ours_ns / 1e6:.3f} ms, reference {theirs_ns / 1e6:.3f} ms: ratio {ratio:.4f}"
    status = Status.PASSED if abs(ratio - 1) <= tolerance else Status.FAILED
    return Part(what, status, detail, figures)


def _largest_moves(ours: Sequence[Work], theirs: Sequence[Work], kind: str) -> list[dict[str, Any]]:
    """The names whose total time differs most between the sides (in ms)."""
    mine, other = Counter[str](), Counter[str]()
    for work in ours:
        if work.kind == kind:
            mine[work.name] += work.dur_ns
    for work in theirs:
        if work.kind == kind:
            other[work.name] += work.dur_ns
    names = sorted(set(mine) | set(other), key=lambda n: (-abs(mine[n] - other[n]), n))[:5]
    return [{"name": n, "dlprof_ms": round(mine[n] / 1e6, 4), "reference_ms": round(other[n] / 1e6, 4)}
            for n in names]


def compare_launchers(ours: Sequence[Work], theirs: Sequence[Work]) -> Part:
    """Each name's launching ops on both sides: the same op launches the same work as often."""
    def key(work: Work) -> str:
        return f"{work.kind} {work.name} <- {work.launcher or UNLINKED}"

    return compare_counts("each kernel, copy and memset has the launching op the reference gives it",
                          Counter(key(w) for w in ours if w.kind in DEVICE_KINDS),
                          Counter(key(w) for w in theirs if w.kind in DEVICE_KINDS))


def check_linked(ours: Sequence[Work], by: str) -> Part:
    """Every piece of device work is linked to what launched it.

    Args:
        ours: dlprof's device work, ``launcher`` set where the store links it.
        by: how the link is made, for the report ("correlation id -> runtime call -> op").
    """
    what = f"every kernel, copy and memset links to its launch ({by})"
    device = [w for w in ours if w.kind in DEVICE_KINDS]
    unlinked = Counter(f"{w.kind} {w.name}" for w in device if w.launcher is None)
    figures: dict[str, Any] = {"device_work": len(device), "unlinked": sum(unlinked.values())}
    if not device:
        return Part(what, Status.FAILED, "no device work recorded", figures)
    if not unlinked:
        return Part(what, Status.PASSED, f"all {len(device)} linked", figures)
    figures["unlinked_names"] = [{"name": n, "count": c} for n, c in unlinked.most_common(_LISTED)]
    return Part(what, Status.FAILED, f"{sum(unlinked.values())} of {len(device)} not linked", figures)


@dataclass(frozen=True)
class Range:
    """Where a metric's values can physically lie, and why."""

    low: float
    high: float
    why: str


# Sampled counters are shared among kernels by overlap, so a value may stray a little past a bound.
SAMPLING_SLACK = 0.05

PHYSICAL_RANGES: dict[str, Range] = {
    "ipc": Range(0.0, 4.0, "an SM issues at most one warp instruction per cycle in each of its "
                 "4 schedulers (Volta and later)"),
    "warps_per_inst": Range(1.0, math.inf, "an issued instruction belongs to a warp active in "
                            "that cycle, so active warps summed over cycles are at least the "
                            "instructions"),
    "gld_per_inst": Range(0.0, 1.0, "global loads are some of the instructions executed"),
    "achieved_occupancy": Range(0.0, 100.0, "active warps per cycle are at most the SM's maximum"),
}


def check_range(rows: Sequence[Mapping[str, Any]], metric: str, valid: Range,
                slack: float = SAMPLING_SLACK) -> Part:
    """Every row's value of ``metric`` lies in ``valid`` (widened by ``slack``) and is finite.

    Args:
        rows: one mapping per kernel name, with ``name`` and the metric (``dlprof metrics``' JSON).
        metric: the column.
        valid: its physical range.
        slack: how far past a bound a sampled value may stray, as a fraction of the bound.
    """
    low = valid.low * (1 - slack)
    high = valid.high * (1 + slack)
    shown = "inf" if math.isinf(valid.high) else f"{valid.high:g}"
    what = f"{metric} within [{valid.low:g}, {shown}]: {valid.why}"
    values = [(str(r.get("name", "")), r.get(metric)) for r in rows]
    measured = [(n, float(v)) for n, v in values if isinstance(v, (int, float)) and not math.isnan(v)]
    figures: dict[str, Any] = {"kernels": len(measured),
                               "values": [{"name": n, metric: round(v, 4)} for n, v in measured[:_LISTED]]}
    if not measured:
        return Part(what, Status.FAILED, f"no kernel has a value of {metric}", figures)
    outside = [(n, v) for n, v in measured if not low <= v <= high]
    if outside:
        figures["outside"] = [{"name": n, metric: v} for n, v in outside[:_LISTED]]
        return Part(what, Status.FAILED, f"{len(outside)} of {len(measured)} kernels outside", figures)
    least, most = min(v for _, v in measured), max(v for _, v in measured)
    return Part(what, Status.PASSED, f"{len(measured)} kernels, from {least:.4g} to {most:.4g}", figures)


def check_order(rows: Sequence[Mapping[str, Any]], metric: str, higher: str, lower: str,
                why: str) -> Part:
    """The kernel named ``higher`` has a larger value of ``metric`` than the one named ``lower``."""
    what = f"{metric}: {higher} above {lower} ({why})"
    by_name = {str(r.get("name")): r.get(metric) for r in rows}
    figures = {higher: by_name.get(higher), lower: by_name.get(lower)}
    a, b = by_name.get(higher), by_name.get(lower)
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return Part(what, Status.FAILED, "a value is missing", figures)
    status = Status.PASSED if a > b else Status.FAILED
    return Part(what, status, f"{higher} {a:.4g}, {lower} {b:.4g}", figures)


@dataclass(frozen=True)
class Window:
    """A span of epoch nanoseconds in which the program did one thing (idle, busy)."""

    start_ns: int
    end_ns: int

    def holds(self, ts_ns: int) -> bool:
        return self.start_ns <= ts_ns <= self.end_ns


def check_rise(samples: Iterable[tuple[int, float]], idle: Window, busy: Window, what: str,
               unit: str, min_rise: float, min_ratio: float = 1.0) -> Part:
    """A gauge's mean while the GPU works exceeds its mean while idle by ``min_rise`` (and by
    ``min_ratio`` times).

    Args:
        samples: (epoch ns, value) readings of one gauge of one GPU.
        idle: when the program left the GPU idle.
        busy: when it kept the GPU working (its ramp-up already cut off).
        what: the claim, as the report shows it.
        unit: the gauge's unit, for the figures.
        min_rise: the least difference of the means, in ``unit``.
        min_ratio: the least ratio busy / idle of the means.
    """
    taken = list(samples)
    idle_values = [v for t, v in taken if idle.holds(t)]
    busy_values = [v for t, v in taken if busy.holds(t)]
    figures: dict[str, Any] = {"unit": unit, "samples_idle": len(idle_values), "samples_busy": len(busy_values)}
    if not idle_values or not busy_values:
        return Part(what, Status.FAILED, "no samples in the idle or the busy window", figures)
    idle_mean = sum(idle_values) / len(idle_values)
    busy_mean = sum(busy_values) / len(busy_values)
    figures |= {"idle_mean": round(idle_mean, 2), "busy_mean": round(busy_mean, 2),
                "idle_max": max(idle_values), "busy_max": max(busy_values)}
    rises = busy_mean - idle_mean >= min_rise and busy_mean >= idle_mean * min_ratio
    detail = (f"idle {idle_mean:.1f} {unit} ({len(idle_values)} samples), busy {busy_mean:.1f} {unit} "
              f"({len(busy_values)} samples); needed a rise of {min_rise:g} {unit}"
              + (f" and {min_ratio:g}x" if min_ratio > 1 else ""))
    return Part(what, Status.PASSED if rises else Status.FAILED, detail, figures)
