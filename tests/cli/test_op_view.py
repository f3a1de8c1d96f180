"""``dlprof top --group-by type``: tfprof's op view printed for a person and for scripts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import dlprof
from dlprof.analysis.tfprof import op_view
from dlprof.cli.main import main
from dlprof.keys import SortKey


@pytest.mark.torch
def test_op_view_table_reads_as_tfprof(cnn_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # --wide: every measure (at 80 columns the name and the sorted measure come first).
    assert main(["top", str(cnn_run), "--by", "micros", "--group-by", "type", "-n", "5", "--wide"]) == 0
    out = capsys.readouterr().out
    assert "Requested bytes" in out and "Total exec" in out and "CPU exec" in out and "Occurrence" in out
    # A CPU-only run has no accelerator time: no column for it.
    assert "Accelerator" not in out
    first = op_view(dlprof.load(cnn_run), by=SortKey.MICROS).iloc[0]
    (line,) = [line for line in out.splitlines() if line.strip().startswith(str(first["name"]) + " ")]
    # The sorted column's first row: all of the time from here down, then its own share.
    assert f"(100.00%, {first['total_pct']:.2f}%)" in line
    assert f"{first['occurrence']} ({first['occurrence_cum_pct']:.2f}%, {first['occurrence_pct']:.2f}%)" in line


@pytest.mark.torch
def test_op_view_as_json_is_the_analysis_frame(cnn_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["top", str(cnn_run), "--by", "bytes", "--group-by", "type", "-n", "4", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    expected = op_view(dlprof.load(cnn_run), by=SortKey.BYTES, limit=4).to_dict("records")
    assert [row["name"] for row in rows] == [row["name"] for row in expected]
    for row, want in zip(rows, expected, strict=True):
        assert {key: row[key] for key in want if key != "name"} == pytest.approx(
            {key: value for key, value in want.items() if key != "name"})


def test_accelerator_time_shows_on_a_gpu_trace(gpu_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["top", str(gpu_run), "--by", "device", "--group-by", "type"]) == 0
    assert "Accelerator exec" in capsys.readouterr().out


@pytest.mark.torch
@pytest.mark.parametrize(("args", "message"), [
    (["--kind", "module"], "op view"),
    (["--by", "device"], "no device activity"),
])
def test_bad_input_is_one_line(cnn_run: Path, args: list[str], message: str,
                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["top", str(cnn_run), "--group-by", "type", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.tf
def test_both_views_of_a_tensorflow_run(keras_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A run of dlprof's TensorFlow collector: ops grouped by type, and by name scope.
    assert main(["top", str(keras_run), "--group-by", "type", "--limit", "0", "--format", "json"]) == 0
    types = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    ops = dlprof.load(keras_run).slices
    ops = ops[ops["kind"] == "op"]
    assert types["MatMul"]["occurrence"] == (ops["op_type"] == "MatMul").sum() > 0
    assert main(["tree", str(keras_run), "--min-percent", "0", "--format", "json"]) == 0
    paths = {row["path"] for row in json.loads(capsys.readouterr().out)}
    assert {scope for scope in ops["scope"].dropna().astype(str)} <= paths
