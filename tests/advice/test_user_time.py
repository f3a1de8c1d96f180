"""The rules judge the user's time: a step less dlprof's pauses, the GPU's own idle time, launch
cost told from queueing. On the H200 run with its save marked as the pause it was, and on small
runs of hand-built rows where every figure is known."""

from __future__ import annotations

from pathlib import Path

import pytest

import dlprof
from dlprof.advice.base import Finding, Severity
from dlprof.advice.ranking import advise
from dlprof.advice.registry import rules
from dlprof.analysis.steps import StepStatus, step_report
from dlprof.keys import Kind
from tests.builders import op, write_rows_run

US = 1_000


def _found(run: dlprof.Run, *names: str) -> dict[str, Finding]:
    advice = advise(run, rules=rules(names))
    return {f.rule: f for f in advice.findings}


def test_a_save_inside_a_step_is_no_unsteady_step(h200_run: Path, h200_paused_run: Path) -> None:
    """As recorded, the save's 736 ms stall makes ProfilerStep#16 the one slow step; marked as
    dlprof's pause, the user's steps are steady."""
    found = _found(dlprof.load(h200_run), "unsteady-steps")["unsteady-steps"]
    assert found.evidence[0].place == "rank 0 ProfilerStep#16" and found.stake_ns > 700e6
    advice = advise(dlprof.load(h200_paused_run), rules=rules(["unsteady-steps"]))
    assert advice.passed == ("unsteady-steps",)


def test_the_gpu_idle_time_at_stake_is_the_gpus_own(h200_run: Path, h200_paused_run: Path) -> None:
    """Low utilisation claims the GPU's idle time in the counted steps, less the time it sat idle
    while dlprof held the program; memory headroom claims the same time, counted once."""
    paused = dlprof.load(h200_paused_run)
    ((pause_ns,),) = paused.query(f"SELECT dur_ns FROM slices WHERE kind = '{Kind.PROFILER}'").rows
    report = step_report(paused)
    counted = report.device_steps[report.device_steps["status"] == StepStatus.COUNTED]
    found = {f.rule: f for f in advise(paused).findings}
    low = found["low-utilisation"]
    assert low.stake_ns == pytest.approx(float(counted["idle_ns"].sum()))
    as_recorded = _found(dlprof.load(h200_run), "low-utilisation")["low-utilisation"]
    assert as_recorded.stake_ns - low.stake_ns == pytest.approx(pause_ns, rel=1e-4)
    assert "launched in backward" in low.summary  # which part's work kept the GPU busy
    assert found["memory-headroom"].shared_ns == pytest.approx(low.stake_ns)


def _loop_with_pauses(directory: Path) -> dlprof.Run:
    """Four steps of 10 us, each 9 us of it a pause of dlprof's and 0.4 us a batch loaded in the loop."""
    rows = []
    for i in range(4):
        start = i * 10 * US
        rows += [op(10 * i + 1, f"ProfilerStep#{i}", start, 10 * US, kind=Kind.STEP),
                 op(10 * i + 2, "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", start, 400,
                    kind=Kind.DATA_WAIT),
                 op(10 * i + 3, "dlprof::save", start + 1 * US, 9 * US, kind=Kind.PROFILER)]
    return write_rows_run(directory, rows)


def test_data_loading_is_weighed_against_the_users_step_time(tmp_path: Path) -> None:
    """0.4 us of loading in steps of 1 us of the user's (10 us with dlprof's pauses): 40% of the
    steps, not 4%."""
    found = _found(_loop_with_pauses(tmp_path / "run"), "input-bound", "synchronous-dataloader")
    assert found["input-bound"].severity is Severity.HIGH
    assert "data wait is 40.0%" in found["input-bound"].summary
    assert found["synchronous-dataloader"].severity is Severity.HIGH
    assert "40.0% of the steps' time" in found["synchronous-dataloader"].summary


def _kernel(i: int, name: str, call: tuple[int, int], start: int, dur: int) -> list[dict[str, object]]:
    """A kernel on stream 7 of cuda:0 and the runtime call that launched it (times in us)."""
    return [op(i, "cudaLaunchKernel", call[0] * US, call[1] * US, kind=Kind.RUNTIME, correlation_id=i),
            op(1000 + i, name, start * US, dur * US, tid=7, kind=Kind.KERNEL, device="cuda:0", stream=7,
               correlation_id=i)]


def test_launch_bound_counts_the_gpus_idle_time_while_work_is_launched_onto_a_free_stream(tmp_path: Path) -> None:
    rows = [op(1, "ProfilerStep#0", 0, 1000 * US, kind=Kind.STEP),
            op(2, "ProfilerStep#1", 1000 * US, 1000 * US, kind=Kind.STEP),
            op(3, "ProfilerStep#2", 2000 * US, 1000 * US, kind=Kind.STEP),
            # First launches (and the warm-up step) are set-up: a module loads.
            *_kernel(10, "k", (100, 300), 400, 5), *_kernel(11, "big", (500, 100), 700, 5),
            op(12, "cudaFuncSetAttribute", 800 * US, 60 * US, kind=Kind.RUNTIME),
            # 20 us from the call's start to the kernel's, the GPU idle: counted.
            *_kernel(20, "k", (1100, 10), 1120, 5),
            # A long kernel: 10 us of its launch counted; one launched behind it queues (490 us)
            # and starts 90 us after it ends: no launch cost of the host's, not counted.
            *_kernel(21, "big", (1300, 5), 1310, 500), *_kernel(22, "k", (1320, 5), 1900, 5),
            # Starting 395 us after its call returned on a free stream, it waited for something
            # else: counted up to 20 us past the call's return (25 us).
            *_kernel(30, "k", (2100, 5), 2500, 5),
            # A runtime call launching nothing, over 50 us (100 us): counted; a wait is not.
            op(31, "cudaFuncSetAttribute", 2600 * US, 100 * US, kind=Kind.RUNTIME),
            op(32, "cudaStreamSynchronize", 2700 * US, 100 * US, kind=Kind.RUNTIME),
            # dlprof's pause is neither the steps' time nor the GPU's idle time.
            op(33, "dlprof::save", 2800 * US, 100 * US, kind=Kind.PROFILER)]
    found = _found(write_rows_run(tmp_path / "run", rows), "launch-bound")["launch-bound"]
    assert found.stake_ns == (20 + 10 + 25 + 100) * US
    assert found.severity is Severity.MODERATE
    assert "155 us (8.2%) of the counted steps' time" in found.summary  # of 2 ms less the pause
    assert {e.place: e.time_ns for e in found.evidence} == {
        "kernel k on cuda:0": 45 * US, "runtime cudaFuncSetAttribute on cuda:0": 100 * US,
        "kernel big on cuda:0": 10 * US}
