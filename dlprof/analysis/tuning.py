"""Tuning candidates: which kernels to look at first, and why.

    found = tuning_candidates(run)
    found.table      # rank, name, calls, self_ns, total_ns, score, reasons, rules; best first
    found.basis      # what the scores rest on: counters, or the launch configuration

The ranking is the one TAU's study of CUDA deep-learning workloads used: a ratio per
instruction times the kernel's exclusive time, so that a bad ratio on a kernel that hardly runs
ranks below a mediocre one on the kernel that takes the time. Where the run holds the counters
(see :mod:`dlprof.analysis.derived`), each kernel scores the sum of (warps per instruction) x
time and (global loads per instruction) x time. Where it holds none, the launch configuration
every Kineto kernel event carries gives the signals instead: low estimated occupancy, register
pressure, a grid smaller than the GPU's SM count, a kernel shorter than its launch. Each signal
is a weight in (0, 1] and the score is time x their sum. Times are in milliseconds of exclusive
time summed over a kernel name's calls.

Each rule is a small class that names and describes itself and answers ``match(kernel,
context)`` with a :class:`Finding` (weight and reason in words) or None, as the patterns of
torch.profiler's ``_pattern_matcher`` do. Every rule's reason is listed; only the rules of the
run's basis add to the score.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from dlprof.analysis.derived import BUILTIN_BY_NAME, Grouping, derived_metrics
from dlprof.analysis.sql import launch_calls
from dlprof.keys import PROFILER_RANGE, Kind
from dlprof.store.reader import Run

# A kernel launch costs the host a few microseconds end to end (the CUDA runtime call, the
# driver, the doorbell); a kernel shorter than that cannot keep the GPU busy on its own.
TYPICAL_LAUNCH_NS = 5_000
LOW_OCCUPANCY_PCT = 50.0  # below this, too few warps are resident to hide memory latency
HIGH_REGISTERS = 64  # above this, registers cap occupancy below 50% (64K registers, 2048 threads per SM)
MAX_REGISTERS = 255  # the per-thread limit: a kernel there most likely spills to local memory

CANDIDATE_COLUMNS = ["rank", "name", "calls", "self_ns", "total_ns", "score", "reasons", "rules"]


class Basis(StrEnum):
    """What a ranking's scores rest on."""

    COUNTERS = "counters"
    LAUNCH = "launch configuration"


@dataclass(frozen=True)
class KernelSummary:
    """One kernel name over all its calls: times, launch configuration, counter ratios."""

    name: str
    calls: int
    self_ns: int  # exclusive time, summed over calls
    total_ns: int
    device: str  # of its first call
    occupancy: float | None = None  # estimated achieved occupancy %, time-weighted mean
    registers: int | None = None  # per thread, the most of any call
    blocks: int | None = None  # blocks in the grid, median over calls
    launch_ns: float | None = None  # the shortest runtime call that launched it
    per_inst: Mapping[str, float] = field(default_factory=dict)  # derived metric -> value

    @property
    def mean_ns(self) -> float:
        return self.total_ns / self.calls if self.calls else 0.0


@dataclass(frozen=True)
class TuningContext:
    """What the rules may know beyond the kernel: the GPUs and the launch-cost yardstick."""

    devices: Mapping[str, Mapping[str, Any]]  # "cuda:0" -> Kineto deviceProperties
    typical_launch_ns: float = TYPICAL_LAUNCH_NS

    @classmethod
    def of(cls, run: Run) -> TuningContext:
        devices = run.manifest.devices
        return cls({f"cuda:{d.get('id', i)}": d for i, d in enumerate(devices) if isinstance(d, dict)})

    def device_value(self, device: str, key: str) -> float | None:
        value = self.devices.get(device, {}).get(key)
        return float(value) if isinstance(value, (int, float)) and value > 0 else None


@dataclass(frozen=True)
class Finding:
    """A rule's verdict on one kernel: how much it weighs and why, in words."""

    weight: float
    reason: str


