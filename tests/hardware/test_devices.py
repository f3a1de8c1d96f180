"""The device table: every row complete and cited, and runs' devices resolved to rows."""

from __future__ import annotations

import pytest

from dlprof.hardware.devices import Origin, Precision, Vendor, device_table, normalised
from tests.references import recorded_devices

REQUIRED = ["A100 SXM4 40GB", "A100 SXM4 80GB", "H100 SXM5 80GB", "H100 PCIe 80GB", "H200 SXM 141GB",
            "V100 SXM2", "L4", "T4", "MI250 (one GCD)", "MI300X"]


def test_every_required_row_is_present_complete_and_cited() -> None:
    table = device_table()
    assert set(REQUIRED) <= set(table.names())
    for device in table.devices:
        assert device.origin is Origin.DATASHEET and device.source and device.source_url.startswith("https://")
        assert device.sms > 0 and device.clock_hz > 0 and device.memory_bandwidth > 0 and device.memory_bytes
        assert device.registers_per_sm and device.shared_memory_per_sm and device.threads_per_sm
        assert device.peak_flops(Precision.FP32), device.name
        # Matrix peaks are never below the vector fp32 peak: a sparse figure left unhalved, or
        # a unit slip, would show here as well as a missing row.
        for precision in (Precision.TF32, Precision.FP16, Precision.BF16):
            peak = device.peak_flops(precision)
            assert peak is None or peak >= device.peaks[Precision.FP32], (device.name, precision)


def test_the_shared_a100_board_resolves_by_capability_sms_and_memory() -> None:
    (first, *_) = recorded_devices("trace_diff/control")
    assert first["name"] == "NVIDIA A100-PG509-200"
    table = device_table()
    assert table.by_name(str(first["name"])) is None  # not by its name: by what it reports
    resolved = table.resolve(first)
    assert resolved is not None and resolved.name == "A100 SXM4 40GB"


def test_recorded_v100_and_mi250_resolve() -> None:
    table = device_table()
    v100 = table.resolve(recorded_devices("trace_diff/test")[0])
    assert v100 is not None and v100.name == "V100 SXM2"
    mi250 = table.resolve(recorded_devices("amd_trace")[0])  # reported as "AMD Radeon Graphics"
    assert mi250 is not None and mi250.vendor is Vendor.AMD and mi250.sms == 104


def test_memory_size_tells_the_a100s_apart() -> None:
    table = device_table()
    reported = {"name": "some board", "computeMajor": 8, "computeMinor": 0, "numSms": 108, "warpSize": 32}
    big = table.resolve({**reported, "totalGlobalMem": 85_100_000_000})
    assert big is not None and big.name == "A100 SXM4 80GB"
    assert table.resolve({**reported, "totalGlobalMem": 20_000_000_000}) is None  # no such A100
    assert table.resolve({**reported, "numSms": 7}) is None


def test_names_and_aliases_compare_without_case_or_vendor_words() -> None:
    table = device_table()
    assert normalised("Tesla V100-SXM2-16GB") == "v100sxm216gb"
    found = table.by_name("tesla v100 sxm2 32gb")
    assert found is not None and found.name == "V100 SXM2"
    assert table.by_name("no such gpu") is None


def test_ridge_point_and_copy_bandwidth_follow_the_row() -> None:
    a100 = device_table().by_name("A100 SXM4 40GB")
    assert a100 is not None
    assert a100.ridge_point(Precision.FP32) == pytest.approx(19.5e12 / 1555e9)
    assert a100.copy_bandwidth == pytest.approx(32e9)


def test_cpu_row_is_nominal_and_scales_with_cores() -> None:
    table = device_table()
    one, eight = table.cpu(1), table.cpu(8)
    assert eight.origin is Origin.NOMINAL and eight.vendor is Vendor.CPU
    assert eight.peaks[Precision.FP32] == pytest.approx(8 * one.peaks[Precision.FP32])
    assert eight.memory_bandwidth == pytest.approx(8 * one.memory_bandwidth)


def test_a_measured_row_replaces_the_datasheet_row_of_its_name() -> None:
    import dataclasses

    table = device_table()
    datasheet = table.by_name("L4")
    assert datasheet is not None
    measured = dataclasses.replace(datasheet, origin=Origin.MEASURED, memory_bandwidth=250e9)
    updated = table.with_row(measured)
    assert updated.by_name("L4") == measured and len(updated.devices) == len(table.devices)
    assert table.by_name("L4") == datasheet  # the shipped table is left as it was
