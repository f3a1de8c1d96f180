"""``dlprof sweep``: a real quick grid of PyTorch models on this CPU, a run per point, the summary
checked against torch's own FLOP counter, the plot, and what the command refuses."""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path
from xml.etree import ElementTree

import pandas as pd
import pytest

from dlprof.cli.main import main
from dlprof.store.manifest import MANIFEST_NAME

pytestmark = pytest.mark.torch
TINY = ["--family", "fc", "--layers", "1", "--width", "4", "--batch", "2", "--input", "4", "--steps", "1"]


def _run(args: list[str]) -> tuple[int, str]:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(args)
    return code, printed.getvalue()


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, object]]]:
    """The quick grid, written to a directory of its own, and the summary it printed as JSON."""
    pytest.importorskip("torch", reason="needs PyTorch (pip install 'dlprof[torch]')")
    out = tmp_path_factory.mktemp("sweeps") / "quick"
    code, printed = _run(["sweep", "--quick", "-o", str(out), "--format", "json"])
    assert code == 0
    return out, json.loads(printed)


@pytest.mark.slow  # the quick grid: about 20 s on two cores, once for these tests
def test_a_run_per_point_and_the_summary_files(quick: tuple[Path, list[dict[str, object]]]) -> None:
    out, rows = quick
    assert {(r["family"], r["width"]) for r in rows} == {(f, w) for f in ("fc", "cnn", "rnn") for w in (16, 32)}
    for row in rows:
        name = f"{row['family']}-l{row['layers']}-w{row['width']}-b{row['batch']}-i{row['input']}"
        assert row["run"] == name and (out / name / MANIFEST_NAME).is_file()
        assert row["steps"] == 3 and row["params"] > 0
    stored = json.loads((out / "summary.json").read_text())
    assert stored["models"] == rows and stored["device"]
    table = pd.read_csv(out / "summary.csv")
    assert list(table["run"]) == [r["run"] for r in rows]
    assert table["flops"].tolist() == pytest.approx([r["flops"] for r in rows])


@pytest.mark.slow  # the quick grid: about 20 s on two cores, once for these tests
def test_fc_flops_per_step_match_torch_flop_counter(quick: tuple[Path, list[dict[str, object]]]) -> None:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from dlprof.workloads.paradnn import Family, Point, workload

    _, rows = quick
    for row in (r for r in rows if r["family"] == "fc"):
        point = Point(Family.FC, int(row["layers"]), int(row["width"]), int(row["batch"]), int(row["input"]))
        work = workload(point, torch.device("cpu"))
        with FlopCounterMode(display=False) as counter:
            torch.nn.functional.cross_entropy(work.model(work.inputs), work.labels).backward()
        expected = counter.get_total_flops()
        assert float(row["flops"]) == pytest.approx(expected, rel=0.05), row["run"]


@pytest.mark.slow  # the quick grid: about 20 s on two cores, once for these tests
def test_intensity_and_achieved_rate_follow_from_flops_bytes_and_time(
        quick: tuple[Path, list[dict[str, object]]]) -> None:
    _, rows = quick
    for row in rows:
        flops, moved, step_ns = float(row["flops"]), float(row["bytes"]), float(row["step_ns"])
        assert flops > 0 and moved > 0 and step_ns > 0, row["run"]
        assert float(row["intensity"]) == pytest.approx(flops / moved)
        assert float(row["flop_rate"]) == pytest.approx(flops / (step_ns / 1e9))
        assert float(row["gflop_rate"]) == pytest.approx(float(row["flop_rate"]) / 1e9)
        assert row["bound"] in ("memory", "compute")
        assert 0 < float(row["roof_pct"]) and math.isfinite(float(row["roof_pct"]))


@pytest.mark.slow  # the quick grid: about 20 s on two cores, once for these tests
def test_a_wider_model_does_more_flops(quick: tuple[Path, list[dict[str, object]]]) -> None:
    _, rows = quick
    for family in ("fc", "cnn", "rnn"):
        by_width = {r["width"]: float(r["flops"]) for r in rows if r["family"] == family}
        assert by_width[32] > by_width[16], family


@pytest.mark.slow  # the quick grid: about 20 s on two cores, once for these tests
def test_the_plot_is_svg_with_a_point_per_model(quick: tuple[Path, list[dict[str, object]]]) -> None:
    out, rows = quick
    root = ElementTree.parse(out / "roofline.svg").getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    points = [e for e in root.iter("{http://www.w3.org/2000/svg}circle") if e.get("data-testid") == "roofline-point"]
    assert len(points) == len(rows)
    titles = {e.findtext("{http://www.w3.org/2000/svg}title", "").split(":")[0] for e in points}
    assert titles == {r["run"] for r in rows}
    assert any(e.get("data-testid") == "roof" for e in root.iter("{http://www.w3.org/2000/svg}polyline"))


def test_csv_output_and_refusal_without_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch", reason="needs PyTorch (pip install 'dlprof[torch]')")
    out = tmp_path / "tiny"
    code, printed = _run(["sweep", *TINY, "-o", str(out), "-f", "csv"])
    assert code == 0
    table = pd.read_csv(io.StringIO(printed))
    assert list(table["run"]) == ["fc-l1-w4-b2-i4"] and table["flops"].iloc[0] > 0
    capsys.readouterr()
    code, printed = _run(["sweep", *TINY, "-o", str(out)])
    error = capsys.readouterr().err
    assert code == 2 and printed == "" and "--force" in error and len(error.strip().splitlines()) == 1
    code, _ = _run(["sweep", *TINY, "-o", str(out), "--force", "-f", "json"])
    assert code == 0 and (out / "fc-l1-w4-b2-i4" / MANIFEST_NAME).is_file()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    code, _ = _run(["sweep", *TINY, "-o", str(tmp_path / "other"), "--force"])
    assert code == 2 and (tmp_path / "other" / "notes.txt").is_file()


@pytest.mark.parametrize("option, value", [("--width", "0"), ("--layers", "-2"), ("--batch", "abc"),
                                           ("--input", "4,,8"), ("--steps", "0"), ("--family", "gru")])
def test_bad_grid_values_give_one_line(option: str, value: str, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["sweep", option, value, "-o", str(tmp_path / "never")])
    error = capsys.readouterr().err
    assert code == 2 and len(error.strip().splitlines()) == 1 and option in error
    assert not (tmp_path / "never").exists()
