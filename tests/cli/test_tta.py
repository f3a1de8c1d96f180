"""``dlprof tta`` as a user runs it: several MLPerf-style runs, MLPerf's score, the exit status."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlprof.cli.main import main
from dlprof.cli.tta import NOT_REACHED
from tests.analysis.mlperf_log import run_mlperf_program


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Three runs reaching 0.759 at epochs 2, 1 and 3 (198 s, 98 s, 298 s), and one never."""
    parent = tmp_path_factory.mktemp("tta")
    return [run_mlperf_program(parent, name, accuracies) for name, accuracies in (
        ("a", [0.70, 0.76, 0.77]), ("b", [0.76, 0.77, 0.78]), ("c", [0.70, 0.71, 0.76]), ("d", [0.70, 0.71, 0.72]))]


def test_json_gives_each_run_and_the_olympic_mean(runs: list[Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tta", *map(str, runs[:3]), "--target", "eval_accuracy>=0.759", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["target"] == "eval_accuracy>=0.759"
    assert [r["seconds"] for r in report["runs"]] == [198.0, 98.0, 298.0]
    assert [r["epochs"] for r in report["runs"]] == [2.0, 1.0, 3.0]
    assert [r["samples"] for r in report["runs"]] == [20 * 256, 10 * 256, 30 * 256]
    # 98 s and 298 s dropped: the mean of the one run left.
    assert report["olympic_mean"] == {"seconds": 198.0, "kept": 1, "dropped_fastest": 1, "dropped_slowest": 1,
                                      "not_reached": 0, "drop": 1}


def test_a_run_that_never_reached_the_target_exits_apart(runs: list[Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tta", *map(str, runs), "--target", "eval_accuracy>=0.759"]) == NOT_REACHED
    out = capsys.readouterr().out
    assert "no (best 0.72)" in out
    # The run that failed is the slowest dropped; 98 s the fastest: 198 and 298 are averaged.
    assert "olympic mean: 248.0 s over 2 runs (dropped 1 fastest, 0 slowest and 1 that never reached the target)" in out


@pytest.mark.parametrize(("target", "message"), [
    ("eval_accuracy=0.7", "write METRIC>=VALUE"),
    ("top5>=0.9", "no values of 'top5'; it logged: eval_accuracy, global_batch_size"),
])
def test_bad_targets_are_one_line_and_exit_2(runs: list[Path], target: str, message: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tta", str(runs[0]), "--target", target]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dlprof: error:") and message in err and len(err.strip().splitlines()) == 1
