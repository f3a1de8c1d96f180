"""The host sampler: real psutil readings into the counters table."""

from __future__ import annotations

import os
import time
from pathlib import Path

import dlprof


def test_host_samples_cpu_and_memory(tmp_path: Path) -> None:
    with dlprof.profile(out=tmp_path / "run", collectors=("host",)):
        deadline = time.perf_counter() + 0.5
        ballast = []
        while time.perf_counter() < deadline:
            ballast.append(bytearray(1 << 16))
    counters = dlprof.load(tmp_path / "run").counters
    rss = counters[counters["track"] == "host.rss"]
    cpu = counters[counters["track"] == "host.cpu_percent"]
    assert len(rss) >= 3
    assert (rss["value"] > 10 << 20).all() and set(rss["unit"]) == {"bytes"}
    assert cpu["value"].max() > 20, "a busy loop shows as CPU use"
    assert rss["ts_ns"].is_monotonic_increasing
    system = counters[counters["track"] == "host.system_cpu_percent"]["value"]
    assert len(system) == len(rss) and system.between(0, 100).all()
    # The loop kept one core busy: the process's CPU over the run is about one core's worth.
    assert 30 < cpu["value"].mean() < 100 * (os.cpu_count() or 1) + 5
