"""Tuning candidates: rankings on real A100 kernel traces, checked against scores recomputed here
from the raw JSON, and the counter-based ranking on a run whose counters the test sets."""

from __future__ import annotations

from pathlib import Path

import pytest

import dlprof
from dlprof.analysis.tuning import (
    CANDIDATE_COLUMNS,
    RULES,
    Basis,
    KernelSummary,
    RegisterPressure,
    TuningContext,
    kernel_summaries,
    tuning_candidates,
)
from dlprof.store.reader import Run
from tests.builders import (
    A100,
    COUNTED,
    Kernel,
    counters,
    cupti_profiler_trace,
    import_trace_run,
    write_counter_run,
)
from tests.conftest import KINETO_TRACES
from tests.references import expected_scores


def kineto_trace(scenario: str) -> Path:
    (found,) = (KINETO_TRACES / scenario).glob("*.json.gz")
    return found


@pytest.fixture(scope="module")
def simple_add(tmp_path_factory: pytest.TempPathFactory) -> Run:
    path = kineto_trace("critical_path/simple_add")
    return dlprof.load(import_trace_run(tmp_path_factory.mktemp("runs") / "add", path))


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Run:
    path = kineto_trace("triton_example")
    return dlprof.load(import_trace_run(tmp_path_factory.mktemp("runs") / "triton", path))


def test_simple_add_is_ranked_by_time_times_launch_signals(simple_add: Run) -> None:
    found = tuning_candidates(simple_add)
    assert found.basis is Basis.LAUNCH
    table = found.table
    assert list(table.columns) == CANDIDATE_COLUMNS
    want = expected_scores(kineto_trace("critical_path/simple_add"))
    assert set(table["name"]) == set(want)
    for name, score in zip(table["name"], table["score"], strict=True):
        assert score == pytest.approx(want[name], rel=1e-6), name
    assert list(table["name"]) == sorted(want, key=lambda n: (-want[n], n))
    assert table["rank"].tolist() == list(range(1, len(table) + 1))
    assert all(len(r) == len(n) > 0 for r, n in zip(table["reasons"], table["rules"], strict=True))


def test_simple_add_reasons_in_words(simple_add: Run) -> None:
    table = tuning_candidates(simple_add).table.set_index("name")
    (xmma,) = [name for name in table.index if str(name).startswith("sm80_xmma_fprop_implicit_gemm")]
    first = table.loc[xmma]
    assert first["rules"] == ["low-occupancy", "register-pressure"]
    # Kineto recorded 0 (no estimate): the occupancy is the launch configuration's, computed here.
    assert first["reasons"][0].startswith("theoretical occupancy 12% (< 50%, limited by registers)")
    assert "252 registers per thread (> 64)" in first["reasons"][1]
    assert "cap occupancy at 12%" in first["reasons"][1]  # 8 warps of 64 fit in 65536 registers
    offsets = table.loc[
        "void cask_cudnn::computeOffsetsKernel<false, false>(cask_cudnn::ComputeOffsetsParams)"
    ]
    assert "grid of 12 blocks on 108 SMs: 96 SMs idle" in offsets["reasons"]
    # 4 us per call; its launch calls took 48 us and, the very first, 4.2 s (loading the module):
    # the shortest is the yardstick.
    assert any("less than the 48.0 us its launch call takes" in r for r in offsets["reasons"])


def test_triton_kernel_one_block_and_short(triton: Run) -> None:
    table = tuning_candidates(triton).table
    assert table["name"].tolist() == ["triton_poi_fused_add_cos_sin_0"]
    row = table.iloc[0]
    # Kineto made no occupancy estimate; 16 registers and small blocks let the SM fill: what
    # holds the kernel is its one block, not its launch configuration's occupancy.
    assert row["rules"] == ["small-grid", "short-kernel"]
    assert "grid of 1 block on 108 SMs: 107 SMs idle" in row["reasons"]
    assert "1.8 us per call, less than the 47.8 us its launch call takes" in row["reasons"][1]
    assert row["score"] == pytest.approx(expected_scores(kineto_trace("triton_example"))[row["name"]])


