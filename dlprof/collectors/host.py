"""The host collector: a background thread samples this process's CPU use and memory.

Samples land in the counters table as tracks ``host.cpu_percent`` (of one core, so a process
using two cores reads 200), ``host.rss`` (bytes) and ``host.system_cpu_percent``.

A sample keeps raw readings only (the process's CPU seconds, its resident pages, the system's
busy and total CPU ticks), read from ``/proc`` through descriptors opened once, or from psutil
where there is no ``/proc``; percentages are the differences between neighbouring samples,
computed when the samples are saved. That keeps a 10 ms interval cheap.
"""

from __future__ import annotations

import os
import time

import numpy as np
import psutil
import pyarrow as pa

from dlprof.collectors.base import Collector, CollectorContext
from dlprof.support.sampler import TimedSamples

TRACKS = (("host.cpu_percent", "%"), ("host.rss", "bytes"), ("host.system_cpu_percent", "%"))
# Raw readings per sample: process CPU (s), RSS (bytes), system busy and total CPU time.
_READINGS = 4


class ProcReader:
    """Readings from /proc through descriptors opened once."""

    def __init__(self) -> None:
        """Raises:
        OSError: /proc cannot be read here.
        """
        self._statm = os.open("/proc/self/statm", os.O_RDONLY)
        self._stat = os.open("/proc/stat", os.O_RDONLY)
        self._page = os.sysconf("SC_PAGE_SIZE")

    def read(self) -> tuple[float, float, float, float]:
        """(process CPU s, RSS bytes, system busy ticks, system total ticks)."""
        cpu_s = time.process_time()  # nanosecond clock; os.times() counts 10 ms ticks
        rss_pages = int(os.pread(self._statm, 64, 0).split()[1])
        # "cpu  user nice system idle iowait irq softirq steal ...": idle and iowait are not busy.
        ticks = [int(t) for t in os.pread(self._stat, 256, 0).split(b"\n", 1)[0].split()[1:9]]
        total = sum(ticks)
        return cpu_s, float(rss_pages * self._page), float(total - ticks[3] - ticks[4]), float(total)

    def close(self) -> None:
        os.close(self._statm)
        os.close(self._stat)


class PsutilReader:
    """The same readings through psutil, for systems without /proc."""

    def __init__(self) -> None:
        self._process = psutil.Process(os.getpid())

    def read(self) -> tuple[float, float, float, float]:
        cpu = self._process.cpu_times()
        system = psutil.cpu_times()
        total = sum(system)
        return cpu.user + cpu.system, float(self._process.memory_info().rss), total - system.idle, total

    def close(self) -> None:
        pass


class HostCollector(Collector):
    name = "host"
    description = "process CPU %, resident memory, system CPU %, sampled"
    requires = ("psutil", "")
    default = True

    def start(self, context: CollectorContext) -> None:
        self._context = context
        try:
            self._reader: ProcReader | PsutilReader = ProcReader()
        except OSError:
            self._reader = PsutilReader()
        # The last sample already saved, (time, readings): the next one's rates start there.
        self._previous: tuple[int, np.ndarray] | None = None
        self._samples = TimedSamples(self._reader.read, context.config.host_interval_s, "dlprof-host",
                                     lambda failure: self.hook_failed("its sampler thread", failure))
        self._samples.start()

    def stop(self) -> None:
        self._samples.stop()
        self.save()
        self._reader.close()

    def save(self) -> None:
        times, values = self._samples.drain()
        ts = np.array(times, dtype=np.int64)
        readings = np.array(values, dtype=np.float64).reshape(-1, _READINGS)
        if self._previous is not None:
            ts = np.concatenate([[self._previous[0]], ts])
            readings = np.vstack([self._previous[1][None, :], readings])
        if len(ts) == 0:
            return
        self._previous = (int(ts[-1]), readings[-1].copy())
        if len(ts) < 2:
            return
        step = np.diff(readings, axis=0)
        wall_s = np.maximum(np.diff(ts), 1) / 1e9
        cpu_percent = 100.0 * step[:, 0] / wall_s
        busy = np.divide(step[:, 2], step[:, 3], out=np.zeros(len(step)), where=step[:, 3] > 0)
        columns = (cpu_percent, readings[1:, 1], 100.0 * busy)
        n = len(step)
        ts = ts[1:]
        batch = pa.table(
            {
                "pid": pa.array(np.full(n * len(TRACKS), os.getpid(), dtype=np.int64)),
                "device": pa.array(["cpu"] * (n * len(TRACKS))).dictionary_encode(),
                "track": pa.array([t for t, _ in TRACKS for _ in range(n)]).dictionary_encode(),
                "ts_ns": pa.array(np.tile(ts, len(TRACKS))),
                "value": pa.array(np.concatenate(columns)),
                "unit": pa.array([u for _, u in TRACKS for _ in range(n)]).dictionary_encode(),
            }
        )
        self._context.sink.append_counters(batch, "host")


COLLECTOR = HostCollector
