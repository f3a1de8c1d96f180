"""tfprof's op view: per op type, requested bytes, total/accelerator/CPU time and occurrence with
tfprof's two percentages, checked against sums computed here from the run's own rows."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pandas as pd
import pytest

import dlprof
from dlprof.analysis.aggregate import top
from dlprof.analysis.tfprof import MEASURES, op_view, percent_columns
from dlprof.keys import DEVICE_KINDS, GroupKey, Kind, SortKey
from tests.builders import imported_tensorflow_run, op, write_rows_run
from tests.references import Walk, expected_costs


def allocation(slice_id: int, size: int, ts: int) -> dict[str, object]:
    return {"pid": 1, "tid": 1, "device": "cpu", "ts_ns": ts, "bytes": size, "slice_id": slice_id}


def expected_by_type(run: dlprof.Run) -> dict[str, dict[str, int]]:
    walk = Walk(run)
    slices = run.slices.set_index("id")
    by_type: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for op_id, cost in expected_costs(run).items():
        recorded = slices.at[op_id, "op_type"]
        kind = str(walk.rows[op_id]["name"]) if pd.isna(recorded) else str(recorded)
        row = by_type[kind]
        row["occurrence"] += 1
        row["cpu_ns"] += cost["cpu"]
        row["device_ns"] += cost["device"]
        row["total_ns"] += cost["cpu"] + cost["device"]
        row["bytes"] += cost["bytes"]
    return by_type


def assert_matches(table: pd.DataFrame, expected: dict[str, dict[str, int]]) -> None:
    assert set(table["name"]) == set(expected)
    for row in table.to_dict("records"):
        for column in ("occurrence", "cpu_ns", "device_ns", "total_ns", "bytes"):
            assert row[column] == expected[row["name"]][column], (row["name"], column)


@pytest.mark.torch
def test_op_view_of_a_real_torch_run(cnn_run: Path) -> None:
    run = dlprof.load(cnn_run)
    table = op_view(run)
    assert_matches(table, expected_by_type(run))
    ops = run.slices[run.slices["kind"] == Kind.OP]
    # Nothing counted twice: the CPU times add up to the time of the outermost ops.
    walk = Walk(run)
    outermost = [i for i in walk.ops() if walk.enclosing(i, Kind.OP) is None]
    assert table["cpu_ns"].sum() == sum(int(walk.rows[i]["dur_ns"]) for i in outermost)
    assert table["occurrence"].sum() == len(ops)
    # Every allocation in the run is made inside some op of this CPU-only model.
    assert table["bytes"].sum() == run.memory.loc[run.memory["bytes"] > 0, "bytes"].sum() > 0
    assert (table["device_ns"] == 0).all() and (table["total_ns"] == table["cpu_ns"]).all()


def test_accelerator_time_of_a_recorded_gpu_trace(gpu_run: Path) -> None:
    run = dlprof.load(gpu_run)
    table = op_view(run, by=SortKey.DEVICE)
    assert_matches(table, expected_by_type(run))
    assert table["device_ns"].iloc[0] > 0 and table["device_ns"].is_monotonic_decreasing
    kernels = run.slices[run.slices["kind"] == Kind.KERNEL]
    assert 0 < table["device_ns"].sum() <= run.slices.loc[
        run.slices["kind"].isin([str(k) for k in DEVICE_KINDS]), "dur_ns"].sum()
    assert len(kernels) > 0


@pytest.mark.torch
@pytest.mark.parametrize("by", [k for k in SortKey if k is not SortKey.DEVICE])
def test_percentages_as_tfprof_prints_them(cnn_run: Path, by: SortKey) -> None:
    table = op_view(dlprof.load(cnn_run), by=by)
    sorted_on = {SortKey.MICROS: "total_ns", SortKey.SELF: "cpu_ns", SortKey.CALLS: "occurrence",
                 SortKey.BYTES: "bytes", SortKey.FLOPS: "flops"}[by]
    assert table[sorted_on].is_monotonic_decreasing
    for measure in MEASURES:
        share, cumulative = percent_columns(measure)
        whole = table[measure].sum()
        if whole == 0:
            assert (table[share] == 0).all()
            continue
        assert table[share].tolist() == pytest.approx((100.0 * table[measure] / whole).tolist())
        # The first percentage is this row and every row below it: 100% at the top, then falling
        # by each row's own share, down to the last row's own share.
        assert table[cumulative].iloc[0] == pytest.approx(100.0)
        steps = table[cumulative].diff(-1).iloc[:-1]
        assert steps.tolist() == pytest.approx(table[share].iloc[:-1].tolist())
        assert table[cumulative].iloc[-1] == pytest.approx(table[share].iloc[-1])


@pytest.mark.torch
def test_a_limit_keeps_the_shares_of_the_whole(cnn_run: Path) -> None:
    run = dlprof.load(cnn_run)
    whole, cut = op_view(run), op_view(run, limit=3)
    assert len(cut) == 3
    pd.testing.assert_frame_equal(cut, whole.head(3))


@pytest.mark.torch
def test_sorting_by_device_time_needs_device_activity(cnn_run: Path) -> None:
    with pytest.raises(ValueError, match="no device activity"):
        op_view(dlprof.load(cnn_run), by=SortKey.DEVICE)


def test_recorded_types_group_ops_and_nested_ops_are_not_counted_twice(tmp_path: Path) -> None:
    # Two MatMul ops under different names (as TensorFlow names them by scope), an op nested in
    # another, allocations by an op and by a non-op slice inside an op.
    run = write_rows_run(tmp_path, [
        op(1, "dense/MatMul", 0, 100, op_type="MatMul"),
        op(2, "dense_1/MatMul", 200, 50, op_type="MatMul"),
        op(3, "aten::linear", 300, 100),
        op(4, "aten::addmm", 320, 60),
        op(5, "helper", 330, 10, kind="python"),
        op(6, "aten::linear", 500, 40),
    ], memory=[allocation(2, 64, 210), allocation(5, 128, 335), allocation(5, -128, 336),
               allocation(3, 32, 301)])
    table = op_view(run).set_index("name")
    assert table.loc["MatMul", ["occurrence", "total_ns", "bytes"]].tolist() == [2, 150, 64]
    assert table.loc["aten::linear", ["occurrence", "cpu_ns", "bytes"]].tolist() == [2, 40 + 40, 32]
    # The python slice inside aten::addmm is not an op: its time and allocation are addmm's.
    assert table.loc["aten::addmm", ["cpu_ns", "bytes"]].tolist() == [60, 128]
    assert list(table.index) == ["MatMul", "aten::linear", "aten::addmm"]
    # top() groups by the same type.
    grouped = top(run, group_by=GroupKey.TYPE).set_index("name")
    assert grouped.loc["MatMul", "calls"] == 2 and grouped.loc["aten::linear", "total_ns"] == 140


def test_one_rank_of_two(two_rank_run: Path) -> None:
    run = dlprof.load(two_rank_run)
    both, first = op_view(run).set_index("name"), op_view(run, rank=0).set_index("name")
    for column in ("occurrence", "total_ns", "device_ns", "cpu_ns"):
        assert (both[column] == 2 * first.loc[both.index, column]).all()


@pytest.mark.tf
def test_op_view_of_a_real_tensorflow_profile(tf_profile: Path, tmp_path: Path) -> None:
    run = imported_tensorflow_run(tf_profile, tmp_path / "tf")
    table = op_view(run)
    assert_matches(table, expected_by_type(run))
    # Types, not names: a Keras Dense layer's ops are named by scope but grouped as MatMul.
    ops = run.slices[run.slices["kind"] == Kind.OP]
    matmuls = ops[ops["op_type"] == "MatMul"]
    assert matmuls["name"].nunique() > 1
    assert table.set_index("name").at["MatMul", "occurrence"] == len(matmuls)

