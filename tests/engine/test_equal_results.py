"""Every analysis gives the same result on DuckDB and on Spark, on real runs: a native PyTorch run,
an imported GPU trace (A100), a two-rank gloo job and dlprof's own run on an H200.

Spark runs for real, in local mode. Results are compared as DataFrames: same columns, same rows in
the same order, integers and strings exactly, floats to 1e-9 relative (the engines may add up
floating-point values in another order).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import dlprof
from dlprof.advice.ranking import advise
from dlprof.analysis.aggregate import kinds_present, top
from dlprof.analysis.derived import BUILTINS, Grouping, derived_metrics
from dlprof.analysis.device_time import device_times
from dlprof.analysis.diff import choose_basis, diff, work_steps
from dlprof.analysis.estimate import estimate
from dlprof.analysis.gpu import device_work, gpu_breakdown
from dlprof.analysis.memory import MemoryGroup, layer_peaks, live_at_peak, memory_peaks
from dlprof.analysis.ranks import collective_arrivals, rank_steps, rank_summary
from dlprof.analysis.report_data import report_data
from dlprof.analysis.report_gpu import gpu_overview
from dlprof.analysis.roofline import RooflineKey, roofline
from dlprof.analysis.steps import step_report
from dlprof.analysis.tau_profile import folded_inclusive, function_summaries, tau_profiles
from dlprof.analysis.tfprof import op_costs, op_view
from dlprof.analysis.trees import code_tree, scope_tree
from dlprof.analysis.tuning import kernel_summaries
from dlprof.analysis.work_items import work_items
from dlprof.hardware.devices import device_table
from dlprof.keys import GroupKey, Kind, SortKey
from dlprof.store.reader import Run
from tests.conftest import dlprof_program

pytestmark = pytest.mark.slow

# An analysis as the tests call it: a run in, something comparable out.
Analysis = Callable[[Run], Any]

ANALYSES: dict[str, Analysis] = {
    "kinds": kinds_present,
    "top ops": lambda run: top(run, limit=None),
    "top ops by self, shapes": lambda run: top(run, by=SortKey.SELF, group_by=GroupKey.SHAPE, limit=None),
    "top kernels by launching op": lambda run: top(run, kind=Kind.KERNEL, group_by=GroupKey.OP, limit=None),
    "top modules per rank": lambda run: top(run, kind=Kind.MODULE, per_rank=True, limit=None),
    "top ops per rank": lambda run: top(run, per_rank=True, limit=5),
    "op costs": op_costs,
    "op view": op_view,
    "scope tree": scope_tree,
    "code tree": code_tree,
    "TAU profiles": lambda run: tau_frames(tau_profiles(run)),
    "device work": device_work,
    "GPU breakdown": gpu_breakdown,
    "rank steps": rank_steps,
    "rank summary": rank_summary,
    "collective arrivals": collective_arrivals,
    "steps with work": work_steps,
    "diff with itself": lambda run: diff(run, run, per=choose_basis(run, run)),
    "derived metrics per name": lambda run: derived_metrics(run, BUILTINS).values,
    "derived metrics per slice": lambda run: derived_metrics(run, BUILTINS, Grouping.SLICE).values,
    "kernel summaries": lambda run: pd.DataFrame(
        [{k: v for k, v in dataclasses.asdict(summary).items() if k != "per_inst"} for summary in kernel_summaries(run)]),
    "report data": report_data,
    "memory peaks": memory_peaks,
    "live at the peak by category": lambda run: live_at_peak(run, MemoryGroup.CATEGORY),
    "layer peaks": layer_peaks,
    "step report": lambda run: list(dataclasses.astuple(step_report(run))),
    "step report within a region": lambda run: list(dataclasses.astuple(step_report(run, within="train_step"))),
    "work items with layers": lambda run: work_items(run, with_layers=True).table,
    "roofline per kernel": lambda run: roofline(run, RooflineKey.KERNEL).table,
    "estimate on a V100": lambda run: estimate_frames(run, "V100 SXM2"),
    "device time of layers": lambda run: device_times(run, Kind.MODULE).sort_values(["rank", "id"]),
    "device time of steps": lambda run: device_times(run, Kind.STEP).sort_values(["rank", "id"]),
    "top modules": lambda run: top(run, kind=Kind.MODULE, limit=None),
    "advice": lambda run: [dataclasses.asdict(f) for f in advise(run).findings],
    "GPU overview": gpu_overview,
    "TAU -others- rows": lambda run: list(folded_inclusive(run, tau_profiles(run), 3)),
}


def estimate_frames(run: Run, target: str) -> list[Any]:
    """An estimate's tables and total, for a device of the table."""
    device = device_table().by_name(target)
    assert device is not None, target
    found = estimate(run, device)
    return [found.ops, found.steps, found.excluded, found.predicted_ns]


