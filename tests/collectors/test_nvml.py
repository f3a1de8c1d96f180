"""The NVML sampler: the pure readings-to-table translation, the unavailable path, and (gpu) a real run."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import dlprof
from dlprof.collectors.nvml import TRACKS, NvmlCollector, Readings, init_error, readings_table
from dlprof.collectors.registry import collector_class


def test_readings_become_counters_rows_per_device_and_track() -> None:
    full = Readings(gpu_util=87.0, mem_util=40.0, memory_used=2.5e9, power=212.5, sm_clock=1980.0,
                    temperature=66.0)
    partial = Readings(gpu_util=3.0, mem_util=1.0, memory_used=1e6, power=None, sm_clock=None,
                       temperature=40.0)
    table = readings_table([(1_000, 0, full), (1_000, 1, partial), (2_000, 0, full)], pid=42)
    assert table.column_names == ["pid", "device", "track", "ts_ns", "value", "unit"]
    assert table.num_rows == 6 + 4 + 6
    rows = table.to_pylist()
    assert {r["pid"] for r in rows} == {42}
    first = {r["track"]: (r["value"], r["unit"]) for r in rows if r["device"] == "cuda:0" and r["ts_ns"] == 1_000}
    assert first == {
        "nvml.gpu_util": (87.0, "%"),
        "nvml.mem_util": (40.0, "%"),
        "nvml.memory_used": (2.5e9, "bytes"),
        "nvml.power": (212.5, "W"),
        "nvml.sm_clock": (1980.0, "MHz"),
        "nvml.temperature": (66.0, "C"),
    }
    second = {r["track"] for r in rows if r["device"] == "cuda:1"}
    assert second == {"nvml.gpu_util", "nvml.mem_util", "nvml.memory_used", "nvml.temperature"}
    assert {t for t, _ in TRACKS} == set(first)


def test_no_samples_is_an_empty_table_with_the_schema() -> None:
    table = readings_table([], pid=1)
    assert table.num_rows == 0
    assert table.column_names == ["pid", "device", "track", "ts_ns", "value", "unit"]


def test_registered_and_init_errors_read_as_one_line() -> None:
    assert collector_class("nvml") is NvmlCollector

    class NVMLError_LibraryNotFound(Exception):
        pass

    assert init_error(NVMLError_LibraryNotFound("x")) == "NVML library not found (no NVIDIA driver)"
    assert init_error(RuntimeError("boom")) == "nvmlInit failed: RuntimeError: boom"


def test_available_gives_the_real_reason() -> None:
    ok, reason = NvmlCollector.available()
    if importlib.util.find_spec("pynvml") is None:
        assert not ok and "not installed" in reason
        return
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        assert not ok
        assert reason == init_error(error)
        return
    pynvml.nvmlShutdown()
    assert ok and reason == ""


@pytest.mark.gpu
def test_a_run_samples_every_gpu(tmp_path: Path) -> None:
    ok, reason = NvmlCollector.available()
    if not ok:
        pytest.skip(f"NVML unavailable: {reason}")
    import time

    from dlprof.config import ProfileConfig
    from dlprof.recording.session import Session

    with Session(ProfileConfig(out=tmp_path / "run", collectors=("nvml",), host_interval_s=0.05)):
        time.sleep(0.3)
    counters = dlprof.load(tmp_path / "run").counters
    nvml = counters[counters["track"].astype(str).str.startswith("nvml.")]
    assert set(nvml["device"].astype(str)) >= {"cuda:0"}
    assert "nvml.memory_used" in set(nvml["track"].astype(str))
    assert (nvml[nvml["track"].astype(str) == "nvml.memory_used"]["value"] > 0).all()
