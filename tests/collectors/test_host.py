"""The host sampler: real psutil readings into the counters table."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest

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


def test_a_reading_that_fails_on_the_sampler_thread_stops_the_collector_keeping_what_it_took(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The program points the descriptor the sampler reads /proc/self/statm through at
    /dev/null. Before, the sampler thread died with a traceback on the program's stderr
    ("Exception in thread dlprof-host") and the run read as complete."""
    ran = []
    with dlprof.profile(out=tmp_path / "run", collectors=("host",)):
        time.sleep(0.35)  # samples at start and each 100 ms
        null = os.open(os.devnull, os.O_RDONLY)
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/self/fd/{name}").endswith("/statm"):  # /proc/<pid>/statm
                    os.dup2(null, int(name))
        os.close(null)
        time.sleep(0.3)
        ran.append("the program's last line")
    assert ran == ["the program's last line"]
    run = dlprof.load(tmp_path / "run")
    reason = ("host collector: recording failed (IndexError: list index out of range) in its sampler thread "
              "after step 0: its recording stopped")
    assert run.manifest.degraded == [reason]
    assert capsys.readouterr().err == f"dlprof: {reason}; the program goes on\n"
    rss = run.counters[run.counters["track"] == "host.rss"]
    assert len(rss) >= 3, "the samples taken before are kept"
