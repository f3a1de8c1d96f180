"""The device table: what each accelerator can do at most, from its datasheet.

    table = device_table()
    a100 = table.by_name("a100")                  # a row by name or alias
    found = table.resolve(run.manifest.devices[0])  # a run's GPU, from Kineto's deviceProperties
    a100.peak_flops(Precision.TF32), a100.memory_bandwidth, a100.ridge_point(Precision.FP32)

The rows live in ``devices.json`` beside this module, a versioned data file with each row's
datasheet. A row's :class:`Origin` says where its numbers came from: a datasheet, a nominal
placeholder (the generic CPU, scaled by the run's core count), or a measurement.
:meth:`DeviceTable.with_row` returns a table with a row added or replaced, which is how a measured
row (``dlprof calibrate``) takes a datasheet row's place without editing the data file.

Resolution is by name first (the names CUDA and ROCm report, normalised), then by what the
hardware reports about itself: compute capability, SM count and memory size. So Meta's
``A100-PG509-200`` board, named after its part number, is an A100 SXM4 40GB.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache
from importlib import resources
from typing import Any

TABLE_FILE = "devices.json"
TABLE_VERSION = 1
# A reported memory size matches a row's within this share: CUDA reports what the driver leaves
# usable (an A100 "40GB" reports 42.5e9 bytes, an "80GB" 85.1e9), and datasheets round.
MEMORY_TOLERANCE = 0.15


class Precision(StrEnum):
    """A number format a device has a peak for; fp64 and fp32 are vector peaks, the rest matrix."""

    FP64 = "fp64"
    FP32 = "fp32"
    TF32 = "tf32"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"
    INT8 = "int8"


class Vendor(StrEnum):
    """Who makes the device, which decides the names it reports."""

    NVIDIA = "nvidia"
    AMD = "amd"
    CPU = "cpu"


class Origin(StrEnum):
    """Where a row's numbers came from."""

    DATASHEET = "datasheet"
    NOMINAL = "nominal"  # a placeholder so that a roof exists; not a measurement
    MEASURED = "measured"  # measured on the machine (dlprof calibrate)


@dataclass(frozen=True)
class Device:
    """One device's limits. Rates are in units per second (FLOP/s, bytes/s), not tera or giga."""

    name: str
    vendor: Vendor
    origin: Origin
    source: str  # the datasheet (or measurement) the numbers came from
    source_url: str = ""
    aliases: tuple[str, ...] = ()
    compute_capability: str | None = None  # "8.0"; as ROCm reports it for AMD
    sms: int = 0  # streaming multiprocessors (NVIDIA), compute units (AMD), cores (CPU)
    clock_hz: float = 0.0  # the boost clock the peaks assume
    warp_size: int = 32
    memory_bytes: tuple[float, ...] = ()  # the capacities the device is sold with
    memory_bandwidth: float = 0.0
    pcie_bandwidth: float | None = None  # bidirectional, as datasheets state it
    peer_link_bandwidth: float | None = None  # NVLink or Infinity Fabric, bidirectional
    registers_per_sm: int = 0
    shared_memory_per_sm: int = 0  # bytes
    threads_per_sm: int = 0
    peaks: Mapping[Precision, float] = field(default_factory=dict)  # dense FLOP/s (OP/s for int8)

    def peak_flops(self, precision: Precision) -> float | None:
        """The dense peak for ``precision``, or None when the datasheet gives none."""
        return self.peaks.get(precision)

    def ridge_point(self, precision: Precision) -> float | None:
        """FLOPs per byte of memory traffic at which the roof turns from bandwidth to compute."""
        peak = self.peak_flops(precision)
        return peak / self.memory_bandwidth if peak and self.memory_bandwidth else None

    @property
    def copy_bandwidth(self) -> float | None:
        """Bytes/s of one host-device copy: half the PCIe figure, which counts both directions."""
        return self.pcie_bandwidth / 2 if self.pcie_bandwidth else None


def normalised(name: str) -> str:
    """A device name without vendor words, case and punctuation: ``Tesla V100-SXM2-16GB`` ->
    ``v100sxm216gb``, so the names CUDA, ROCm and people use compare equal."""
    words = re.sub(r"\b(nvidia|tesla|amd|instinct|geforce)\b", "", name.lower())
    return re.sub(r"[^a-z0-9]", "", words)