@pytest.fixture(scope="module")
def counted(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return dlprof.load(write_counter_run(tmp_path_factory.mktemp("runs") / "counted", COUNTED))


def test_counters_rank_by_metric_per_instruction_times_time(counted: Run) -> None:
    found = tuning_candidates(counted)
    assert found.basis is Basis.COUNTERS
    table = found.table.set_index("name")
    # gemm: warps/inst = 112000 / 10000, gld/inst = 1000 / 10000, over 0.4 ms.
    assert table.loc["gemm", "score"] == pytest.approx((112_000 / 10_000 + 1000 / 10_000) * 0.4)
    # relu: 12800 / 400 = 32 warps per instruction and 0.5 loads, over 0.02 ms.
    assert table.loc["relu", "score"] == pytest.approx((32 + 0.5) * 0.02)
    assert table.loc["gemm", "rules"] == ["warps-per-instruction", "global-loads-per-instruction"]
    assert table.loc["gemm", "reasons"][0].startswith("11.2 warps/inst:")
    # "copy" has no counters: its launch signals are listed but do not count in this basis.
    assert table.loc["copy", "score"] == 0.0
    assert table.loc["copy", "rules"] == ["low-occupancy", "small-grid"]
    assert list(table.index) == ["gemm", "relu", "copy"]


def test_counters_of_profiler_ranges_join_kernels_of_the_same_name(tmp_path: Path) -> None:
    kernels = [
        Kernel("gemm", 100),
        Kernel("gemm", 999, counters(1000, 500, 4000, 250), kind="cuda_profiler_range"),
    ]
    run = dlprof.load(write_counter_run(tmp_path / "ranges", kernels))
    (summary,) = kernel_summaries(run)
    assert summary.per_inst == {"warps_per_inst": 4.0, "gld_per_inst": 0.25}
    assert summary.self_ns == 100_000  # the kernel's time, not the range's placeholder
    assert tuning_candidates(run).table.loc[0, "score"] == pytest.approx(4.25 * 0.1)


def test_rules_describe_themselves() -> None:
    names = [rule.name for rule in RULES]
    assert len(set(names)) == len(names)
    for rule in RULES:
        assert rule.description.endswith(".") and isinstance(rule.basis, Basis)
    assert {rule.basis for rule in RULES} == set(Basis)


def test_register_pressure_without_device_properties() -> None:
    kernel = KernelSummary("k", calls=1, self_ns=1000, total_ns=1000, device="cuda:0", registers=255)
    finding = RegisterPressure().match(kernel, TuningContext({}))
    assert finding is not None and finding.weight == 1.0
    assert "at the 255 limit: likely spilling" in finding.reason
    with_device = RegisterPressure().match(kernel, TuningContext({"cuda:0": A100}))
    assert with_device is not None and "cap occupancy at 12%" in with_device.reason


def test_a_run_without_kernels_is_an_error(tmp_path: Path) -> None:
    run = dlprof.load(import_trace_run(tmp_path / "cupti", cupti_profiler_trace()))
    with pytest.raises(ValueError, match="no kernels"):
        tuning_candidates(run)


def test_limit(simple_add: Run) -> None:
    assert len(tuning_candidates(simple_add, limit=3).table) == 3


def test_collectives_are_ranked_apart(tmp_path_factory: pytest.TempPathFactory) -> None:
    """NCCL kernels on the A100 job wait for the other ranks: no launch signal explains them."""
    run = dlprof.load(import_trace_run(tmp_path_factory.mktemp("runs") / "a100", kineto_trace("trace_diff/control")))
    found = tuning_candidates(run)
    assert not found.table["name"].str.contains("nccl", case=False).any()
    assert len(found.collectives) and found.collectives["name"].str.contains("nccl", case=False).all()
    assert found.collectives["self_ns"].sum() > found.table["self_ns"].iloc[0]  # they would have ranked first


def test_occupancy_is_never_one_kineto_did_not_compute(h200_run: Path) -> None:
    """dlprof's H200 run: Kineto recorded occupancy 0 for the nvjet GEMMs (warps_per_sm 12);
    their occupancy is the launch configuration's, 12 warps of 64."""
    run = dlprof.load(h200_run)
    table = tuning_candidates(run).table.set_index("name")
    reasons = [r for rs in table["reasons"] for r in rs]
    assert not any("occupancy 0%" in r for r in reasons)
    nvjet = table.loc["nvjet_sm90_tst_192x128_64x5_1x2_h_bz_coopB_TNT", "reasons"]
    assert nvjet[0].startswith("theoretical occupancy 19% (< 50%, limited by registers)")
