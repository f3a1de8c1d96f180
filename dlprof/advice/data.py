"""What the advice rules read: one run (or one rank of it), its analyses computed once.

    data = RunData(run, rank=None)
    data.counted_steps      # the step report's counted steps (data wait, forward... per step, user_ns)
    data.gpu_time           # each GPU's busy time by part and its own idle time, per counted step
    data.gpu_steps          # dlprof gpu's windows per GPU and counted step (kernels' waits)
    data.missing(Need.DEVICE)   # None, or why the run cannot give it

Time is the user's: a step's ``user_ns`` is its duration less dlprof's own pauses (its profiler
part), and a GPU's span in a step leaves out the time it sat idle while dlprof held the program.

Several rules read the same analysis (the step report, the GPU breakdown); each is computed on
first use and kept, so a run is never analysed twice for one ``dlprof advise``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Any

import pandas as pd

from dlprof.advice.base import Claim, Need
from dlprof.analysis.aggregate import has_device_activity, kinds_present
from dlprof.analysis.ancestry import nearest_ancestor
from dlprof.analysis.gpu import ALL, gpu_breakdown
from dlprof.analysis.ranks import rank_steps
from dlprof.analysis.sql import DEVICE_KINDS_SQL, rank_condition
from dlprof.analysis.steps import IDLE, StepPart, StepReport, StepStatus, step_report
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
    def all_steps(self) -> pd.DataFrame:
        """Every step of the step report, with ``user_ns``: its time less dlprof's pauses."""
        steps = self.steps.steps
        return steps.assign(user_ns=steps["dur_ns"] - steps[f"{StepPart.PROFILER}_ns"])

    @cached_property
    def counted_steps(self) -> pd.DataFrame:
        """The counted steps (warm-up and partial ones left out), one row per step, with ``user_ns``."""
        steps = self.all_steps
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
        """dlprof gpu's rows of counted steps (busy, idle, kernels' launch cost and queueing), or
        each GPU's whole-run row in a run without them."""
        table = self.gpu
        counted = set(self.counted_steps["step"])
        if counted:
            return table[table["step"].isin(counted)].reset_index(drop=True)
        return table[table["step"] == ALL].reset_index(drop=True)

    @cached_property
    def gpu_time(self) -> pd.DataFrame:
        """Each GPU's time in each counted step as the step report's GPU breakdown gives it.

        Returns:
            ``rank``, ``device``, ``step``, ``span_ns`` (the step less the GPU's time held by
            dlprof's pauses), ``busy_ns`` (work launched by the program), ``idle_ns`` (the GPU's
            own: span = busy + idle) and ``{part}_ns`` for each part of the user's step (the work
            launched in it); one row per GPU and counted step. In a run without counted steps,
            each GPU's whole span, its work all under ``other``.
        """
        parts = [f"{p}_ns" for p in StepPart if p is not StepPart.PROFILER]
        counted = set(self.counted_steps["step"])
        if counted:
            table = self.steps.device_steps
            table = table[table["step"].isin(counted)].reset_index(drop=True)
            busy = table[parts].sum(axis=1)
            table = table.assign(busy_ns=busy, span_ns=busy + table[f"{IDLE}_ns"])
        else:
            whole = self.gpu_steps
            table = whole.assign(**{part: 0 for part in parts}).assign(**{f"{StepPart.OTHER}_ns": whole["busy_ns"]})
        return table[["rank", "device", "step", "span_ns", "busy_ns", "idle_ns", *parts]].astype(
            {"rank": "int64", "span_ns": "float64", "busy_ns": "float64", "idle_ns": "float64"})

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
        launched = self.device_time_under(f"kind = '{Kind.OP}' AND name IN {self.run.engine.dialect.literals(ops)}")
        grouped = launched.groupby(["op", "kernel", "device"], as_index=False).agg(
            calls=("launches", "sum"), dur_ns=("device_ns", "sum"))
        return grouped.sort_values("dur_ns", ascending=False, ignore_index=True)

    def device_time_under(self, wanted: str) -> pd.DataFrame:
        """The device work launched inside the slices for which ``wanted`` holds: every kernel,
        copy and memset under the innermost such slice around its runtime call (``aten::conv2d``
        for the kernels of the ``cudnn_convolution`` inside it), so no piece counts twice.

        The slices are found by :func:`~dlprof.analysis.ancestry.nearest_ancestor` among the
        wanted slices and the runtime calls only: a fixed number of sorts, whatever the run's size.

        Args:
            wanted: a condition over ``slices`` (``kind = 'op' AND name IN (...)``, a range's name).

        Returns:
            ``op`` (the wanted slice's name), ``input_shapes``, ``input_dtypes``, ``kernel``,
            ``kind`` and ``device`` (the device slice's), ``calls`` (distinct wanted slices),
            ``launches`` and ``device_ns``; one row per signature and device slice name, most
            time first. Empty on a run without device work.
        """
        among = f"(kind = '{Kind.RUNTIME}' AND correlation_id IS NOT NULL) OR ({wanted})"
        enclosing = nearest_ancestor(self.run.engine.dialect, wanted, self.rank, among)
        return self.run.sql(
            f"WITH enclosing AS ({enclosing}) "
            "SELECT o.name AS op, o.input_shapes, o.input_dtypes, w.name AS kernel, w.kind, w.device, "
            "count(DISTINCT o.id) AS calls, count(*) AS launches, CAST(sum(w.dur_ns) AS BIGINT) AS device_ns "
            f"FROM slices w JOIN slices r ON r.rank = w.rank AND r.kind = '{Kind.RUNTIME}' "
            "AND r.correlation_id = w.correlation_id "
            "JOIN enclosing e ON e.rank = r.rank AND e.id = r.id AND e.ancestor_id IS NOT NULL "
            "JOIN slices o ON o.rank = e.rank AND o.id = e.ancestor_id "
            f"WHERE w.kind IN {DEVICE_KINDS_SQL}{self.where('w.rank')} "
            "GROUP BY o.name, o.input_shapes, o.input_dtypes, w.name, w.kind, w.device ORDER BY device_ns DESC"
        )

    def time_spent(self, host_ns: float, device_ns: float) -> float:
        """The time a fix of host work saves: on a GPU run the device time it launched (the GPU's
        work is what a step waits for), elsewhere the host time itself."""
        return float(device_ns) if self.has_device else float(host_ns)

    @property
    def time_word(self) -> str:
        """How :meth:`time_spent` reads in a summary: ``GPU time`` or ``time``."""
        return "GPU time" if self.has_device else "time"

    def kernel_claim(self, kernel: str, device: str, ns: float, share: float = 1.0) -> Claim:
        """A claim on ``share`` of ``ns`` of a device slice name's time on ``device``: every rule
        that claims a kernel's time names it alike, so ranking gives no time twice."""
        total = self.kernel_totals.get((kernel, device), float(ns))
        return Claim(f"GPU time of {kernel} on {device}", total, share * float(ns) / total if total else 0.0)

    @cached_property
    def kernel_totals(self) -> dict[tuple[str, str], float]:
        """Each device slice name's time per GPU (kernels, copies, memsets): what a claim on it is a part of."""
        rows = self.run.query(
            "SELECT name, device, CAST(sum(dur_ns) AS BIGINT) FROM slices "
            f"WHERE kind IN {DEVICE_KINDS_SQL}{self.where()} GROUP BY name, device").rows
        return {(str(name), str(device)): float(ns or 0) for name, device, ns in rows}

    def idle_claim(self, rank: int, device: str, ns: float) -> Claim:
        """A claim on ``ns`` of a GPU's own idle time in the counted steps (:attr:`gpu_time`): low
        utilisation, memory headroom and launch delays all claim that one time."""
        idle = self.gpu_idle.get((int(rank), str(device)), float(ns))
        return Claim(f"GPU idle time of rank {rank} {device}", max(idle, float(ns)),
                     float(ns) / max(idle, float(ns)) if ns else 0.0)

    @cached_property
    def gpu_idle(self) -> dict[tuple[int, str], float]:
        """Each GPU's own idle time in the counted steps (or in its whole span, without steps)."""
        idle = self.gpu_time.groupby(["rank", "device"])["idle_ns"].sum()
        return {(int(rank), str(device)): float(ns) for (rank, device), ns in idle.items()}

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
