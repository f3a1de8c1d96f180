"""Measured device rows (``dlprof calibrate``): what this machine reached, and how efficiently.

    stored = read_calibrations(calibration_path())     # () when nothing was measured yet
    table = table_with(device_table(), stored)          # measured rows in the datasheets' place
    table.by_name("cpu-myhost").origin                  # Origin.MEASURED

A :class:`Calibration` holds the ceilings one ``dlprof calibrate`` measured (a GEMM's best
FLOP/s per number format, a triad's bytes/s) and, per op class, math mode and decade of FLOPs,
the efficiency (roof time / measured time) that work of that kind and size reached, with its
spread. Its figures are kept in base units (FLOP/s, bytes/s) exactly as measured; the device row
is built from them when the table is read, so a measured GPU row keeps its datasheet row's
other fields (SMs, clock, links) and a measured CPU row is a row of its own.

The file lives at ``$DLPROF_CALIBRATION`` when set, else ``$XDG_CONFIG_HOME/dlprof/calibration.json``
(``~/.config/dlprof/calibration.json`` without it); it holds one calibration per device name, a
new one replacing the old. This module only reads and encodes; writing goes through
:mod:`dlprof.store.safe_files` in the command.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from dlprof.hardware.devices import Device, DeviceTable, Origin, Precision, Vendor, normalised

CALIBRATION_VARIABLE = "DLPROF_CALIBRATION"
CALIBRATION_FILE = "calibration.json"
CALIBRATION_VERSION = 1


class OpClass(StrEnum):
    """The kinds of work efficiencies are kept for."""

    GEMM = "gemm"  # matrix products
    CONV = "conv"  # convolutions
    ELEMENTWISE = "elementwise"  # everything else: memory-bound streams


@dataclass(frozen=True)
class Measurement:
    """One timed call of a calibration kernel."""

    op_class: OpClass
    precision: Precision
    tensor_core: bool  # whether matrix units ran it (cuBLAS fp16/bf16 on a GPU)
    flops: float
    bytes: float  # compulsory traffic: each operand read once, the result written once
    seconds: float


@dataclass(frozen=True)
class EfficiencyBucket:
    """The efficiencies measured for one op class, math mode and decade of FLOPs."""

    op_class: OpClass
    mode: str  # a math mode's label (fp32, bf16 tensor core...)
    decade: int  # FLOPs of the work in [10**decade, 10**(decade + 1))
    median: float  # roof time / measured time
    low: float  # the lowest and highest sample: the spread
    high: float
    samples: int


@dataclass(frozen=True)
class Calibration:
    """What ``dlprof calibrate`` measured on one device."""

    name: str  # the row's name (``--device-name``)
    vendor: Vendor
    hostname: str
    cpu_model: str
    cores: int  # the threads the measurement ran on (CPU), or the device's SMs (GPU)
    based_on: str | None  # the datasheet row whose other fields a measured GPU row keeps
    measured_at_ns: int  # epoch nanoseconds when the measurement ended
    seconds: float  # how long it took
    peaks: Mapping[Precision, float]  # best GEMM FLOP/s per number format
    memory_bandwidth: float  # best triad bytes/s
    efficiencies: tuple[EfficiencyBucket, ...] = ()

    def device(self, table: DeviceTable) -> Device:
        """The measured row, built over the datasheet row it is based on where there is one."""
        source = (f"dlprof calibrate on {self.hostname or 'an unnamed host'} ({self.cpu_model or 'unknown CPU'}, "
                  f"{self.cores} {'threads' if self.vendor is Vendor.CPU else 'SMs'}): "
                  f"{', '.join(str(p) for p in self.peaks)} GEMM and triad bandwidth measured")
        base = table.by_name(self.based_on) if self.based_on else None
        if base is not None:
            return dataclasses.replace(base, name=self.name, origin=Origin.MEASURED, source=source, source_url="",
                                       aliases=base.aliases if normalised(self.name) == normalised(base.name) else (),
                                       peaks={**base.peaks, **self.peaks}, memory_bandwidth=self.memory_bandwidth)
        return Device(name=self.name, vendor=self.vendor, origin=Origin.MEASURED, source=source, sms=self.cores,
                      clock_hz=table.cpu_per_core.clock_hz if self.vendor is Vendor.CPU else 0.0,
                      warp_size=1 if self.vendor is Vendor.CPU else 32, memory_bandwidth=self.memory_bandwidth,
                      peaks=dict(self.peaks))


def flops_decade(flops: float) -> int:
    """The decade of FLOPs a piece of work falls in (``2.1e9`` -> 9)."""
    return math.floor(math.log10(flops)) if flops > 0 else 0


def calibration_path(environ: Mapping[str, str] | None = None) -> Path:
    """Where calibrations are kept: ``$DLPROF_CALIBRATION``, else the user's config directory."""
    env = os.environ if environ is None else environ
    if env.get(CALIBRATION_VARIABLE):
        return Path(env[CALIBRATION_VARIABLE])
    config = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else Path.home() / ".config"
    return config / "dlprof" / CALIBRATION_FILE


