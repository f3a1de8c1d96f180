"""Top tables: aggregation, percentages, sorting, grouping, device time by launcher."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

import dlprof
from dlprof.analysis.aggregate import top
from dlprof.keys import GroupKey, SortKey, StoreTable
from dlprof.store.manifest import Manifest
from dlprof.store.writer import RankWriter
from tests.builders import op


def make_run(directory: Path, rows: list[dict[str, object]]) -> dlprof.Run:
    Manifest(name="t", command=["t"]).write(directory)
    columns = {key: [row.get(key) for row in rows] for key in rows[0]}
    table = pa.table(columns)
    for name in ("kind", "name", "device"):
        if name in table.column_names:
            table = table.set_column(table.schema.get_field_index(name), name, table.column(name).dictionary_encode())
    writer = RankWriter(directory, 0)
    writer.write_chunk(StoreTable.SLICES, table, "test")
    writer.compact()
    return dlprof.load(directory)


def test_totals_self_time_and_percentages(tmp_path: Path) -> None:
    run = make_run(tmp_path, [
        op(1, "outer", 0, 100), op(2, "inner", 10, 30, flops=5), op(3, "inner", 50, 20, flops=7),
        op(4, "outer", 200, 50),
    ])
    table = top(run, by=SortKey.MICROS).set_index("name")
    assert table.loc["outer", "calls"] == 2 and table.loc["outer", "total_ns"] == 150
    assert table.loc["outer", "self_ns"] == 100 and table.loc["inner", "self_ns"] == 50
    assert table.loc["inner", "flops"] == 12
    assert table.loc["outer", "avg_ns"] == 75 and table.loc["inner", "max_ns"] == 30
    assert table["self_pct"].sum() == pytest.approx(100.0)
    assert list(table.index) == ["outer", "inner"]
    by_self = top(run, by=SortKey.CALLS)
    assert by_self["cum_pct"].is_monotonic_increasing and by_self["cum_pct"].iloc[-1] == pytest.approx(100.0)


def test_group_by_shape_splits_rows(tmp_path: Path) -> None:
    run = make_run(tmp_path, [
        op(1, "mm", 0, 10, input_shapes="[[2,2]]"), op(2, "mm", 20, 10, input_shapes="[[4,4]]"),
        op(3, "mm", 40, 30, input_shapes="[[4,4]]"),
    ])
    table = top(run, group_by=GroupKey.SHAPE)
    assert table[["input_shapes", "calls", "total_ns"]].values.tolist() == [["[[4,4]]", 2, 40], ["[[2,2]]", 1, 10]]


def test_device_time_is_attributed_to_the_launching_op(tmp_path: Path) -> None:
    run = make_run(tmp_path, [
        op(1, "aten::mm", 0, 100),
        op(2, "cudaLaunchKernel", 10, 5, kind="runtime", correlation_id=77),
        op(3, "gemm_kernel", 40, 300, tid=7, kind="kernel", device="cuda:0", correlation_id=77),
    ])
    ops = top(run).set_index("name")
    assert ops.loc["aten::mm", "device_ns"] == 300
    kernels = top(run, kind="kernel", by=SortKey.DEVICE)
    assert kernels["device_ns"].tolist() == [300]


def test_top_cli_json_matches_analysis(cnn_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dlprof.cli.main import main

    assert main(["top", str(cnn_run), "--kind", "module", "--by", "self", "--format", "json", "-n", "5"]) == 0
    rows = json.loads(capsys.readouterr().out)
    expected = top(dlprof.load(cnn_run), kind="module", by=SortKey.SELF, limit=5)
    assert [r["name"] for r in rows] == expected["name"].tolist()
    assert [r["self_ns"] for r in rows] == expected["self_ns"].tolist()


def test_top_cli_table_and_csv(cnn_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dlprof.cli.main import main

    assert main(["top", str(cnn_run), "--by", "flops", "-n", "3"]) == 0
    out = capsys.readouterr().out
    assert "aten::conv2d" in out and "FLOPs" in out and "Self %" in out
    assert main(["top", str(cnn_run), "--kind", "region", "--format", "csv"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("name,calls,total_ns,self_ns")
    assert {line.split(",")[0] for line in lines[1:]} == {"train_step", "forward"}


def test_kernels_group_under_their_launching_op(tmp_path: Path) -> None:
    run = make_run(tmp_path, [
        op(1, "aten::mm", 0, 100), op(2, "cudaLaunchKernel", 10, 5, kind="runtime", correlation_id=1),
        op(3, "aten::add", 200, 50), op(4, "cudaLaunchKernel", 210, 5, kind="runtime", correlation_id=2),
        op(5, "gemm", 40, 300, tid=7, kind="kernel", device="cuda:0", correlation_id=1),
        op(6, "gemm", 400, 100, tid=7, kind="kernel", device="cuda:0", correlation_id=2),
        op(7, "orphan", 600, 10, tid=7, kind="kernel", device="cuda:0", correlation_id=99),
    ])
    table = top(run, kind="kernel", group_by=GroupKey.OP).set_index("name")
    assert table.loc["aten::mm", "total_ns"] == 300 and table.loc["aten::add", "total_ns"] == 100
    assert table.loc["(no launching op)", "calls"] == 1


def test_names_that_look_like_markup_print_as_written(tmp_path: Path) -> None:
    import io

    from dlprof.viewers.terminal import render_table

    run = make_run(tmp_path, [op(1, "[/]", 0, 10), op(2, "[red]danger[/red]", 20, 10)])
    out = io.StringIO()
    render_table(top(run), "t [bold]", out)
    text = out.getvalue()
    assert "[/]" in text and "[red]danger[/red]" in text and "t [bold]" in text


@pytest.mark.torch
def test_a_layers_self_time_is_its_time_outside_the_layers_inside_it(cnn_run: Path) -> None:
    """Not the time between its ops (hooks and Python): the ops it runs itself count as its own."""
    from tests.references import Walk

    run = dlprof.load(cnn_run)
    walk = Walk(run)
    inner: dict[str, int] = {}
    total: dict[str, int] = {}
    for slice_id, row in walk.rows.items():
        if row["kind"] != "module":
            continue
        total[row["name"]] = total.get(row["name"], 0) + int(row["dur_ns"])
        outer = walk.enclosing(slice_id, "module")
        if outer is not None:
            name = walk.rows[outer]["name"]
            inner[name] = inner.get(name, 0) + int(row["dur_ns"])
    expected = {name: total[name] - inner.get(name, 0) for name in total}
    table = top(run, kind="module", by=SortKey.SELF, limit=None).set_index("name")
    assert table["self_ns"].to_dict() == expected
    container = "Sequential (Sequential) forward"
    assert inner[container] > 0 and table.loc[container, "self_ns"] < table.loc[container, "total_ns"]
    # A leaf layer's self time is all of its time; --leaves keeps only those.
    leaves = top(run, kind="module", limit=None, leaves=True)
    assert set(leaves["name"]) == {name for name in total if name not in inner}
    assert (leaves["self_ns"] == leaves["total_ns"]).all()


@pytest.mark.torch
def test_within_keeps_the_slices_inside_a_named_slice(cnn_run: Path) -> None:
    from tests.references import Walk

    run = dlprof.load(cnn_run)
    walk = Walk(run)
    inside = [i for i, row in walk.rows.items() if row["kind"] == "op"
              and any(walk.rows[a]["name"] == "forward" for a in walk.ancestors(i))]
    table = top(run, kind="op", limit=None, within="forward")
    assert table["calls"].sum() == len(inside) > 0
    assert table["total_ns"].sum() == sum(int(walk.rows[i]["dur_ns"]) for i in inside)
    with pytest.raises(ValueError, match="--leaves"):
        top(run, kind="op", leaves=True)


def test_within_a_name_no_slice_has_is_one_line(cnn_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dlprof.cli.main import main

    assert main(["top", str(cnn_run), "--within", "no such region"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "inside a slice named 'no such region'" in err
    assert main(["top", str(cnn_run), "--kind", "module", "--leaves", "--format", "json"]) == 0
    assert "Sequential (Sequential) forward" not in capsys.readouterr().out
