"""CPU package energy from RAPL, through perf_event's ``power`` PMU (``perf stat -e power/energy-pkg/``).

    event = energy_event()            # RaplUnavailable, with the reason, where there is none
    reader = PackageEnergy(event)     # one system-wide counter per CPU package
    reader.read()                     # joules per package, counted since the counters opened

The kernel describes the PMU in sysfs: its perf ``type``, the event's terms (``event=0x02``)
placed into ``config`` by the ``format/`` files, the joules one count is worth (``.scale``), and
``cpumask``, one CPU per package, where the counter is opened for all processes (``pid=-1``).
That needs ``perf_event_paranoid`` at 0 or below, or CAP_PERFMON; the kernel keeps the count
64-bit, so the 32-bit register's wrap is not ours to handle.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path

from dlprof.support.perf_event import EventSpec, PerfEventError, open_event, paranoid_level, read_event

POWER_PMU = Path("/sys/bus/event_source/devices/power")
PACKAGE_EVENT = "energy-pkg"


class RaplUnavailable(Exception):
    """No RAPL package energy here; the message says why, in one line."""


@dataclass(frozen=True)
class EnergyEvent:
    """The package-energy event as this kernel describes it."""

    spec: EventSpec
    joules_per_count: float
    cpus: tuple[int, ...]  # one CPU of each package


def _cpu_list(text: str) -> tuple[int, ...]:
    """A sysfs CPU list ("0", "0,18", "0-3,8") as CPU numbers."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.extend(range(int(low), int(high or low) + 1))
    return tuple(cpus)


def _config(terms: str, formats: Path) -> int:
    """An event's terms ("event=0x02,umask=0x1") placed into ``config`` by the PMU's format files."""
    config = 0
    for term in terms.strip().split(","):
        name, _, value = term.partition("=")
        field, _, bits = (formats / name.strip()).read_text().strip().partition(":")
        if field != "config":
            raise RaplUnavailable(f"power/{PACKAGE_EVENT}/: term {name} goes in {field}, which dlprof does not set")
        low = int(bits.split("-")[0])
        config |= int(value or "1", 0) << low
    return config


def energy_event(pmu: Path = POWER_PMU) -> EnergyEvent:
    """The package-energy event of the ``power`` PMU under ``pmu``.

    Raises:
        RaplUnavailable: no power PMU, no package event, or a description dlprof cannot read.
    """
    event = pmu / "events" / PACKAGE_EVENT
    if not event.is_file():
        where = "no power PMU" if not pmu.is_dir() else f"the power PMU has no {PACKAGE_EVENT} event"
        raise RaplUnavailable(f"RAPL: {where} ({pmu}; a virtual machine or a CPU without RAPL)")
    try:
        spec = EventSpec(int((pmu / "type").read_text()), _config(event.read_text(), pmu / "format"),
                         "CPU package energy (RAPL)", "J")
        scale_file = pmu / "events" / f"{PACKAGE_EVENT}.scale"
        joules = float(scale_file.read_text()) if scale_file.is_file() else 1.0
        cpus = _cpu_list((pmu / "cpumask").read_text())
    except (OSError, ValueError) as error:
        raise RaplUnavailable(f"RAPL: cannot read the power PMU's description in {pmu}: {error}") from None
    if not cpus:
        raise RaplUnavailable(f"RAPL: the power PMU names no CPU in {pmu / 'cpumask'}")
    return EnergyEvent(spec, joules, cpus)


class PackageEnergy:
    """One open package-energy counter per CPU package."""

    def __init__(self, event: EnergyEvent) -> None:
        """Raises:
        RaplUnavailable: the kernel refused to open a counter (the reason names the setting).
        """
        self._event = event
        self._fds: list[int] = []
        try:
            for cpu in event.cpus:
                self._fds.append(open_event(event.spec, pid=-1, cpu=cpu))
        except PerfEventError as error:
            self.close()
            hint = (f" (perf_event_paranoid is {paranoid_level()}: system-wide counters need 0 or "
                    "CAP_PERFMON)") if error.errno in (errno.EACCES, errno.EPERM) else ""
            raise RaplUnavailable(f"RAPL: perf_event_open refused the package counter: {error}{hint}") from None

    @property
    def packages(self) -> int:
        return len(self._fds)

    def read(self) -> tuple[float, ...]:
        """Joules per package, counted since the counters opened."""
        return tuple(read_event(fd)[0] * self._event.joules_per_count for fd in self._fds)

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()