class TuningRule:
    """A rule that may find a kernel worth tuning; subclasses describe and match."""

    name: ClassVar[str]
    description: ClassVar[str]
    basis: ClassVar[Basis]

    def match(self, kernel: KernelSummary, context: TuningContext) -> Finding | None:
        """A finding for ``kernel``, or None when the rule does not apply or cannot tell."""
        raise NotImplementedError


class _PerInstruction(TuningRule):
    """TAU's ranking term: a counter ratio per instruction, weighted by time."""

    basis = Basis.COUNTERS
    metric: ClassVar[str]  # a built-in derived metric
    advice: ClassVar[str]

    def match(self, kernel: KernelSummary, context: TuningContext) -> Finding | None:
        value = kernel.per_inst.get(self.metric)
        if value is None or not math.isfinite(value) or value <= 0:
            return None
        unit = BUILTIN_BY_NAME[self.metric].unit
        return Finding(value, f"{value:.3g} {unit}: {self.advice}")


class WarpsPerInstruction(_PerInstruction):
    name = "warps-per-instruction"
    description = "Active warps per instruction executed x exclusive time (TAU's ranking)."
    metric = "warps_per_inst"
    advice = "active warps per instruction issued; high means warps wait (memory latency, dependencies)"


class GlobalLoadsPerInstruction(_PerInstruction):
    name = "global-loads-per-instruction"
    description = "Global-memory load instructions per instruction x exclusive time (TAU's ranking)."
    metric = "gld_per_inst"
    advice = "global loads per instruction; high means memory-bound (reuse data: shared memory, fusion)"


class LowOccupancy(TuningRule):
    name = "low-occupancy"
    description = f"Estimated achieved occupancy below {LOW_OCCUPANCY_PCT:.0f}%."
    basis = Basis.LAUNCH

    def match(self, kernel: KernelSummary, context: TuningContext) -> Finding | None:
        if kernel.occupancy is None or kernel.occupancy >= LOW_OCCUPANCY_PCT:
            return None
        weight = (LOW_OCCUPANCY_PCT - kernel.occupancy) / LOW_OCCUPANCY_PCT
        return Finding(weight, f"estimated occupancy {kernel.occupancy:.0f}% (< "
                       f"{LOW_OCCUPANCY_PCT:.0f}%): too few warps to hide latency")


class RegisterPressure(TuningRule):
    name = "register-pressure"
    description = f"More than {HIGH_REGISTERS} registers per thread, or the {MAX_REGISTERS} limit."
    basis = Basis.LAUNCH

    def match(self, kernel: KernelSummary, context: TuningContext) -> Finding | None:
        registers = kernel.registers
        if registers is None or registers <= HIGH_REGISTERS:
            return None
        reason = f"{registers} registers per thread (> {HIGH_REGISTERS})"
        if registers >= MAX_REGISTERS:
            reason += f", at the {MAX_REGISTERS} limit: likely spilling to local memory"
        per_sm = context.device_value(kernel.device, "regsPerMultiprocessor")
        threads = context.device_value(kernel.device, "maxThreadsPerMultiprocessor")
        warp = context.device_value(kernel.device, "warpSize") or 32.0
        if per_sm and threads:
            # Registers are granted per warp; the warps that fit cap the resident threads.
            capped = min(1.0, math.floor(per_sm / (registers * warp)) * warp / threads)
            reason += f": registers alone cap occupancy at {100 * capped:.0f}%"
            return Finding(1.0 - capped, reason)
        return Finding(min(1.0, registers / MAX_REGISTERS), reason)


class SmallGrid(TuningRule):
    name = "small-grid"
    description = "Fewer blocks in the grid than the GPU has SMs: some SMs have nothing to run."
    basis = Basis.LAUNCH

    def match(self, kernel: KernelSummary, context: TuningContext) -> Finding | None:
        sms = context.device_value(kernel.device, "numSms")
        if kernel.blocks is None or sms is None or kernel.blocks >= sms:
            return None
        idle = int(sms) - kernel.blocks
        blocks = f"{kernel.blocks} block" + ("s" if kernel.blocks != 1 else "")
        return Finding(idle / sms, f"grid of {blocks} on {int(sms)} SMs: {idle} SMs idle")


