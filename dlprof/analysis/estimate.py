"""Predict a run's step time on another device, op by op, with every assumption stated.

    found = estimate(run, named_device("v100"))
    found.median_step_ns, found.median_target_step_ns
    found.ops          # op, shapes, calls, source_ns, target_ns, method, bound
    found.assumptions  # the model's assumptions, in words

Each device slice is predicted on its own (:func:`predict_item`):

- GEMM and convolution kernels (by name, or by the op that launched them) by their roofline:
  target = source x roof time on the target / roof time on the source x efficiency at the
  source / efficiency at the target, in each device's math mode for the work (an fp32 matmul run
  as TF32 on an A100 runs as SGEMM on a V100). Efficiencies come from an :class:`Efficiencies`:
  ``dlprof calibrate``'s measurements per op class, math mode and decade of FLOPs
  (:mod:`dlprof.analysis.efficiency`). Where the target was calibrated and the source was not,
  the source's efficiency is the one the kernel achieved, so the prediction is the target's roof
  time over its measured efficiency. Without measurements, equal efficiency is assumed where the
  math mode is the same on both, and where it is not (efficiency does not carry across math
  modes: TF32 kernels on an A100 reach about a fifth of their peak where a V100's SGEMM reaches
  two thirds or more), the kernel is wave-scaled instead.
- Other kernels with a launch configuration by Habitat's wave scaling
  (:mod:`dlprof.analysis.wave_scaling`), or with ``Method.ROOFLINE`` by their roof ratio.
- Copies by link bandwidth: host-device copies by PCIe, device-device copies and memsets by
  memory bandwidth.
- Collectives are excluded (their time depends on the other ranks and the network) and listed.

A GEMM far below its roof on the source (under :data:`LOW_EFFICIENCY` of it: an ``align1``
fallback, a kernel built for an older architecture) is not held by the roof, so the roof ratio
does not scale it: it is wave-scaled. Work in a format the target has no tensor cores for runs on
its vector units (bf16 on a V100), and the estimate says so (:attr:`Estimate.warnings`).

A step's predicted time follows its critical path (:mod:`dlprof.analysis.critical_path`): the
host's launches stay where they were and each stream's work is replayed with its new times, so a
host-bound step stays host-bound, its idle GPU absorbing slower kernels.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

import numpy as np
import pandas as pd

from dlprof.analysis.critical_path import step_paths
from dlprof.analysis.efficiency import is_gemm, roof_seconds, work_class
from dlprof.analysis.math_modes import MathMode
from dlprof.analysis.roofline import Bound
from dlprof.analysis.run_device import run_device
from dlprof.analysis.traffic import parse_list
from dlprof.analysis.wave_scaling import Launch, is_sub_wave, wave_scaled_ns
from dlprof.analysis.work_items import work_items
from dlprof.hardware.calibration import OpClass
from dlprof.hardware.devices import Device, Precision
from dlprof.keys import Kind
from dlprof.store.reader import Run

OP_COLUMNS = ["op", "shapes", "calls", "source_ns", "target_ns", "method", "bound"]
# A GEMM under this share of its roof on the source is held by something else than the roof.
LOW_EFFICIENCY = 0.25
_COLLECTIVE = re.compile(r"^(nccl|rccl)|^c10d::|^gloo:", re.IGNORECASE)


class Method(StrEnum):
    """``dlprof estimate --method``: the model for kernels that are neither GEMMs nor copies."""

    WAVE = "wave"  # Habitat's wave scaling
    ROOFLINE = "roofline"  # the ratio of the two devices' roofs at the kernel's intensity


class Treatment(StrEnum):
    """What predicted one device slice."""

    ROOFLINE = "roofline"
    WAVE = "wave"
    SUB_WAVE = "sub-wave"  # one wave or less on the origin: clock and occupancy only
    COPY = "copy"
    BANDWIDTH = "bandwidth"  # no launch configuration and no FLOPs: memory bandwidth ratio
    EXCLUDED = "excluded"  # a collective


class Efficiencies(Protocol):
    """Measured efficiencies (roof time / measured time) per device, op class, math mode and
    size: the hook through which a calibration (:class:`~dlprof.analysis.efficiency.MeasuredEfficiencies`)
    replaces the equal-efficiency assumption."""

    def measured_for(self, device: Device) -> bool: ...

    def efficiency(self, device: Device, mode: MathMode, op_class: OpClass, flops: float) -> float | None: ...


class EqualEfficiency:
    """No measurements: every efficiency unknown, so equal efficiency is assumed where it may be."""

    def measured_for(self, device: Device) -> bool:
        return False

    def efficiency(self, device: Device, mode: MathMode, op_class: OpClass, flops: float) -> float | None:
        return None


@dataclass(frozen=True)
class Estimate:
    """A run's predicted time on another device."""

    source: Device
    target: Device
    method: Method
    ops: pd.DataFrame  # OP_COLUMNS, the longest on the source first
    steps: pd.DataFrame  # rank, step, source_ns, target_ns
    excluded: pd.DataFrame  # name, calls, time_ns: collectives left as they were
    predicted_ns: int  # device time a model predicted, on the source
    total_ns: int  # all device time on the source
    assumptions: tuple[str, ...]
    warnings: tuple[str, ...] = ()  # what the target cannot do as the source did (tensor cores)

    @property
    def coverage(self) -> float:
        return self.predicted_ns / self.total_ns if self.total_ns else 0.0

    @property
    def median_step_ns(self) -> float | None:
        return float(self.steps["source_ns"].median()) if len(self.steps) else None

    @property
    def median_target_step_ns(self) -> float | None:
        return float(self.steps["target_ns"].median()) if len(self.steps) else None