def _encoded(calibration: Calibration) -> dict[str, Any]:
    row = dataclasses.asdict(calibration)
    row["vendor"] = str(calibration.vendor)
    row["peaks"] = {str(p): v for p, v in calibration.peaks.items()}
    row["efficiencies"] = [{**dataclasses.asdict(b), "op_class": str(b.op_class)} for b in calibration.efficiencies]
    return row


def _decoded(row: Mapping[str, Any]) -> Calibration:
    return Calibration(
        name=str(row["name"]), vendor=Vendor(row["vendor"]), hostname=str(row["hostname"]),
        cpu_model=str(row["cpu_model"]), cores=int(row["cores"]), based_on=row["based_on"],
        measured_at_ns=int(row["measured_at_ns"]), seconds=float(row["seconds"]),
        peaks={Precision(p): float(v) for p, v in row["peaks"].items()},
        memory_bandwidth=float(row["memory_bandwidth"]),
        efficiencies=tuple(EfficiencyBucket(
            op_class=OpClass(b["op_class"]), mode=str(b["mode"]), decade=int(b["decade"]), median=float(b["median"]),
            low=float(b["low"]), high=float(b["high"]), samples=int(b["samples"])) for b in row["efficiencies"]),
    )


def calibrations_text(calibrations: Iterable[Calibration]) -> str:
    """The file's text for ``calibrations`` (floats as Python writes them: read back exactly)."""
    return json.dumps({"version": CALIBRATION_VERSION, "calibrations": [_encoded(c) for c in calibrations]},
                      indent=1) + "\n"


def parse_calibrations(text: str, origin: str = "calibration file") -> tuple[Calibration, ...]:
    """The calibrations in a file's text.

    Raises:
        ValueError: not JSON, another version, or a field missing or mistyped (``origin`` names
            the file in the message).
    """
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("version") != CALIBRATION_VERSION:
            found = data.get("version") if isinstance(data, dict) else None
            raise ValueError(f"version {found!r}; this dlprof reads {CALIBRATION_VERSION}")
        return tuple(_decoded(row) for row in data["calibrations"])
    except (KeyError, TypeError, AttributeError, ValueError) as error:
        raise ValueError(f"{origin}: not a dlprof calibration ({error}); run dlprof calibrate again") from None


def read_calibrations(path: Path) -> tuple[Calibration, ...]:
    """The calibrations stored at ``path``; none when the file does not exist.

    Raises:
        ValueError: the file exists but is not a calibration, or cannot be read.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return ()
    except OSError as error:
        raise ValueError(f"{path}: cannot read the calibration file ({error.strerror})") from None
    return parse_calibrations(text, str(path))


def replaced(stored: Iterable[Calibration], new: Calibration) -> tuple[Calibration, ...]:
    """``stored`` with ``new`` in place of the calibration of the same name (or added)."""
    return (*(c for c in stored if normalised(c.name) != normalised(new.name)), new)


def table_with(table: DeviceTable, calibrations: Iterable[Calibration]) -> DeviceTable:
    """``table`` with each calibration's measured row added, or in place of its datasheet row."""
    for calibration in calibrations:
        table = table.with_row(calibration.device(table))
    return table


def host_cpu(calibrations: Iterable[Calibration], hostname: str) -> Calibration | None:
    """The newest CPU calibration made on ``hostname``: the row a CPU run on that host uses."""
    mine = [c for c in calibrations if c.vendor is Vendor.CPU and hostname and c.hostname == hostname]
    return max(mine, key=lambda c: c.measured_at_ns, default=None)