class ShortKernel(TuningRule):
    name = "short-kernel"
    description = (f"Shorter per call than a typical launch ({TYPICAL_LAUNCH_NS / 1000:.0f} us) "
                   "or than its own launch call: launch-bound.")
    basis = Basis.LAUNCH

    def match(self, kernel: KernelSummary, context: TuningContext) -> Finding | None:
        own = kernel.launch_ns or 0.0
        threshold = max(context.typical_launch_ns, own)
        if kernel.mean_ns >= threshold:
            return None
        if own > context.typical_launch_ns:
            than = f"the {own / 1000:.1f} us its launch call takes"
        else:
            than = f"a typical launch ({context.typical_launch_ns / 1000:.0f} us)"
        return Finding(1.0 - kernel.mean_ns / threshold,
                       f"{kernel.mean_ns / 1000:.1f} us per call, less than {than}: "
                       "launch-bound; fuse kernels or use CUDA graphs")


RULES: tuple[TuningRule, ...] = (
    WarpsPerInstruction(),
    GlobalLoadsPerInstruction(),
    LowOccupancy(),
    RegisterPressure(),
    SmallGrid(),
    ShortKernel(),
)
COUNTER_METRICS = tuple(r.metric for r in RULES if isinstance(r, _PerInstruction))


@dataclass(frozen=True, eq=False)
class Candidates:
    """A ranking: its table and what the scores rest on."""

    table: pd.DataFrame  # CANDIDATE_COLUMNS
    basis: Basis


def tuning_candidates(
    run: Run, rules: Sequence[TuningRule] = RULES, limit: int | None = None
) -> Candidates:
    """Rank a run's kernels by how much tuning them may gain.

    Args:
        run: the run; its kernel slices are ranked.
        rules: the rules to apply (default :data:`RULES`).
        limit: at most this many candidates (None: all).

    Returns:
        One row per kernel name that some rule matched, by score (then exclusive time),
        with every matching rule's reason. ``score`` is the exclusive milliseconds times the
        summed weights of the matching rules of the run's basis.

    Raises:
        ValueError: the run holds no kernels.
    """
    kernels = kernel_summaries(run)
    if not kernels:
        raise ValueError("the run holds no kernels to rank")
    context = TuningContext.of(run)
    has_counters = any(k.per_inst for k in kernels)
    basis = Basis.COUNTERS if has_counters else Basis.LAUNCH
    rows = []
    for kernel in kernels:
        found = [(rule, f) for rule in rules if (f := rule.match(kernel, context)) is not None]
        if not found:
            continue
        weight = sum(f.weight for rule, f in found if rule.basis is basis)
        rows.append({
            "name": kernel.name,
            "calls": kernel.calls,
            "self_ns": kernel.self_ns,
            "total_ns": kernel.total_ns,
            "score": weight * kernel.self_ns / 1e6,
            "reasons": [f.reason for _, f in found],
            "rules": [rule.name for rule, _ in found],
        })
    if not rows:
        return Candidates(pd.DataFrame(columns=CANDIDATE_COLUMNS), basis)
    table = pd.DataFrame(rows).sort_values(
        ["score", "self_ns", "name"], ascending=[False, False, True], kind="stable"
    ).reset_index(drop=True)
    table.insert(0, "rank", np.arange(1, len(table) + 1))
    return Candidates(table.head(limit) if limit else table, basis)