def _count(value: Any) -> int:
    """A launch figure as an integer, 0 where the trace has none (None, NaN, pandas' NA)."""
    return 0 if value is None or pd.isna(value) else int(value)


def _dims(text: Any) -> int:
    values = parse_list(text if isinstance(text, str) else None)
    return int(np.prod([v for v in values if isinstance(v, int)])) if values else 0


def predict_item(item: Any, origin: Device, target: Device, method: Method,
                 efficiencies: Efficiencies) -> tuple[float | None, Treatment, Bound | None]:
    """One device slice's predicted time on ``target``.

    Args:
        item: a row of :func:`~dlprof.analysis.work_items.work_items` (``kind``, ``name``,
            ``time_ns``, ``flops``, ``bytes``, ``mode``, ``grid``, ``block``, ``registers``,
            ``shared_memory``, ``op_name``).
        origin: the device it ran on.
        target: the device to predict for.
        method: the model for kernels that are neither GEMMs nor copies.
        efficiencies: measured efficiencies, or :class:`EqualEfficiency`.

    Returns:
        (predicted ns or None when excluded, what predicted it, the bound on the target where known).
    """
    name, time = str(item.name), float(item.time_ns)
    if _COLLECTIVE.search(name) or _COLLECTIVE.search(str(item.op_name or "")) or item.kind == Kind.COMM:
        return None, Treatment.EXCLUDED, None
    if item.kind in (Kind.MEMCPY, Kind.MEMSET):
        # A device without a host link (a CPU row) copies through its memory.
        host = "HtoD" in name or "DtoH" in name
        source_link, target_link = (origin.copy_bandwidth, target.copy_bandwidth) if host else (None, None)
        ratio = (source_link / target_link if source_link and target_link
                 else origin.memory_bandwidth / target.memory_bandwidth)
        return time * ratio, Treatment.COPY, Bound.MEMORY
    flops, moved, mode = float(item.flops), float(item.bytes), item.mode
    known = flops == flops and flops > 0
    intensity = flops / moved if known and moved == moved and moved > 0 else None
    target_mode = mode_on(mode, target)
    ridge = target.ridge_point(target_mode.precision)
    bound = None if intensity is None or ridge is None else (Bound.MEMORY if intensity < ridge else Bound.COMPUTE)
    op_name = item.op_name if isinstance(item.op_name, str) else None
    gemm = is_gemm(name, op_name)
    if known and (gemm or method is Method.ROOFLINE):
        at_source, at_target = roof_seconds(flops, moved, mode, origin), roof_seconds(flops, moved, target_mode, target)
        kind = work_class(name, op_name)
        at_origin, at_goal = efficiencies.efficiency(origin, mode, kind, flops), efficiencies.efficiency(
            target, target_mode, kind, flops)
        if at_goal is not None and at_origin is None and at_source and time > 0:
            # The source's own efficiency is what it achieved: the prediction becomes the
            # target's roof time over the target's measured efficiency.
            at_origin = at_source / (time / 1e9)
        held_elsewhere = gemm and at_goal is None and far_below_roof(at_source, time)
        if at_source and at_target and (at_goal is not None or target_mode == mode or not gemm) and not held_elsewhere:
            ratio = at_target / at_source
            if at_origin is not None and at_goal is not None:
                ratio *= at_origin / at_goal
            return time * ratio, Treatment.ROOFLINE, bound
    blocks, threads = _dims(item.grid), _dims(item.block)
    if blocks and threads and method is Method.WAVE:
        launch = Launch(blocks, threads, _count(item.registers), _count(item.shared_memory))
        predicted = wave_scaled_ns(time, origin, target, launch, intensity, target_mode.precision)
        return predicted, Treatment.SUB_WAVE if is_sub_wave(origin, launch) else Treatment.WAVE, bound
    return time * origin.memory_bandwidth / target.memory_bandwidth, Treatment.BANDWIDTH, Bound.MEMORY


