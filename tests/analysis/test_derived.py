"""Derived metrics: values checked against formulas computed here, on a real trace and on runs
whose counters the test sets.

The real trace is HTA's ``cupti_profiler`` A100 trace: 77 ``cuda_profiler_range`` events, each
holding the nine SASS floating-point instruction counters (add, mul, fma for double, single and
half precision). Its FLOPs per range are recomputed here from the raw JSON. Every other built-in
needs counters that trace lacks, so hand-built runs carry them, written through the real store
(chunks, compaction, manifest) so that slices and metrics are read back as any run's are.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import dlprof
from dlprof.analysis.cupti_names import describe_names, perfworks_name
from dlprof.analysis.derived import (
    BUILTIN_BY_NAME,
    BUILTINS,
    DerivedMetric,
    Formula,
    FormulaError,
    Grouping,
    derived_metrics,
    parse_metric_option,
    source_counters,
)
from dlprof.store.reader import Run
from tests.builders import GLD, HAND_BUILT, Kernel, cupti_profiler_trace, import_trace_run, write_counter_run
from tests.references import expected, raw_flops, raw_ranges


@pytest.fixture(scope="module")
def counter_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return dlprof.load(write_counter_run(tmp_path_factory.mktemp("runs") / "counters", HAND_BUILT))


@pytest.fixture(scope="module")
def cupti_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return dlprof.load(import_trace_run(tmp_path_factory.mktemp("runs") / "cupti", cupti_profiler_trace()))


def test_flops_per_range_of_the_cupti_profiler_trace(cupti_run: Run) -> None:
    ranges = raw_ranges()
    assert len(ranges) == 77
    table = derived_metrics(cupti_run, [BUILTIN_BY_NAME["flop_count"]], Grouping.SLICE)
    starts = cupti_run.slices.set_index("id")["start_ns"]
    values = table.values.assign(start=table.values["id"].map(starts)).sort_values("start")
    # Every range has counters, and none is all-zero in this trace, so all 77 rows are there.
    assert len(values) == 77
    assert list(values["name"]) == [e["name"] for e in ranges]
    np.testing.assert_allclose(values["flop_count"], [raw_flops(e) for e in ranges], rtol=1e-12)
    assert values["flop_count"].max() > 9e9  # an implicit sgemm: 2 x 9.1e9 FMAs


def test_flops_per_kernel_name_are_the_sums_over_its_ranges(cupti_run: Run) -> None:
    table = derived_metrics(cupti_run, [BUILTIN_BY_NAME["flop_count"]], Grouping.NAME)
    by_name: dict[str, float] = {}
    calls: dict[str, int] = {}
    for event in raw_ranges():
        by_name[event["name"]] = by_name.get(event["name"], 0.0) + raw_flops(event)
        calls[event["name"]] = calls.get(event["name"], 0) + 1
    got = table.values.set_index("name")
    assert set(got.index) == set(by_name)
    for name, value in by_name.items():
        assert got.loc[name, "flop_count"] == pytest.approx(value, rel=1e-12)
        assert got.loc[name, "calls"] == calls[name]
    # Sorted largest first.
    assert list(table.values["flop_count"]) == sorted(table.values["flop_count"], reverse=True)


def test_flop_rate_is_not_given_for_placeholder_range_durations(cupti_run: Run) -> None:
    table = derived_metrics(cupti_run, BUILTINS)
    assert [m.name for m in table.metrics] == ["flop_count"]
    assert "placeholders" in table.unavailable["flop_rate"]
    assert "smsp__inst_executed.sum" in table.unavailable["ipc"]
    assert table.missing["arithmetic_intensity"] == ("dram__bytes.sum",)


def test_every_builtin_per_group_is_its_formula_over_summed_counters(counter_run: Run) -> None:
    table = derived_metrics(counter_run, BUILTINS, Grouping.NAME)
    assert table.unavailable == {}
    got = table.values.set_index("name")
    for name in ("gemm", "relu"):
        want = expected([k for k in HAND_BUILT if k.name == name])
        for metric, value in want.items():
            assert got.loc[name, metric] == pytest.approx(value, rel=1e-12), (name, metric)
    assert got.loc["gemm", "calls"] == 2
    # ParaProf's way, not the mean of the ratios: 10000 / 2000 = 5, while (2 + 6) / 2 = 4.
    assert got.loc["gemm", "ipc"] == pytest.approx(5.0)


def test_every_builtin_per_slice(counter_run: Run) -> None:
    table = derived_metrics(counter_run, BUILTINS, Grouping.SLICE)
    ordered = table.values.sort_values("id").reset_index(drop=True)
    assert len(ordered) == len(HAND_BUILT)
    for row, kernel in zip(ordered.itertuples(), HAND_BUILT, strict=True):
        for metric, value in expected([kernel]).items():
            assert getattr(row, metric) == pytest.approx(value, rel=1e-12), (kernel, metric)


@pytest.mark.parametrize(
    "formula",
    [
        "inst_executed / active_cycles",  # legacy CUPTI event names
        "smsp__inst_executed.sum / sm__cycles_active.sum",  # Perfworks names
        "cupti:smsp__inst_executed.sum / cupti:sm__cycles_active.sum",  # with the source prefix
        "`cupti:smsp__inst_executed.sum` / (active_cycles)",  # quoted, mixed
        "ipc",  # the built-in itself
    ],
)
def test_legacy_and_perfworks_names_give_the_same_values(counter_run: Run, formula: str) -> None:
    mine = parse_metric_option(f"mine={formula}")
    table = derived_metrics(counter_run, [mine, BUILTIN_BY_NAME["ipc"]], Grouping.SLICE)
    assert table.unavailable == {}
    np.testing.assert_array_equal(table.values["mine"], table.values["ipc"])


def test_the_legacy_table_holds_the_documented_pairs() -> None:
    assert perfworks_name("inst_executed") == "smsp__inst_executed.sum"
    assert perfworks_name("active_warps") == "sm__warps_active.sum"
    assert perfworks_name("active_cycles") == "sm__cycles_active.sum"
    assert perfworks_name("gld_request") == "smsp__inst_executed_op_global_ld.sum"
    assert perfworks_name("sm__cycles_active.sum") == "sm__cycles_active.sum"
    assert describe_names(["gld_request", "sm__warps_active.sum"]) == (
        "gld_request (smsp__inst_executed_op_global_ld.sum), sm__warps_active.sum (legacy active_warps)"
    )


def test_builtins_document_formula_unit_and_counters() -> None:
    for metric in BUILTINS:
        assert metric.description and metric.unit and metric.parsed.names
    assert source_counters(BUILTIN_BY_NAME["ipc"]) == ("smsp__inst_executed.sum", "sm__cycles_active.sum")
    # Through the built-in it names; time is the slice's, not a counter.
    rate = source_counters(BUILTIN_BY_NAME["flop_rate"])
    assert len(rate) == 9 and all(c.startswith("smsp__sass_thread_inst_executed_op_") for c in rate)
    assert "dram__bytes.sum" in source_counters(BUILTIN_BY_NAME["arithmetic_intensity"])


@pytest.mark.parametrize(
    ("formula", "words"),
    [
        ("__import__('os')", "calls not allowed"),
        ("__import__('os').system('true')", "not allowed"),
        ("inst_executed.__class__", None),  # one dotted name, which no run has: see below
        ("open('/etc/passwd')", "calls not allowed"),
        ("a[0]", "indexing not allowed"),
        ("a if b else c", "not a formula"),
        ("lambda: 1", "not a formula"),
        ("'text'", "strings not allowed"),
        ("a // b", "operator // not allowed"),
        ("a % b", "operator % not allowed"),
        ("a < b", "comparisons not allowed"),
        ("(a", "not a formula"),
        ("", "not a formula"),
        ("``", "empty name"),
        ("1" * 3000, "longer than"),
    ],
)
def test_bad_formulas_are_rejected_in_one_line(formula: str, words: str | None) -> None:
    if words is None:
        assert Formula.parse(formula).names == ("inst_executed.__class__",)
        return
    with pytest.raises(FormulaError) as raised:
        parse_metric_option(f"bad={formula}")
    message = str(raised.value)
    assert words in message and "\n" not in message
    assert message.startswith("--metric bad:")


def test_unknown_names_are_reported_not_raised(counter_run: Run) -> None:
    typo = parse_metric_option("typo=inst_exectued / active_cycles")
    dotted = parse_metric_option("dotted=inst_executed.__class__")
    table = derived_metrics(counter_run, [typo, dotted, BUILTIN_BY_NAME["ipc"]])
    assert table.missing == {"typo": ("inst_exectued",), "dotted": ("inst_executed.__class__",)}
    assert "inst_exectued" in table.unavailable["typo"]
    assert [m.name for m in table.metrics] == ["ipc"]


@pytest.mark.parametrize(
    ("option", "words"),
    [
        ("nosuch", "no such built-in"),
        ("ipc=inst_executed", "taken"),
        ("time=1", "taken"),
        ("calls=1", "taken"),
        ("two words=1", "must be a word"),
    ],
)
def test_bad_metric_options(option: str, words: str) -> None:
    with pytest.raises(FormulaError, match=words):
        parse_metric_option(option)
    assert parse_metric_option("ipc") is BUILTIN_BY_NAME["ipc"]


def test_a_slice_lacking_a_counter_has_no_value_and_leaves_its_group_sum(tmp_path: Path) -> None:
    partial = dict(HAND_BUILT[0].counters)
    del partial[GLD]
    kernels = [Kernel("gemm", 100, partial), HAND_BUILT[1]]
    run = dlprof.load(write_counter_run(tmp_path / "partial", kernels))
    both = [BUILTIN_BY_NAME["gld_per_inst"], BUILTIN_BY_NAME["ipc"]]
    per_slice = derived_metrics(run, both, Grouping.SLICE).values.sort_values("id")
    assert per_slice["gld_per_inst"].isna().tolist() == [True, False]
    assert per_slice["ipc"].notna().all()
    # A row without any value is left out.
    only_gld = derived_metrics(run, both[:1], Grouping.SLICE).values
    assert only_gld["id"].tolist() == per_slice["id"].tolist()[1:]
    per_name = derived_metrics(run, both).values
    # gld/inst over the one complete slice only; ipc over both.
    assert per_name.loc[0, "gld_per_inst"] == pytest.approx(900 / 9000)
    assert per_name.loc[0, "ipc"] == pytest.approx(10_000 / 2000)


def test_division_by_zero_and_overflow_give_no_value(counter_run: Run) -> None:
    zero = parse_metric_option("zero=inst_executed / (active_cycles - active_cycles)")
    huge = parse_metric_option("huge=10 ** 400 + inst_executed")
    table = derived_metrics(counter_run, [zero, huge, BUILTIN_BY_NAME["ipc"]])
    assert "zero" in table.unavailable and "huge" in table.unavailable
    assert "non-zero divisor" in table.unavailable["zero"]


def test_an_ambiguous_name_is_an_error(tmp_path: Path) -> None:
    kernels = [Kernel("k", 10, {"cupti:x.sum": 1.0, "papi:x.sum": 2.0})]
    run = dlprof.load(write_counter_run(tmp_path / "ambiguous", kernels))
    with pytest.raises(FormulaError, match="ambiguous"):
        derived_metrics(run, [parse_metric_option("m=x.sum")])
    table = derived_metrics(run, [parse_metric_option("m=papi:x.sum / cupti:x.sum")])
    assert table.values.loc[0, "m"] == 2.0


def test_time_and_flops_work_without_counters(tmp_path: Path) -> None:
    kernels = [Kernel("matmul", 200, kind="op", flops=4_000_000),
               Kernel("matmul", 300, kind="op", flops=6_000_000), Kernel("view", 5, kind="op")]
    run = dlprof.load(write_counter_run(tmp_path / "ops", kernels))
    table = derived_metrics(run, [parse_metric_option("gflops=flops / time / 1e9")], kinds=["op"])
    assert table.values["name"].tolist() == ["matmul"]  # "view" has no flops: no value, no row
    assert table.values.loc[0, "gflops"] == pytest.approx(10e6 / 500e-6 / 1e9)
    everything = derived_metrics(run, [BUILTIN_BY_NAME["ipc"]])  # no counters at all
    assert everything.metrics == () and "smsp__inst_executed.sum" in everything.unavailable["ipc"]


def test_occupancy_needs_device_properties(tmp_path: Path) -> None:
    run = dlprof.load(write_counter_run(tmp_path / "nodevice", HAND_BUILT, devices=()))
    table = derived_metrics(run, [BUILTIN_BY_NAME["achieved_occupancy"]])
    assert "device properties" in table.unavailable["achieved_occupancy"]


def test_a_metric_is_a_plain_value_object() -> None:
    metric = DerivedMetric("x", "a + b", "two counters", "things")
    assert metric.parsed.names == ("a", "b")
    assert metric == DerivedMetric("x", "a + b", "two counters", "things")