def kernel_summaries(run: Run) -> list[KernelSummary]:
    """Each kernel name's calls summarised: times, launch configuration, counter ratios.

    Counter ratios come from the kernels' own counters and from cuda_profiler_range slices of
    the same name (Kineto's range profiler names each range after its kernel), summed first.
    """
    kernels = (
        f"SELECT k.name, k.self_ns, k.dur_ns, k.device, k.start_ns, k.registers, k.grid, "
        f"CAST(k.occupancy AS DOUBLE) AS occupancy, c.dur_ns AS launch_ns FROM slices k "
        f"LEFT JOIN ({launch_calls(with_parent=False)}) AS c ON c.rank = k.rank AND c.correlation_id = k.correlation_id "
        f"WHERE k.kind = '{Kind.KERNEL}'"
    )
    summary = run.query(
        "SELECT name, count(*) AS calls, CAST(coalesce(sum(self_ns), 0) AS BIGINT) AS self_ns, "
        "CAST(coalesce(sum(dur_ns), 0) AS BIGINT) AS total_ns, min_by(device, start_ns) AS device, "
        "max(registers) AS registers, min(launch_ns) AS launch_ns, "
        "sum(occupancy * dur_ns) AS occupancy_time, "
        "sum(CASE WHEN occupancy IS NOT NULL THEN dur_ns ELSE 0 END) AS occupancy_weight "
        f"FROM ({kernels}) AS kernels GROUP BY name ORDER BY name"
    )
    if not summary.rows:
        return []
    # Grids are few per kernel: their block counts come back per (name, grid), and the median
    # over calls is taken here, weighted by how often each grid was launched.
    grids: dict[str, list[tuple[float, int]]] = {}
    for name, grid, calls in run.query(f"SELECT name, grid, count(*) FROM ({kernels}) AS kernels GROUP BY name, grid"):
        per_grid = _grid_blocks(grid)
        if not math.isnan(per_grid):
            grids.setdefault(str(name), []).append((per_grid, int(calls)))
    ratios = _counter_ratios(run)
    found = []
    for row in summary.records():
        name = str(row["name"])
        weight = float(row["occupancy_weight"] or 0.0)
        median_blocks = _weighted_median(grids.get(name, []))
        found.append(KernelSummary(
            name=name,
            calls=int(row["calls"]),
            self_ns=int(row["self_ns"]),
            total_ns=int(row["total_ns"]),
            device=str(row["device"]),
            # Time-weighted, so that the calls that take the time decide.
            occupancy=float(row["occupancy_time"]) / weight if weight > 0 else None,
            registers=_optional_int(row["registers"]),
            # The shortest launch: a first launch also loads the module (seconds, not microseconds).
            launch_ns=None if row["launch_ns"] is None else float(row["launch_ns"]),
            blocks=None if median_blocks is None else int(median_blocks),
            per_inst=ratios.get(name, {}),
        ))
    return found


def _weighted_median(counted: list[tuple[float, int]]) -> float | None:
    """The median of values each repeated ``count`` times (the mean of the two middle ones for
    an even total, as pandas' median); None for no values."""
    total = sum(count for _, count in counted)
    if not total:
        return None
    ordered = sorted(counted)
    middle = [(total - 1) // 2, total // 2]
    found: list[float] = []
    seen = 0
    for value, count in ordered:
        found += [value for position in middle if seen <= position < seen + count]
        seen += count
    return sum(found) / 2


def _counter_ratios(run: Run) -> dict[str, dict[str, float]]:
    """Kernel name -> the per-instruction ratios it has values for."""
    metrics = [BUILTIN_BY_NAME[m] for m in COUNTER_METRICS]
    table = derived_metrics(run, metrics, Grouping.NAME, kinds=[Kind.KERNEL, PROFILER_RANGE])
    ratios: dict[str, dict[str, float]] = {}
    for metric in table.metrics:
        for name, value in zip(table.values["name"], table.values[metric.name], strict=True):
            if pd.notna(value):
                ratios.setdefault(str(name), {})[metric.name] = float(value)
    return ratios


def _grid_blocks(grid: object) -> float:
    """Blocks in a grid given as JSON text (``"[128,4,1]"``); NaN when unknown."""
    if not isinstance(grid, str):
        return math.nan
    try:
        dims = json.loads(grid)
    except ValueError:
        return math.nan
    if not isinstance(dims, list) or not all(isinstance(d, int) for d in dims):
        return math.nan
    return float(math.prod(dims))


def _optional_int(value: Any) -> int | None:
    return None if pd.isna(value) else int(value)
