"""The GPU check's comparisons, on both sides built from real recorded A100 traces.

dlprof's side is each trace imported and read back as the torch check reads a live run
(:func:`tools.gpu_check.checks.stored.device_work`); the reference side is computed from the raw
JSON by brute force. The two agree, and each deliberate difference (a kernel missing, time off by
3 %, a launch moved to another op, a launch not linked) fails the part that should catch it.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from dlprof.store.reader import Run
from tests.tools.gpu_check.recorded import ALEXNET, SAMPLED, imported_run, raw_events, reference_work
from tools.gpu_check.checks.stored import Link, device_work, run_complete, within_span
from tools.gpu_check.compare import (
    DEVICE_KINDS,
    PHYSICAL_RANGES,
    Range,
    Window,
    Work,
    check_linked,
    check_order,
    check_range,
    check_rise,
    compare_calls,
    compare_counts,
    compare_launchers,
    compare_time,
)
from tools.gpu_check.report import Status


@pytest.fixture(scope="module", params=[ALEXNET, SAMPLED], ids=["alexnet", "sampled-rank0"])
def sides(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, list[Work], list[Work]]:
    path: Path = request.param
    run = imported_run(path, tmp_path_factory.mktemp("recorded"))
    return run, device_work(run, Link.OP), reference_work(raw_events(path))


def test_a_faithful_run_passes_every_comparison(sides: tuple[Run, list[Work], list[Work]]) -> None:
    _, ours, theirs = sides
    assert {w.kind for w in theirs} == set(DEVICE_KINDS)
    for kind in DEVICE_KINDS:
        calls = compare_calls(ours, theirs, kind)
        assert calls.status is Status.PASSED, calls.detail
        assert calls.figures["dlprof"] == sum(w.kind == kind for w in theirs) > 0
        time = compare_time(ours, theirs, kind)
        assert time.status is Status.PASSED and time.figures["ratio"] == pytest.approx(1, abs=1e-3)
    assert check_linked(ours, "correlation").status is Status.PASSED
    launchers = compare_launchers(ours, theirs)
    assert launchers.status is Status.PASSED, launchers.figures.get("differing")


def test_a_missing_kernel_fails_its_count_and_names_it(sides: tuple[Run, list[Work], list[Work]]) -> None:
    _, ours, theirs = sides
    dropped = next(w for w in theirs if w.kind == "kernel")
    fewer = list(theirs)
    fewer.remove(dropped)
    part = compare_calls(ours, fewer, "kernel")
    assert part.status is Status.FAILED
    expected = sum(w.name == dropped.name for w in ours if w.kind == "kernel")
    assert part.figures["differing"] == [{"name": dropped.name, "dlprof": expected, "reference": expected - 1}]
    assert compare_calls(ours, fewer, "memcpy").status is Status.PASSED  # the other kinds are untouched


@pytest.mark.parametrize(("scale", "status"), [(1.03, Status.FAILED), (0.97, Status.FAILED),
                                                (1.015, Status.PASSED), (0.985, Status.PASSED)])
def test_device_time_must_agree_within_two_percent(sides: tuple[Run, list[Work], list[Work]], scale: float,
                                                   status: Status) -> None:
    _, ours, theirs = sides
    scaled = [dataclasses.replace(w, dur_ns=round(w.dur_ns * scale)) for w in theirs]
    part = compare_time(ours, scaled, "kernel")
    assert part.status is status
    assert part.figures["ratio"] == pytest.approx(1 / scale, rel=1e-3)
    assert part.figures["largest_moves"][0]["name"] in {w.name for w in theirs}


def test_a_launch_under_another_op_fails_the_launcher_comparison(sides: tuple[Run, list[Work], list[Work]]) -> None:
    _, ours, theirs = sides
    index = next(i for i, w in enumerate(theirs) if w.kind == "memcpy")
    moved = list(theirs)
    moved[index] = dataclasses.replace(theirs[index], launcher="aten::somewhere_else")
    part = compare_launchers(ours, moved)
    assert part.status is Status.FAILED
    assert {d["name"] for d in part.figures["differing"]} == {
        f"memcpy {theirs[index].name} <- {theirs[index].launcher}", f"memcpy {theirs[index].name} <- aten::somewhere_else"}


def test_an_unlinked_launch_fails_the_link_check(sides: tuple[Run, list[Work], list[Work]]) -> None:
    _, ours, _ = sides
    broken = [dataclasses.replace(ours[0], launcher=None), *ours[1:]]
    part = check_linked(broken, "correlation")
    assert part.status is Status.FAILED and part.figures["unlinked"] == 1
    assert part.figures["unlinked_names"] == [{"name": f"{ours[0].kind} {ours[0].name}", "count": 1}]
    assert check_linked([], "correlation").status is Status.FAILED


def test_the_run_is_judged_complete_and_within_its_span(sides: tuple[Run, list[Work], list[Work]]) -> None:
    run, _, _ = sides
    imported = run.manifest.collectors[0].name
    assert run_complete(run, [imported]).status is Status.PASSED
    absent = run_complete(run, ["cupti"])
    assert absent.status is Status.FAILED and "cupti: not in the manifest" in absent.detail
    # An imported trace has no live clock mapping: the span check says which clock is missing.
    span = within_span(run, "cupti")
    assert span.status is Status.FAILED and "no cupti clock" in span.detail


def test_counts_on_neither_side_cannot_be_judged() -> None:
    from collections import Counter

    part = compare_counts("memsets", Counter(), Counter())
    assert part.status is Status.COULD_NOT_RUN
    assert compare_time([], [], "memset").status is Status.COULD_NOT_RUN
    only_ours = compare_time([Work("memset", "Memset (Device)", 5)], [], "memset")
    assert only_ours.status is Status.FAILED


def test_metric_ranges_catch_values_outside_and_let_sampling_slack_through() -> None:
    ipc = PHYSICAL_RANGES["ipc"]
    rows = [{"name": "fma_loop", "ipc": 3.9}, {"name": "stream_scale", "ipc": 0.2},
            {"name": "cupy_fill", "ipc": None}, {"name": "nan", "ipc": math.nan}]
    passed = check_range(rows, "ipc", ipc)
    assert passed.status is Status.PASSED and passed.figures["kernels"] == 2
    assert check_range([*rows, {"name": "edge", "ipc": 4.15}], "ipc", ipc).status is Status.PASSED  # within 5 %
    failed = check_range([*rows, {"name": "wrong", "ipc": 6.0}], "ipc", ipc)
    assert failed.status is Status.FAILED and failed.figures["outside"] == [{"name": "wrong", "ipc": 6.0}]
    assert check_range(rows[2:], "ipc", ipc).status is Status.FAILED  # no value at all
    loads = check_range([{"name": "k", "gld_per_inst": 1.2}], "gld_per_inst", PHYSICAL_RANGES["gld_per_inst"])
    assert loads.status is Status.FAILED
    unbounded = check_range([{"name": "k", "w": 1e6}], "w", Range(1.0, math.inf, "no ceiling"))
    assert unbounded.status is Status.PASSED and "inf" in unbounded.what
    below = check_range([{"name": "k", "warps_per_inst": 0.5}], "warps_per_inst", PHYSICAL_RANGES["warps_per_inst"])
    assert below.status is Status.FAILED


def test_the_memory_bound_kernel_must_load_more_per_instruction() -> None:
    rows = [{"name": "stream_scale", "gld_per_inst": 0.12}, {"name": "fma_loop", "gld_per_inst": 0.0}]
    assert check_order(rows, "gld_per_inst", "stream_scale", "fma_loop", "why").status is Status.PASSED
    assert check_order(rows, "gld_per_inst", "fma_loop", "stream_scale", "why").status is Status.FAILED
    assert check_order(rows[:1], "gld_per_inst", "stream_scale", "fma_loop", "why").status is Status.FAILED


def test_a_gauge_must_rise_while_the_gpu_works() -> None:
    second = 1_000_000_000
    idle, busy = Window(0, 2 * second), Window(3 * second, 6 * second)
    flat = [(t * second // 10, 60.0) for t in range(70)]
    rising = [(t, 400.0 if busy.holds(t) else v) for t, v in flat]
    part = check_rise(rising, idle, busy, "power rises", "W", min_rise=20, min_ratio=1.25)
    assert part.status is Status.PASSED
    assert part.figures["idle_mean"] == 60.0 and part.figures["busy_mean"] == 400.0
    assert part.figures["samples_idle"] == 21 and part.figures["samples_busy"] == 31
    assert check_rise(flat, idle, busy, "power rises", "W", min_rise=20).status is Status.FAILED
    small = [(t, 70.0 if busy.holds(t) else v) for t, v in flat]  # +10 W: below both thresholds
    assert check_rise(small, idle, busy, "power rises", "W", min_rise=20, min_ratio=1.25).status is Status.FAILED
    assert check_rise([], idle, busy, "power rises", "W", min_rise=20).status is Status.FAILED
