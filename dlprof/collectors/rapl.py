"""The rapl collector: CPU package energy (RAPL), sampled, for the joules of each step.

A background thread reads each package's energy counter (:mod:`dlprof.support.rapl`) every
``host_interval_s`` into the counters table: track ``rapl.energy_pkg``, unit ``J``, the joules
counted since profiling started, device ``cpu`` (one package) or ``cpu:<n>`` (package n of
several). ``dlprof steps`` turns them into joules per step, taking the power between two samples
as constant: the energy counted over the time (:mod:`dlprof.analysis.energy`).
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa

from dlprof.collectors.base import Collector, CollectorContext
from dlprof.support.rapl import PackageEnergy, RaplUnavailable, energy_event
from dlprof.support.sampler import TimedSamples

TRACK = "rapl.energy_pkg"


def package_device(index: int, packages: int) -> str:
    """The counters table's device for package ``index`` of ``packages``."""
    return "cpu" if packages == 1 else f"cpu:{index}"


def energy_table(times: list[int], joules: list[tuple[float, ...]], origin: tuple[float, ...], pid: int) -> pa.Table:
    """Samples as counters-table rows: per sample and package, the joules counted since ``origin``."""
    packages = len(origin)
    counted = np.asarray(joules, dtype=np.float64).reshape(-1, packages) - np.asarray(origin, dtype=np.float64)
    n = len(times) * packages
    return pa.table({
        "pid": pa.array(np.full(n, pid, dtype=np.int64)),
        "device": pa.array([package_device(p, packages) for _ in times for p in range(packages)]).dictionary_encode(),
        "track": pa.array([TRACK] * n).dictionary_encode(),
        "ts_ns": pa.array(np.repeat(np.asarray(times, dtype=np.int64), packages)),
        "value": pa.array(counted.reshape(-1)),
        "unit": pa.array(["J"] * n).dictionary_encode(),
    })


class RaplCollector(Collector):
    name = "rapl"
    description = "CPU package energy (RAPL, through perf_event's power PMU), sampled"

    @classmethod
    def available(cls) -> tuple[bool, str]:
        try:
            PackageEnergy(energy_event()).close()
        except RaplUnavailable as error:
            return False, str(error)
        return True, ""

    def start(self, context: CollectorContext) -> None:
        self._context = context
        self._reader = PackageEnergy(energy_event())
        self._origin = self._reader.read()
        self._samples = TimedSamples(self._reader.read, context.config.host_interval_s, "dlprof-rapl",
                                     lambda failure: self.hook_failed("its sampler thread", failure))
        self._samples.start()

    def stop(self) -> None:
        self._samples.stop()
        self.save()
        self._reader.close()

    def save(self) -> None:
        times, joules = self._samples.drain()
        if times:
            self._context.sink.append_counters(energy_table(times, joules, self._origin, os.getpid()), "rapl")


COLLECTOR = RaplCollector
