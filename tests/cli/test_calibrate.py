"""``dlprof calibrate``: a real quick calibration of this CPU, stored, read back, and used by
``dlprof roofline`` and ``dlprof estimate``; where it is kept; what it refuses."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import socket
from pathlib import Path

import pytest

from dlprof.cli.main import main
from dlprof.hardware.calibration import (
    CALIBRATION_VARIABLE,
    Calibration,
    Measurement,
    OpClass,
    calibration_path,
    calibrations_text,
    parse_calibrations,
    read_calibrations,
    replaced,
)
from dlprof.hardware.devices import Origin, Precision, Vendor
from dlprof.workloads.ert import native_formats

pytestmark = pytest.mark.torch
NAME = "test-cpu"


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A quick calibration of this CPU in a file of its own, and what the command printed as JSON."""
    pytest.importorskip("torch", reason="needs PyTorch (pip install 'dlprof[torch]')")
    path = tmp_path_factory.mktemp("config") / "calibration.json"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["calibrate", "--quick", "--device-name", NAME, "--calibration-file", str(path),
                     "--format", "json"])
    assert code == 0
    return path, printed.getvalue()


def only(path: Path) -> Calibration:
    (calibration,) = read_calibrations(path)
    return calibration


def test_stored_and_read_back_exactly(stored: tuple[Path, str]) -> None:
    path, printed = stored
    calibration = only(path)
    assert calibration.name == NAME and calibration.vendor is Vendor.CPU
    assert calibration.hostname == socket.gethostname()
    assert Precision.FP32 in calibration.peaks
    for figure in (*calibration.peaks.values(), calibration.memory_bandwidth, calibration.seconds):
        assert figure > 0 and math.isfinite(figure)
    document = json.loads(printed)
    assert document["file"] == str(path)
    assert {Precision(p): v for p, v in document["peaks"].items()} == calibration.peaks
    assert document["memory_bandwidth"] == calibration.memory_bandwidth
    assert parse_calibrations(calibrations_text([calibration])) == (calibration,)


def test_efficiency_buckets_are_kept_per_class_mode_and_decade(stored: tuple[Path, str]) -> None:
    buckets = only(stored[0]).efficiencies
    assert {b.op_class for b in buckets} == set(OpClass)
    keys = [(b.op_class, b.mode, b.decade) for b in buckets]
    assert len(keys) == len(set(keys))
    for bucket in buckets:
        assert bucket.samples >= 2 and 0 < bucket.low <= bucket.median <= bucket.high
    # The fastest GEMM call defines the fp32 peak, so no fp32 GEMM is above its roof.
    assert max(b.high for b in buckets if b.op_class is OpClass.GEMM and b.mode == "fp32") == pytest.approx(1.0)


def test_a_new_calibration_replaces_its_name_only(stored: tuple[Path, str]) -> None:
    first = only(stored[0])
    other = dataclasses.replace(first, name="other-box")
    again = dataclasses.replace(first, measured_at_ns=first.measured_at_ns + 1)
    assert replaced(replaced((first,), other), again) == (other, again)


def test_roofline_uses_the_measured_row(stored: tuple[Path, str], cnn_run: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(CALIBRATION_VARIABLE, str(stored[0]))
    calibration = only(stored[0])
    for argv in (["--device", NAME], []):  # named, and as the row of the host the run was made on
        assert main(["roofline", str(cnn_run), "--format", "json", *argv]) == 0
        captured = capsys.readouterr()
        assert f"device: {NAME} ({Origin.MEASURED}:" in captured.err
        placed = [row for row in json.loads(captured.out)
                  if row["mode"] == "fp32" and row["intensity"] and row["flop_rate"]]
        assert placed
        for row in placed:
            roof = min(calibration.peaks[Precision.FP32], calibration.memory_bandwidth * row["intensity"])
            assert row["roof_pct"] == pytest.approx(100 * row["flop_rate"] / roof)


def test_estimate_states_the_measured_efficiencies(stored: tuple[Path, str], gpu_run: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(CALIBRATION_VARIABLE, str(stored[0]))
    assert main(["estimate", str(gpu_run), "--device", NAME, "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["target"] == NAME
    assert any(line.startswith("measured efficiencies (dlprof calibrate)") for line in document["assumptions"])
    assert main(["estimate", str(gpu_run), "--device", "v100", "--format", "json"]) == 0
    assert not any("measured efficiencies" in line for line in json.loads(capsys.readouterr().out)["assumptions"])


def test_a_symlinked_calibration_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_text("kept")
    link = tmp_path / "calibration.json"
    link.symlink_to(target)
    assert main(["calibrate", "--quick", "--calibration-file", str(link)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("dlprof: error: ") and "symbolic link" in error and "\n" not in error
    assert target.read_text() == "kept" and link.is_symlink()


def test_a_damaged_calibration_file_fails_in_one_line(tmp_path: Path, cnn_run: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    damaged = tmp_path / "calibration.json"
    damaged.write_text('{"version": 1, "calibrations": [{"name": 3}]}')
    monkeypatch.setenv(CALIBRATION_VARIABLE, str(damaged))
    assert main(["roofline", str(cnn_run)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"dlprof: error: {damaged}: not a dlprof calibration") and "\n" not in error


def test_cuda_is_refused_in_one_line_without_a_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch", reason="needs PyTorch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the refusal cannot be seen")
    assert main(["calibrate", "--device-type", "cuda", "--calibration-file", str(tmp_path / "c.json")]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("dlprof: error: --device-type cuda: no CUDA device") and "\n" not in error
    assert not (tmp_path / "c.json").exists()


def test_where_calibrations_are_kept(tmp_path: Path) -> None:
    assert calibration_path({CALIBRATION_VARIABLE: str(tmp_path / "mine.json"), "XDG_CONFIG_HOME": "/x"}) == (
        tmp_path / "mine.json")
    assert calibration_path({"XDG_CONFIG_HOME": str(tmp_path)}) == tmp_path / "dlprof" / "calibration.json"
    assert calibration_path({}) == Path.home() / ".config" / "dlprof" / "calibration.json"


def test_a_format_slower_than_fp32_is_left_out_of_the_row() -> None:
    # bf16 emulated (or timed only at tiny sizes) would be a roof below fp32's: a wrong one.
    calls = [Measurement(OpClass.GEMM, precision, False, 1e9, 1e6, seconds)
             for precision, seconds in ((Precision.FP32, 0.01), (Precision.BF16, 0.5), (Precision.FP16, 0.004))]
    peaks = {c.precision: c.flops / c.seconds for c in calls}
    kept, measurements, left_out = native_formats(peaks, calls)
    assert set(kept) == {Precision.FP32, Precision.FP16} and set(left_out) == {Precision.BF16}
    assert "below fp32's 100 GFLOP/s" in left_out[Precision.BF16]
    assert {c.precision for c in measurements} == {Precision.FP32, Precision.FP16}
