"""The advice on dlprof's own H200 run: GPU time at stake, no time claimed twice, the steady
state apart from set-up, and every rule in reach of a run of this size."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import dlprof
from dlprof.advice.base import Severity
from dlprof.advice.ranking import Advice, advise
from dlprof.advice.registry import rules


@pytest.fixture(scope="module")
def h200_advice(h200_run: Path) -> Advice:
    return advise(dlprof.load(h200_run), rules=rules(everything=True))


def _kernel_ns(run_dir: Path, like: str) -> float:
    run = dlprof.load(run_dir)
    return float(run.query(f"SELECT sum(dur_ns) FROM slices WHERE kind = 'kernel' AND name LIKE '{like}'").rows[0][0])


def test_the_vocabulary_puts_its_gemms_gpu_time_at_stake(h200_run: Path, h200_advice: Advice) -> None:
    """The 50257-word vocabulary's three GEMMs run on CUTLASS's align1 kernels: their GPU time
    (about 159 ms, 36% of all kernel time) is at stake, not the ops' 15 ms of host time."""
    found = {f.rule: f for f in h200_advice.findings}["fp16-dimensions"]
    align1 = _kernel_ns(h200_run, "%align1%")
    assert found.stake_ns == pytest.approx(align1, rel=1e-9)
    assert align1 / _kernel_ns(h200_run, "%") > 0.35
    assert all("50257" in e.place and "align1" in e.detail for e in found.evidence)
    assert "aligned ones reach" in found.summary
    ranked = [f.rule for f in h200_advice.findings]
    assert ranked.index("fp16-dimensions") < ranked.index("cpu-tensor-copied")


def test_findings_rank_by_what_they_keep_and_no_time_is_claimed_twice(h200_advice: Advice) -> None:
    found = {f.rule: f for f in h200_advice.findings}
    stakes = [f.stake_ns for f in h200_advice.findings]
    assert stakes == sorted(stakes, reverse=True)
    idle, headroom = found["low-utilisation"], found["memory-headroom"]
    # Both would claim the GPU's idle time in the counted steps: it is counted once.
    assert idle.stake_ns > 0 and headroom.stake_ns == 0
    assert headroom.shared_ns == pytest.approx(idle.stake_ns)
    assert headroom.shared_with == ("low-utilisation",)


def test_set_up_in_the_first_step_is_not_steady_state_host_time(h200_run: Path, h200_advice: Advice) -> None:
    """Building the model in the warm-up step (19 s of Python outside ops) is not what the host
    does while the GPU idles in the counted steps."""
    summary = {f.rule: f for f in h200_advice.findings}["low-utilisation"].summary
    found = re.search(r"\(([\d.]+) (s|ms|us) self time in the counted steps\)", summary)
    assert found, summary
    named_ns = float(found.group(1)) * {"s": 1e9, "ms": 1e6, "us": 1e3}[found.group(2)]
    run = dlprof.load(h200_run)
    counted = run.query("SELECT sum(dur_ns) FROM slices WHERE kind = 'step' AND name <> 'ProfilerStep#0'").rows[0][0]
    assert named_ns <= counted


def test_the_gpu_idles_while_kernels_are_launched_onto_a_free_stream(h200_advice: Advice) -> None:
    """616 kernels a step, most on an idle stream: the GPU idles about 5 ms a step while they are
    launched (autocast's bf16 casts first). A GPU busy 22% of its steps is no GPU-bound one."""
    found = {f.rule: f for f in h200_advice.findings}
    launches = found["launch-bound"]
    assert launches.severity is Severity.MODERATE
    assert "bfloat16" in launches.evidence[0].place and "launches onto a free stream" in launches.evidence[0].detail
    assert 80e6 < launches.stake_ns + launches.shared_ns < 110e6
    assert launches.stake_ns == 0 and "low-utilisation" in launches.shared_with  # the same idle time, once
    assert "gpu-bound" in h200_advice.passed


def test_pageable_copies_are_found_through_the_ops_that_made_them(h200_advice: Advice) -> None:
    copies = {f.rule: f for f in h200_advice.findings}["cpu-tensor-copied"]
    assert copies.evidence[0].place == "aten::copy_: Memcpy HtoD (Pageable -> Device)"
    assert "76 copies" in copies.evidence[0].detail


def test_advise_shortens_the_kernel_signatures_it_names(
        h200_run: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """CUTLASS's signatures are 140 characters, at::native's 800: at 80 columns each finding reads
    in lines of the terminal, the tile and alignment kept; JSON keeps them whole."""
    from dlprof.cli.main import main

    monkeypatch.setenv("COLUMNS", "80")
    assert main(["advise", str(h200_run)]) == 0
    out = capsys.readouterr().out
    assert all(len(line) <= 80 for line in out.splitlines())
    assert "::Params" not in out and "128x128_tn_align1" in out
    assert "ofthetimeitclaimscountedunderlow-utilisation" in "".join(out.split())  # however it wraps
    assert main(["advise", str(h200_run), "--format", "json"]) == 0
    assert "cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_tn_align1::Params" in capsys.readouterr().out
