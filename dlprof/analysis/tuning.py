"""Tuning candidates: which kernels to look at first, and why.

    found = tuning_candidates(run)
    found.table      # rank, name, calls, self_ns, total_ns, score, reasons, rules; best first
    found.basis      # what the scores rest on: counters, or the launch configuration

The ranking is the one TAU's study of CUDA deep-learning workloads used: a ratio per
instruction times the kernel's exclusive time, so that a bad ratio on a kernel that hardly runs
ranks below a mediocre one on the kernel that takes the time. Where the run holds the counters
(see :mod:`dlprof.analysis.derived`), each kernel scores the sum of (warps per instruction) x
time and (global loads per instruction) x time. Where it holds none, the launch configuration
every Kineto kernel event carries gives the signals instead: low occupancy, register pressure, a
grid smaller than the GPU's SM count, a kernel shorter than its launch. Occupancy is Kineto's
estimate where it made one; where it recorded 0 (it could not: Hopper's cluster kernels, cuDNN's
xmma ones) it is the theoretical occupancy dlprof computes from the launch configuration and the
GPU's per-SM limits (:func:`~dlprof.analysis.tuning_rules.theoretical_occupancy`), and the reason says which. Collective
kernels (NCCL, RCCL) are ranked apart: their time is spent waiting for the other ranks, which
no launch configuration explains (:attr:`Candidates.collectives`). Each signal
is a weight in (0, 1] and the score is time x their sum. Times are in milliseconds of exclusive
time summed over a kernel name's calls.

The rules live in :mod:`dlprof.analysis.tuning_rules`, each a small class that names and
describes itself and answers ``match(kernel, context)`` with a finding (weight and reason in
words) or None. Every rule's reason is listed; only the rules of the run's basis add to the score.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from dlprof.analysis.derived import BUILTIN_BY_NAME, Grouping, derived_metrics
from dlprof.analysis.sql import launch_calls
from dlprof.analysis.tuning_rules import (
    COLLECTIVE_KERNEL,
    COUNTER_METRICS,
    RULES,
    Basis,
    Finding,
    KernelSummary,
    LowOccupancy,
    RegisterPressure,
    TuningContext,
    TuningRule,
    theoretical_occupancy,
)
from dlprof.keys import PROFILER_RANGE, Kind
from dlprof.store.reader import Run

CANDIDATE_COLUMNS = ["rank", "name", "calls", "self_ns", "total_ns", "score", "reasons", "rules"]
# The rules' names, kept importable from here where the ranking is.
__all__ = ["CANDIDATE_COLUMNS", "RULES", "Basis", "Candidates", "Finding", "KernelSummary", "LowOccupancy",
           "RegisterPressure", "TuningContext", "TuningRule", "kernel_summaries", "theoretical_occupancy",
           "tuning_candidates"]


@dataclass(frozen=True, eq=False)
class Candidates:
    """A ranking: its table and what the scores rest on."""

    table: pd.DataFrame  # CANDIDATE_COLUMNS
    basis: Basis
    # Collective kernels, ranked apart: name, calls, self_ns; their time waits on other ranks.
    collectives: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=["name", "calls", "self_ns"]))


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
    apart = [k for k in kernels if COLLECTIVE_KERNEL.search(k.name)]
    collectives = pd.DataFrame([{"name": k.name, "calls": k.calls, "self_ns": k.self_ns} for k in apart],
                               columns=["name", "calls", "self_ns"]).sort_values("self_ns", ascending=False,
                                                                                 ignore_index=True)
    kernels = [k for k in kernels if not COLLECTIVE_KERNEL.search(k.name)]
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
        return Candidates(pd.DataFrame(columns=CANDIDATE_COLUMNS), basis, collectives)
    table = pd.DataFrame(rows).sort_values(
        ["score", "self_ns", "name"], ascending=[False, False, True], kind="stable"
    ).reset_index(drop=True)
    table.insert(0, "rank", np.arange(1, len(table) + 1))
    return Candidates(table.head(limit) if limit else table, basis, collectives)


def kernel_summaries(run: Run) -> list[KernelSummary]:
    """Each kernel name's calls summarised: times, launch configuration, counter ratios.

    Counter ratios come from the kernels' own counters and from cuda_profiler_range slices of
    the same name (Kineto's range profiler names each range after its kernel), summed first.
    """
    kernels = (
        f"SELECT k.name, k.self_ns, k.dur_ns, k.device, k.start_ns, k.registers, k.grid, k.block, k.shared_memory, "
        # Kineto writes 0 where it could not estimate occupancy: no kernel that ran had none.
        f"CASE WHEN k.occupancy > 0 THEN CAST(k.occupancy AS DOUBLE) END AS occupancy, "
        f"c.dur_ns AS launch_ns FROM slices k "
        f"LEFT JOIN ({launch_calls(with_parent=False)}) AS c ON c.rank = k.rank AND c.correlation_id = k.correlation_id "
        f"WHERE k.kind = '{Kind.KERNEL}'"
    )
    summary = run.query(
        "SELECT name, count(*) AS calls, CAST(coalesce(sum(self_ns), 0) AS BIGINT) AS self_ns, "
        "CAST(coalesce(sum(dur_ns), 0) AS BIGINT) AS total_ns, min_by(device, start_ns) AS device, "
        "max(registers) AS registers, min(launch_ns) AS launch_ns, max_by(block, dur_ns) AS block, "
        "max(shared_memory) AS shared_memory, "
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
            threads=_block_threads(row["block"]),
            shared_memory=_optional_int(row["shared_memory"]),
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


def _block_threads(block: object) -> int | None:
    """Threads in a block given as JSON text (``"[128,1,1]"``); None when unknown."""
    threads = _grid_blocks(block)
    return None if math.isnan(threads) else int(threads)


def _optional_int(value: Any) -> int | None:
    return None if pd.isna(value) else int(value)
