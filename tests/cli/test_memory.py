"""``dlprof memory``: its tables, JSON and CSV, the groupings and filters, and one-line errors,
in-process and as the installed program, on a real PyTorch run."""

from __future__ import annotations

import csv
import io
import json
import subprocess
from pathlib import Path

import pytest

import dlprof
from dlprof.analysis.memory import MemoryGroup, live_at_peak, memory_peaks
from dlprof.cli.main import main
from dlprof.viewers.terminal import size_unit
from tests.conftest import dlprof_program

pytestmark = pytest.mark.torch


def test_tables_for_a_person(cnn_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", str(cnn_run), "-n", "4", "--wide"]) == 0
    out = capsys.readouterr().out
    assert "peak allocated memory per device" in out and "blocks live at the peak, by op" in out
    peaks = memory_peaks(dlprof.load(cnn_run))
    peak = peaks.iloc[0]
    row = next(line for line in out.splitlines() if line.split()[:1] == ["cpu"] and peak["op"] in line)
    # One unit for the table's sizes, from the largest of them: the peak.
    scale, unit = size_unit([peak["peak_bytes"]])
    assert f"{peak['peak_bytes'] / scale:,.2f}" in row.split() and peak["step"] in row
    assert f"Peak allocated ({unit})" in out and "Rank" not in out  # one rank, one process: no such columns
    top_op = live_at_peak(dlprof.load(cnn_run), MemoryGroup.OP, limit=1).iloc[0]
    assert top_op["op"] in out
    assert "what each layer added" not in out  # only with --by layer


def test_by_layer_adds_the_layers_own_peaks(cnn_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", str(cnn_run), "--by", "layer", "--limit", "0"]) == 0
    out = capsys.readouterr().out
    assert "blocks live at the peak, by layer" in out and "what each layer added" in out
    assert "(Conv2d) forward" in out and "Added (max)" in out


def test_json_holds_every_part(cnn_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", str(cnn_run), "--by", "layer", "-f", "json", "-n", "0"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert set(document) == {"peaks", "live", "layers"}
    [peak] = document["peaks"]
    memory = dlprof.load(cnn_run).memory
    assert peak["peak_bytes"] == memory["total_allocated"].max()
    assert sum(row["bytes"] for row in document["live"]) == peak["live_bytes"]
    assert all(row["added_bytes"] <= row["high_bytes"] for row in document["layers"])


def test_csv_rows_carry_their_devices_peak(cnn_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", str(cnn_run), "--by", "category", "--format", "csv", "--device", "cpu"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert rows and {"category", "basis", "bytes", "peak_bytes", "untraced_bytes"} <= set(rows[0])
    peak = int(rows[0]["peak_bytes"])
    assert sum(int(r["bytes"]) for r in rows) + int(rows[0]["untraced_bytes"]) == peak


def test_the_installed_program(cnn_run: Path) -> None:
    done = subprocess.run([*dlprof_program(), "memory", str(cnn_run), "--rank", "0", "-f", "json"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["peaks"][0]["device"] == "cpu"


def test_help_has_examples(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", "--help"]) == 0
    out = capsys.readouterr().out
    assert "Examples:" in out and "dlprof memory RUN --by layer" in out


@pytest.mark.parametrize(("args", "message"), [
    (["--device", "cuda:3"], "no allocations on device 'cuda:3'; devices with allocations: cpu"),
    (["--rank", "4"], "no rank 4"),
])
def test_bad_input_is_one_line(cnn_run: Path, args: list[str], message: str,
                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", str(cnn_run), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dlprof: error: ") and message in err and err.count("\n") == 1


def test_a_run_without_allocations(gpu_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", str(gpu_run)]) == 2
    assert "no allocations recorded" in capsys.readouterr().err
