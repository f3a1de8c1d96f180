"""The tuning rules: what may make a kernel worth tuning, each a small class that names and
describes itself and answers ``match(kernel, context)`` with a :class:`Finding` or None, as the
patterns of torch.profiler's ``_pattern_matcher`` do. :mod:`dlprof.analysis.tuning` applies them.

    LowOccupancy().match(kernel, TuningContext.of(run))    # Finding(weight, reason) or None
    theoretical_occupancy(kernel, context)                  # (19.0, "registers")
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from dlprof.analysis.derived import BUILTIN_BY_NAME
from dlprof.store.reader import Run

# A kernel launch costs the host a few microseconds end to end (the CUDA runtime call, the
# driver, the doorbell); a kernel shorter than that cannot keep the GPU busy on its own.
TYPICAL_LAUNCH_NS = 5_000
LOW_OCCUPANCY_PCT = 50.0  # below this, too few warps are resident to hide memory latency
HIGH_REGISTERS = 64  # above this, registers cap occupancy below 50% (64K registers, 2048 threads per SM)
MAX_REGISTERS = 255  # the per-thread limit: a kernel there most likely spills to local memory
MAX_BLOCKS_PER_SM = 32  # resident blocks per SM from compute capability 5.0 on
REGISTER_UNIT = 256  # registers are granted to a warp in units of this many
# Collective kernels: their time waits on the other ranks and the network.
COLLECTIVE_KERNEL = re.compile(r"nccl|rccl", re.IGNORECASE)


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
    occupancy: float | None = None  # Kineto's estimated achieved occupancy %, time-weighted, where it made one
    registers: int | None = None  # per thread, the most of any call
    threads: int | None = None  # per block, of its longest call
    shared_memory: int | None = None  # bytes per block, the most of any call
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
    description = (f"Occupancy below {LOW_OCCUPANCY_PCT:.0f}%: Kineto's estimate, or the theoretical one of "
                   "the launch configuration where Kineto made none.")
    basis = Basis.LAUNCH

    def match(self, kernel: KernelSummary, context: TuningContext) -> Finding | None:
        below = f"< {LOW_OCCUPANCY_PCT:.0f}%"
        if kernel.occupancy is not None:
            occupancy, words = kernel.occupancy, f"estimated occupancy {kernel.occupancy:.0f}% ({below})"
        else:
            found = theoretical_occupancy(kernel, context)
            if found is None:
                return None
            occupancy, limit = found
            words = f"theoretical occupancy {occupancy:.0f}% ({below}, limited by {limit})"
        if occupancy >= LOW_OCCUPANCY_PCT:
            return None
        weight = (LOW_OCCUPANCY_PCT - occupancy) / LOW_OCCUPANCY_PCT
        return Finding(weight, f"{words}: too few warps to hide latency")


def theoretical_occupancy(kernel: KernelSummary, context: TuningContext) -> tuple[float, str] | None:
    """The share of an SM's warps a kernel's launch configuration lets be resident, in %, and
    what limits it (``registers``, ``shared memory``, ``block size``, ``blocks per SM``); None
    where the block size or the GPU's per-SM limits are not recorded.

    As CUDA's occupancy calculator: the blocks an SM holds are the least that its threads, its
    registers (granted per warp in units of :data:`REGISTER_UNIT`), its shared memory and the
    limit of :data:`MAX_BLOCKS_PER_SM` allow, at least one (the kernel ran).
    """
    threads_per_sm = context.device_value(kernel.device, "maxThreadsPerMultiprocessor")
    warp = context.device_value(kernel.device, "warpSize") or 32.0
    if not kernel.threads or not threads_per_sm:
        return None
    warps_per_block = math.ceil(kernel.threads / warp)
    limits = {"block size": math.floor(threads_per_sm / warp / warps_per_block), "blocks per SM": MAX_BLOCKS_PER_SM}
    registers_per_sm = context.device_value(kernel.device, "regsPerMultiprocessor")
    if kernel.registers and registers_per_sm:
        per_warp = math.ceil(kernel.registers * warp / REGISTER_UNIT) * REGISTER_UNIT
        limits["registers"] = math.floor(registers_per_sm / (per_warp * warps_per_block))
    shared_per_sm = context.device_value(kernel.device, "sharedMemPerMultiprocessor")
    if kernel.shared_memory and shared_per_sm:
        limits["shared memory"] = math.floor(shared_per_sm / kernel.shared_memory)
    limit = min(limits, key=lambda k: (limits[k], k))
    blocks = max(1, limits[limit])
    return min(100.0, 100.0 * blocks * warps_per_block * warp / threads_per_sm), limit


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