def tau_frames(profiles: list[Any]) -> list[pd.DataFrame]:
    """TAU profiles as frames: which threads, then each thread's table, then the summaries."""
    threads = pd.DataFrame([(p.rank, p.thread, p.pid, p.tid, p.device, p.wall_ns) for p in profiles],
                           columns=["rank", "thread", "pid", "tid", "device", "wall_ns"])
    return [threads, *(p.functions for p in profiles), *(s.functions for s in function_summaries(profiles))]


def assert_same(duck: Any, spark: Any, label: str) -> None:
    """Equal results: DataFrames column by column (floats to a relative 1e-9), the rest by ==."""
    if isinstance(duck, pd.DataFrame):
        assert isinstance(spark, pd.DataFrame), label
        assert list(duck.columns) == list(spark.columns), label
        assert len(duck) == len(spark), label
        pd.testing.assert_frame_equal(duck.reset_index(drop=True), spark.reset_index(drop=True),
                                      check_dtype=False, check_exact=False, rtol=1e-9, obj=label)
    elif isinstance(duck, list | tuple):
        assert isinstance(spark, list | tuple) and len(duck) == len(spark), label
        for index, (d, s) in enumerate(zip(duck, spark, strict=True)):
            assert_same(d, s, f"{label}[{index}]")
    elif isinstance(duck, dict):
        assert isinstance(spark, dict) and list(duck) == list(spark), label
        for key in duck:
            assert_same(duck[key], spark[key], f"{label}.{key}")
    elif isinstance(duck, float):
        assert spark == pytest.approx(duck, rel=1e-9, nan_ok=True), label
    else:
        assert duck == spark, label


# Which analyses each run exercises: every analysis on at least one run, each where its data is
# (Spark in local mode spends about a second a query, so not everything everywhere).
CASES: dict[str, tuple[str, ...]] = {
    "native": ("kinds", "top ops", "top ops by self, shapes", "top modules per rank", "op costs", "op view",
               "scope tree", "code tree", "TAU profiles", "steps with work", "diff with itself",
               "derived metrics per name", "report data", "memory peaks", "live at the peak by category",
               "layer peaks", "step report", "work items with layers", "step report within a region"),
    "gpu": ("top ops", "top kernels by launching op", "op view", "device work", "GPU breakdown",
            "kernel summaries", "derived metrics per slice", "rank summary", "TAU profiles", "work items with layers",
            "roofline per kernel", "estimate on a V100", "advice", "GPU overview", "TAU -others- rows"),
    "two ranks": ("step report", "top ops per rank", "rank steps", "rank summary", "collective arrivals", "op view",
                  "diff with itself"),
    # Steps across threads, on the GPU too; device time through autograd's thread.
    "h200": ("step report", "device time of layers", "device time of steps", "top modules", "device work"),
}


@pytest.fixture(scope="module")
def runs(cnn_run: Path, gpu_run: Path, two_rank_gloo_run: Path, h200_run: Path) -> dict[str, Path]:
    return {"native": cnn_run, "gpu": gpu_run, "two ranks": two_rank_gloo_run, "h200": h200_run}


def test_every_analysis_is_compared() -> None:
    assert set(ANALYSES) == {label for labels in CASES.values() for label in labels}


@pytest.mark.parametrize("run_name", list(CASES))
def test_duckdb_and_spark_agree(run_name: str, runs: dict[str, Path], spark: None) -> None:
    path = runs[run_name]
    duck, on_spark = dlprof.load(path, engine="duckdb"), dlprof.load(path, engine="spark")
    for label in CASES[run_name]:
        expected = ANALYSES[label](duck)
        assert expected is not None, f"{run_name}: {label} has nothing to compare"
        assert_same(expected, ANALYSES[label](on_spark), f"{run_name}: {label}")


def test_the_readme_spark_command(cnn_run: Path, spark: None) -> None:
    # `dlprof top --engine spark`, as a user types it: a real process starting Spark in local mode.
    done = subprocess.run([*dlprof_program(), "top", str(cnn_run), "--engine", "spark", "--format", "json",
                           "-n", "5"], capture_output=True, text=True, check=False, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    shown = json.loads(done.stdout)
    expected = top(dlprof.load(cnn_run, engine="duckdb"), limit=5)
    assert [r["name"] for r in shown] == expected["name"].tolist()
    assert [r["total_ns"] for r in shown] == expected["total_ns"].tolist()