@dataclass(frozen=True)
class DeviceTable:
    """The device rows, looked up by name or resolved from what a run recorded."""

    devices: tuple[Device, ...]
    cpu_per_core: Device  # the nominal CPU row, its rates for one core

    def names(self) -> list[str]:
        return [d.name for d in self.devices]

    def by_name(self, name: str) -> Device | None:
        """The row whose name or an alias matches ``name`` (case and punctuation ignored)."""
        wanted = normalised(name)
        for device in self.devices:
            if wanted in {normalised(n) for n in (device.name, *device.aliases)}:
                return device
        return None

    def resolve(self, properties: Mapping[str, Any]) -> Device | None:
        """The row for one entry of a run's ``devices`` (Kineto's ``deviceProperties``).

        Args:
            properties: ``name``, ``computeMajor``/``computeMinor``, ``numSms``,
                ``totalGlobalMem``, ``warpSize`` as CUDA or ROCm report them.

        Returns:
            The row named so, else the one row whose compute capability, SM count and memory
            size (within :data:`MEMORY_TOLERANCE`) match; None when neither finds exactly one.
        """
        named = self.by_name(str(properties.get("name", "")))
        if named is not None:
            return named
        major, minor = properties.get("computeMajor"), properties.get("computeMinor")
        capability = f"{major}.{minor}" if major is not None and minor is not None else None
        sms, memory = properties.get("numSms"), properties.get("totalGlobalMem")
        warp = properties.get("warpSize")
        matches = [
            d for d in self.devices
            if capability == d.compute_capability and sms == d.sms
            and (warp is None or warp == d.warp_size)
            and (not isinstance(memory, int | float) or _memory_matches(float(memory), d.memory_bytes))
        ]
        return matches[0] if len(matches) == 1 else None

    def cpu(self, cores: int) -> Device:
        """The nominal CPU row scaled to ``cores`` cores (at least one)."""
        scale = max(cores, 1)
        per_core = self.cpu_per_core
        return dataclasses.replace(
            per_core, name=f"{per_core.name}, {scale} cores", sms=scale,
            memory_bandwidth=per_core.memory_bandwidth * scale,
            peaks={p: v * scale for p, v in per_core.peaks.items()},
        )

    def with_row(self, device: Device) -> DeviceTable:
        """This table with ``device`` added, or in place of the row of the same name (a measured
        row replacing a datasheet one)."""
        kept = tuple(d for d in self.devices if normalised(d.name) != normalised(device.name))
        return dataclasses.replace(self, devices=(*kept, device))


def _memory_matches(reported: float, sold: Iterable[float]) -> bool:
    return any(abs(reported - size) <= MEMORY_TOLERANCE * size for size in sold)


def _device(row: Mapping[str, Any]) -> Device:
    giga, tera = 1e9, 1e12
    return Device(
        name=row["name"], vendor=Vendor(row["vendor"]), origin=Origin(row["origin"]),
        source=row["source"], source_url=row.get("source_url", ""), aliases=tuple(row.get("aliases", ())),
        compute_capability=row.get("compute_capability"), sms=int(row["sms"]),
        clock_hz=float(row["clock_mhz"]) * 1e6, warp_size=int(row.get("warp_size", 32)),
        memory_bytes=tuple(float(g) * giga for g in row["memory_gb"]),
        memory_bandwidth=float(row["memory_bandwidth_gbs"]) * giga,
        pcie_bandwidth=_scaled(row.get("pcie_gbs"), giga),
        peer_link_bandwidth=_scaled(row.get("peer_link_gbs"), giga),
        registers_per_sm=int(row["registers_per_sm"]),
        shared_memory_per_sm=int(row["shared_memory_per_sm_kib"]) * 1024,
        threads_per_sm=int(row["threads_per_sm"]),
        peaks={Precision(p): float(v) * tera for p, v in row["peak_tflops"].items() if v is not None},
    )


def _scaled(value: float | None, unit: float) -> float | None:
    return None if value is None else float(value) * unit


def _cpu_per_core(row: Mapping[str, Any]) -> Device:
    return Device(
        name=row["name"], vendor=Vendor.CPU, origin=Origin.NOMINAL, source=row["about"], sms=1,
        clock_hz=float(row["clock_mhz"]) * 1e6, warp_size=1,
        memory_bandwidth=float(row["per_core_memory_bandwidth_gbs"]) * 1e9,
        peaks={Precision(p): float(v) * 1e12 for p, v in row["per_core_tflops"].items()},
    )


def parse_table(text: str) -> DeviceTable:
    """A device table from the text of a ``devices.json``.

    Raises:
        ValueError: the file is of another version, or a row lacks a field.
    """
    data = json.loads(text)
    if data.get("version") != TABLE_VERSION:
        raise ValueError(f"device table version {data.get('version')!r}; this dlprof reads {TABLE_VERSION}")
    try:
        return DeviceTable(tuple(_device(row) for row in data["devices"]), _cpu_per_core(data["cpu"]))
    except (KeyError, TypeError) as error:
        raise ValueError(f"device table: a row lacks or mistypes {error}") from None


@cache
def device_table() -> DeviceTable:
    """The table shipped in the package (read once)."""
    return parse_table(resources.files("dlprof.hardware").joinpath(TABLE_FILE).read_text("utf-8"))