def mode_on(mode: MathMode, target: Device) -> MathMode:
    """The mode ``mode``'s work takes on ``target``: :meth:`MathMode.on`, except that bf16 on a
    GPU without bf16 tensor cores (before Ampere) runs on its vector units, as cuBLAS runs it
    there, not on its fp16 tensor cores."""
    if mode.tensor_core and mode.precision is Precision.BF16 and not target.peak_flops(Precision.BF16):
        return MathMode(Precision.FP32, False)
    return mode.on(target)


def far_below_roof(roof_s: float | None, time_ns: float) -> bool:
    """Whether work that the roof allows in ``roof_s`` seconds, measured at ``time_ns``, ran under
    :data:`LOW_EFFICIENCY` of its roof."""
    return bool(roof_s) and time_ns > 0 and float(roof_s or 0) / (time_ns / 1e9) < LOW_EFFICIENCY


def tensor_core_warnings(items: pd.DataFrame, target: Device) -> tuple[str, ...]:
    """One line per format the run used tensor cores for and the target has none for, with the
    device time concerned and where the target runs it."""
    lines = []
    timed = items.dropna(subset=["time_ns"])
    for mode, part in timed.groupby(timed["mode"].map(lambda m: m.label), sort=True):
        used = MathMode.from_label(str(mode))
        if not used.tensor_core or target.peak_flops(used.precision):
            continue
        on_target = mode_on(used, target)
        lines.append(f"{used.precision}: {target.name} has no {used.precision} tensor cores; "
                     f"{_ms(part['time_ns'].sum())} of {used.label} work is predicted on its {on_target.label}"
                     f"{' units' if not on_target.tensor_core else 's'}")
    return tuple(lines)


def _ms(ns: float) -> str:
    return f"{float(ns) / 1e6:,.1f} ms"


def assumptions(method: Method, efficiencies: Efficiencies, source: Device, target: Device) -> tuple[str, ...]:
    """The model's assumptions in words, for the output."""
    stated = [
        f"device figures: {source.name} and {target.name} from {source.origin}/{target.origin} rows",
        "GEMM and convolution kernels: time scales with the roof (max of FLOPs / peak and bytes / "
        "bandwidth) in each device's math mode for the work",
        _efficiency_assumption(efficiencies, source, target),
        "other kernels: Habitat's wave scaling over bandwidth, clock and SMs, gamma from intensity "
        "against the target's ridge point; kernels of one wave or less: clock ratio and the target's waves"
        if method is Method.WAVE else "other kernels: the ratio of the two roofs at the kernel's intensity",
        "kernels with unknown FLOPs are taken as memory-bound",
        f"GEMMs under {LOW_EFFICIENCY:.0%} of their roof on the source are wave-scaled: something else than the "
        "roof holds them (an alignment fallback, a kernel for an older architecture)",
        "host-device copies scale with PCIe bandwidth, device copies and memsets with memory bandwidth",
        "collectives are excluded and unchanged (they depend on the other ranks and the network)",
        "a step follows its critical path: the host's launches stay where they were, each stream's work is "
        "replayed with its new times (a host-bound step's idle GPU absorbs slower kernels; a faster GPU gives "
        "back at most the host's waits for it); dependencies between streams are not seen",
    ]
    return tuple(stated)


