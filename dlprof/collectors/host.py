"""The host collector: a background thread samples this process's CPU use and memory (psutil).

Samples land in the counters table as tracks ``host.cpu_percent`` (of one core, so a process
using two cores reads 200), ``host.rss`` (bytes) and ``host.system_cpu_percent``.
"""

from __future__ import annotations

import os
import threading
import time
from array import array

import numpy as np
import psutil
import pyarrow as pa

from dlprof.collectors.base import Collector, CollectorContext
from dlprof.collectors.sampler import PeriodicSampler

TRACKS = (("host.cpu_percent", "%"), ("host.rss", "bytes"), ("host.system_cpu_percent", "%"))


class HostCollector(Collector):
    name = "host"
    description = "psutil sampler: process CPU %, resident memory, system CPU %"
    requires = ("psutil", "")


    def start(self, context: CollectorContext) -> None:
        self._context = context
        self._process = psutil.Process(os.getpid())
        self._process.cpu_percent(None)
        psutil.cpu_percent(None)
        self._times = array("q")
        self._values = [array("d") for _ in TRACKS]
        self._lock = threading.Lock()
        self._sampler = PeriodicSampler(self._sample, context.config.host_interval_s, "dlprof-host")
        self._sampler.start()

    def _sample(self) -> None:
        now = time.time_ns()
        readings = (
            self._process.cpu_percent(None),
            float(self._process.memory_info().rss),
            psutil.cpu_percent(None),
        )
        with self._lock:
            self._times.append(now)
            for column, value in zip(self._values, readings, strict=True):
                column.append(value)

    def stop(self) -> None:
        self._sampler.stop()
        self._sample()
        self.save()

    def save(self) -> None:
        with self._lock:
            times, values = self._times, self._values
            self._times = array("q")
            self._values = [array("d") for _ in TRACKS]
        n = len(times)
        if n == 0:
            return
        ts = np.frombuffer(times, dtype=np.int64)
        batch = pa.table(
            {
                "pid": pa.array(np.full(n * len(TRACKS), os.getpid(), dtype=np.int64)),
                "device": pa.array(["cpu"] * (n * len(TRACKS))).dictionary_encode(),
                "track": pa.array([t for t, _ in TRACKS for _ in range(n)]).dictionary_encode(),
                "ts_ns": pa.array(np.tile(ts, len(TRACKS))),
                "value": pa.array(np.concatenate([np.frombuffer(v, dtype=np.float64) for v in values])),
                "unit": pa.array([u for _, u in TRACKS for _ in range(n)]).dictionary_encode(),
            }
        )
        self._context.sink.append_counters(batch, "host")


COLLECTOR = HostCollector
