"""What the advice rules read: one run (or one rank of it), its analyses computed once.

    data = RunData(run, rank=None)
    data.counted_steps      # the step report's counted steps (data wait, forward... per step)
    data.gpu_steps          # dlprof gpu's busy and idle per GPU and step
    data.missing(Need.DEVICE)   # None, or why the run cannot give it

Several rules read the same analysis (the step report, the GPU breakdown); each is computed on
first use and kept, so a run is never analysed twice for one ``dlprof advise``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Any

import pandas as pd

from dlprof.advice.base import Need
from dlprof.analysis.aggregate import has_device_activity, kinds_present
from dlprof.analysis.gpu import ALL, gpu_breakdown
from dlprof.analysis.ranks import rank_steps
from dlprof.analysis.sql import DEVICE_KINDS_SQL, rank_condition
from dlprof.analysis.steps import StepReport, StepStatus, step_report
from dlprof.keys import Kind
from dlprof.store.reader import Run


class RunData:
    """A run seen by the rules: the analyses they share, each computed once."""

    def __init__(self, run: Run, rank: int | None = None) -> None:
        self.run = run
        self.rank = rank

    def where(self, column: str = "rank") -> str:
        """`` AND rank = N`` when one rank is advised on."""
        return rank_condition(self.rank, column)

    @cached_property
    def kinds(self) -> frozenset[str]:
        return frozenset(kinds_present(self.run, self.rank))

    @cached_property
    def steps(self) -> StepReport:
        return step_report(self.run, self.rank)

    @cached_property
    def counted_steps(self) -> pd.DataFrame:
        """The counted steps (warm-up and partial ones left out), one row per step."""
        steps = self.steps.steps
        return steps[steps["status"] == StepStatus.COUNTED].reset_index(drop=True)

    @cached_property
    def has_device(self) -> bool:
        return has_device_activity(self.run) and bool(self.kinds & {Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET})

    @cached_property
    def gpu(self) -> pd.DataFrame:
        """dlprof gpu's breakdown: per GPU, a row per step and the whole-run row ``all``."""
        return gpu_breakdown(self.run, self.rank)

    @cached_property
    def gpu_steps(self) -> pd.DataFrame:
        """The GPU rows of counted steps, or each GPU's whole-run row in a run without them."""
        table = self.gpu
        counted = set(self.counted_steps["step"])
        if counted:
            return table[table["step"].isin(counted)].reset_index(drop=True)
        return table[table["step"] == ALL].reset_index(drop=True)

    @cached_property
    def rank_steps(self) -> pd.DataFrame:
        """dlprof ranks' table per rank and step, every rank (lags compare ranks)."""
        return rank_steps(self.run)

    @cached_property
    def devices(self) -> dict[str, dict[str, Any]]:
        """``cuda:N`` to the GPU's properties as the run recorded them (Kineto's names)."""
        found = self.run.manifest.devices
        return {f"cuda:{d.get('id', i)}": d for i, d in enumerate(found) if isinstance(d, dict)}

    def compute_capability(self, device: str) -> float | None:
        """``8.0`` for an A100; None where the run does not say."""
        properties = self.devices.get(device, {})
        major, minor = properties.get("computeMajor"), properties.get("computeMinor", 0)
        if not isinstance(major, int) or not isinstance(minor, int):
            return None
        return major + minor / 10

    @cached_property
    def has_shapes(self) -> bool:
        return bool(self.run.query(f"SELECT 1 FROM slices WHERE kind = '{Kind.OP}' AND input_shapes IS NOT NULL "
                                   f"AND input_shapes <> '[]'{self.where()} LIMIT 1").rows)

    @cached_property
    def has_memory(self) -> bool:
        return bool(self.run.query(f"SELECT 1 FROM memory WHERE bytes IS NOT NULL{self.where()} LIMIT 1").rows)

    def missing(self, need: Need) -> str | None:
        """None when the run holds what ``need`` names, else the reason a rule is skipped."""
        # Each need is looked at only when a rule asks: the step report costs a query.
        present: dict[Need, Callable[[], bool]] = {
            Need.STEPS: lambda: not self.counted_steps.empty,
            Need.DEVICE: lambda: self.has_device,
            Need.OPS: lambda: Kind.OP in self.kinds,
            Need.SHAPES: lambda: self.has_shapes,
            Need.DEVICE_PROPERTIES: lambda: any(self.compute_capability(d) for d in self.devices),
            Need.MEMORY: lambda: self.has_memory,
            Need.RANKS: lambda: self.rank is None and len(self.run.ranks()) > 1,
        }
        return None if present[need]() else f"needs {need}"

    def ops_inside(self, container: str) -> pd.DataFrame:
        """The ops on the thread of each slice whose name is LIKE ``container``, while it runs.

        Returns:
            ``container`` (its name), ``name``, ``depth`` (below the container), ``calls``,
            ``dur_ns`` (summed) and ``self_ns``; one row per container name, op and depth.
        """
        literal = self.run.engine.dialect.literal(container)
        return self.run.sql(
            "SELECT c.name AS container, o.name, o.depth - c.depth AS depth, count(*) AS calls, "
            "CAST(sum(o.dur_ns) AS BIGINT) AS dur_ns, CAST(sum(o.self_ns) AS BIGINT) AS self_ns "
            f"FROM slices c JOIN slices o ON o.rank = c.rank AND o.pid = c.pid AND o.tid = c.tid "
            "AND o.start_ns >= c.start_ns AND o.start_ns < c.start_ns + c.dur_ns "
            f"WHERE c.name LIKE {literal} AND o.kind = '{Kind.OP}'{self.where('c.rank')} "
            "GROUP BY c.name, o.name, o.depth - c.depth ORDER BY dur_ns DESC"
        )

    def launched_kernels(self, ops: tuple[str, ...]) -> pd.DataFrame:
        """The device work launched from inside the named ops, each piece under the innermost
        of them around its runtime call (``aten::addmm``, not the ``aten::linear`` around it).

        Returns:
            ``op``, ``kernel`` (the device slice's name), ``device``, ``calls``, ``dur_ns``; one
            row per op, kernel and device, most time first.
        """
        names = self.run.engine.dialect.literals(ops)
        placed = (
            "SELECT w.id, w.name AS kernel, w.device, w.dur_ns, max_by(o.name, o.depth) AS op FROM slices w "
            f"JOIN slices r ON r.rank = w.rank AND r.kind = '{Kind.RUNTIME}' AND r.correlation_id = w.correlation_id "
            "JOIN slices o ON o.rank = r.rank AND o.pid = r.pid AND o.tid = r.tid AND o.start_ns <= r.start_ns "
            "AND o.start_ns + o.dur_ns >= r.start_ns + r.dur_ns "
            f"WHERE w.kind IN {DEVICE_KINDS_SQL} AND o.kind = '{Kind.OP}' AND o.name IN {names}{self.where('w.rank')} "
            "GROUP BY w.id, w.name, w.device, w.dur_ns"
        )
        return self.run.sql(
            "SELECT op, kernel, device, count(*) AS calls, CAST(sum(dur_ns) AS BIGINT) AS dur_ns "
            f"FROM ({placed}) AS p GROUP BY op, kernel, device ORDER BY dur_ns DESC"
        )

    def named(self, pattern: str, kind: str | None = None) -> pd.DataFrame:
        """The slices whose name is LIKE ``pattern`` (of one kind, if given), per name.

        Returns:
            ``name``, ``calls``, ``dur_ns`` (summed), most time first.
        """
        literal = self.run.engine.dialect.literal(pattern)
        of_kind = "" if kind is None else f" AND kind = {self.run.engine.dialect.literal(kind)}"
        return self.run.sql(
            "SELECT name, count(*) AS calls, CAST(sum(dur_ns) AS BIGINT) AS dur_ns FROM slices "
            f"WHERE name LIKE {literal}{of_kind}{self.where()} GROUP BY name ORDER BY dur_ns DESC"
        )

    @cached_property
    def kernels(self) -> pd.DataFrame:
        """Every kernel name per GPU: ``name``, ``device``, ``calls``, ``dur_ns``, most time first."""
        return self.run.sql(
            "SELECT name, device, count(*) AS calls, CAST(sum(dur_ns) AS BIGINT) AS dur_ns FROM slices "
            f"WHERE kind = '{Kind.KERNEL}'{self.where()} GROUP BY name, device ORDER BY dur_ns DESC")