def _efficiency_assumption(efficiencies: Efficiencies, source: Device, target: Device) -> str:
    if efficiencies.measured_for(target):
        where = ("both devices" if efficiencies.measured_for(source)
                 else f"{target.name}; on {source.name} the efficiency each kernel achieved")
        return (f"measured efficiencies (dlprof calibrate) per op class, math mode and decade of FLOPs on {where}: "
                "a GEMM or convolution takes the target's roof time over its measured efficiency there "
                "(the nearest measured decade outside those measured)")
    return ("equal GEMM efficiency (achieved / peak) on both devices where the math mode is the same; "
            "where it differs, efficiency does not carry over and the kernel is wave-scaled")


def predict_items(items: pd.DataFrame, source: Device, target: Device, method: Method,
                  efficiencies: Efficiencies) -> pd.DataFrame:
    """``items`` with ``target_ns``, ``treatment`` and ``target_bound`` added (a pure function)."""
    timed = items.dropna(subset=["time_ns"]).copy()
    predictions = [predict_item(row, source, target, method, efficiencies) for row in timed.itertuples(index=False)]
    timed["target_ns"] = [p[0] for p in predictions]
    timed["treatment"] = [str(p[1]) for p in predictions]
    timed["target_bound"] = [str(p[2]) if p[2] else "" for p in predictions]
    return timed


def _op_rows(items: pd.DataFrame) -> pd.DataFrame:
    predicted = items[items["treatment"] != Treatment.EXCLUDED].copy()
    predicted["op"] = predicted["op_name"].fillna("(no launching op)")
    predicted["shapes"] = predicted["input_shapes"].fillna("")
    rows = []
    for (op, shapes), part in predicted.groupby(["op", "shapes"], sort=False):
        longest = part.loc[part["time_ns"].astype("float64").idxmax()]
        treatments = sorted(set(part["treatment"]))
        rows.append({"op": op, "shapes": shapes, "calls": max(int(part["op_id"].nunique()), 1),
                     "source_ns": int(part["time_ns"].sum()), "target_ns": round(float(part["target_ns"].sum())),
                     "method": "+".join(treatments), "bound": longest["target_bound"]})
    frame = pd.DataFrame(rows, columns=OP_COLUMNS)
    return frame.sort_values(["source_ns", "op"], ascending=[False, True], ignore_index=True)


def estimate(run: Run, target: Device, method: Method = Method.WAVE, rank: int | None = None,
             efficiencies: Efficiencies | None = None, source_name: str | None = None) -> Estimate:
    """Predict a GPU run's device time and steps on ``target``.

    Args:
        run: the loaded run.
        target: the device to predict for.
        method: the model for kernels that are neither GEMMs nor copies.
        rank: only this rank.
        efficiencies: measured efficiencies (default: none, equal efficiency assumed).
        source_name: the device the run ran on, when its recorded one does not resolve.

    Raises:
        UnknownDevice: the run's device resolves to no row.
        ValueError: the run has no device work to predict.
    """
    measured = efficiencies or EqualEfficiency()
    source = run_device(run, source_name, rank)
    found = work_items(run, rank)
    if not found.on_gpu or found.table["time_ns"].isna().all():
        raise ValueError(f"{run.path}: no timed device work (kernels, copies) to predict; estimate needs a GPU run")
    items = predict_items(found.table, source, target, method, measured)
    excluded = items[items["treatment"] == Treatment.EXCLUDED]
    excluded_rows = (excluded.groupby("name", sort=False)["time_ns"].agg(["count", "sum"]).reset_index()
                     .rename(columns={"count": "calls", "sum": "time_ns"}).sort_values("time_ns", ascending=False))
    predicted_ns = int(items.loc[items["treatment"] != Treatment.EXCLUDED, "time_ns"].sum())
    return Estimate(source, target, method, _op_rows(items), step_paths(run, items, rank), excluded_rows,
                    predicted_ns, found.total_ns, assumptions(method, measured, source, target),
                    tensor_core_warnings(items, target))


def relative_error(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """|sum(predicted) - sum(measured)| / sum(measured): the error on a total."""
    total = float(np.sum(measured))
    return abs(float(np.sum(predicted)) - total) / total if total else float("nan")
