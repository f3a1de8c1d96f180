"""The GPU rules on real recorded traces (V100 and A100 jobs, an A100 benchmark): what they
find there, and what they must not."""

from __future__ import annotations

from pathlib import Path

import pytest

import dlprof
from dlprof.advice.base import Severity
from dlprof.advice.kernels import Units, math_units
from dlprof.advice.ranking import Advice, advise
from dlprof.advice.registry import rule_names, rules
from dlprof.analysis.gpu import ALL, gpu_breakdown
from dlprof.keys import RunStatus
from dlprof.store.manifest import Manifest
from dlprof.store.writer import RankWriter
from tests.builders import write_imported_run
from tests.conftest import KINETO_TRACES


def _advice(run_dir: Path) -> Advice:
    return advise(dlprof.load(run_dir))


def test_fp32_gemms_on_a_v100_leave_the_tensor_cores_unused(v100_run: Path) -> None:
    advice = _advice(v100_run)
    found = {f.rule: f for f in advice.findings}
    finding = found["tensor-cores-unused"]
    assert all("volta_sgemm" in e.place and "sm 7.0" in e.place for e in finding.evidence)
    # TF32 needs Ampere: the V100 run has no GEMM for that rule to judge.
    skipped = {s.rule: s.reason for s in advice.skipped}
    assert "compute capability >= 8.0" in skipped["fp32-without-tf32"]


def test_an_a100_job_with_some_sgemm_is_told_about_tf32_not_tensor_cores(a100_run: Path) -> None:
    advice = _advice(a100_run)
    found = {f.rule: f for f in advice.findings}
    assert all("ampere_sgemm" in e.place for e in found["fp32-without-tf32"].evidence)
    assert "tensor-cores-unused" in advice.passed
    # apex's FusedAdam updates every tensor in a few kernels: no single-tensor optimizer.
    assert "single-tensor-optimizer" in advice.passed


def test_the_a100_benchmark_leaves_its_gpu_idle_and_copies_from_pageable_memory(gpu_run: Path) -> None:
    run = dlprof.load(gpu_run)
    found = {f.rule: f for f in advise(run).findings}
    whole = gpu_breakdown(run)
    whole = whole[whole["step"] == ALL]
    idle = found["low-utilisation"]
    assert idle.stake_ns == float(whole["idle_ns"].sum())
    assert "largest category" in idle.summary
    copies = found["cpu-tensor-copied"]
    assert all("Pageable" in e.place for e in copies.evidence)
    assert found["fp32-without-tf32"].stake_ns > 0


def test_a_gpu_bound_job_is_told_so_not_launch_bound(v100_run: Path, a100_run: Path) -> None:
    """The V100 job's GPU is busy 96% of its steps and nearly every kernel queues behind earlier
    work: its launch calls block on a full queue and its copies wait for the GPU, which once read
    as 1.3 s of launch overhead. The A100 job, idle 16% of its steps, is neither."""
    advice = _advice(v100_run)
    found = {f.rule: f for f in advice.findings}
    assert "launch-bound" in advice.passed
    bound = found["gpu-bound"]
    assert bound.severity is Severity.HIGH and "collectives 31%" in bound.summary
    assert not any("nccl" in e.place.lower() for e in bound.evidence)  # the other ranks' pace, set apart
    assert bound.evidence[0].place.startswith("kernel void split_embedding_backward_codegen")
    assert bound.stake_ns == pytest.approx(sum(e.time_ns for e in bound.evidence))
    a100 = _advice(a100_run)
    assert {"gpu-bound", "launch-bound"} <= set(a100.passed)


def test_kernel_names_tell_tensor_cores_from_fp32_units() -> None:
    assert math_units("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4>") is Units.TENSOR_CORES
    assert math_units("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32") is Units.TENSOR_CORES
    assert math_units("volta_h884gemm_64x64_ldg8_nn") is Units.TENSOR_CORES
    assert math_units("ampere_sgemm_128x64_nn") is Units.FP32_SIMT
    assert math_units("cudnn_ampere_scudnn_128x64_relu_xregs_large_nn_v1") is Units.FP32_SIMT
    assert math_units("void at::native::vectorized_elementwise_kernel<4>") is None


def test_unsteady_steps_on_the_recorded_jobs(v100_run: Path, a100_run: Path) -> None:
    """The V100 job has two steps 45% over its median; the A100 job's steps are even."""
    finding = {f.rule: f for f in _advice(v100_run).findings}["unsteady-steps"]
    assert {e.place for e in finding.evidence[:2]} == {"rank 0 ProfilerStep#1011", "rank 0 ProfilerStep#1014"}
    assert "unsteady-steps" in _advice(a100_run).passed


SMALL_TRACES = sorted(p for p in KINETO_TRACES.rglob("*.json.gz") if "trace_diff" not in p.parts)


@pytest.mark.parametrize("trace", SMALL_TRACES, ids=lambda p: p.parent.name)
def test_every_recorded_trace_is_judged_or_skipped_by_every_rule(trace: Path, tmp_path: Path) -> None:
    run = dlprof.load(write_imported_run(tmp_path / "run", trace, (0,)))
    advice = advise(run, rules=rules(everything=True))
    judged = [f.rule for f in advice.findings] + [s.rule for s in advice.skipped] + list(advice.passed)
    assert sorted(judged) == sorted(rule_names())
    assert all(f.stake_ns >= 0 and f.evidence for f in advice.findings)


def test_an_empty_run_skips_every_rule(tmp_path: Path) -> None:
    run_dir = tmp_path / "empty"
    run_dir.mkdir()
    Manifest(name="empty", command=["python"], status=RunStatus.COMPLETE).write(run_dir)
    RankWriter(run_dir, 0).compact()
    advice = advise(dlprof.load(run_dir), rules=rules(everything=True))
    assert not advice.findings
    assert {s.rule for s in advice.skipped} == set(rule_names())
