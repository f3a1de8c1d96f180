"""``dlprof advise`` in-process and as a program: the findings table with each finding's details,
the skipped rules with their reasons, JSON for scripts, one-line errors; ranks of a real job."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import dlprof
from dlprof.advice.ranking import advise
from dlprof.analysis.ranks import rank_steps
from dlprof.cli.main import main
from tests.conftest import dlprof_program

pytestmark = pytest.mark.torch


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_table_lists_findings_their_details_and_the_skipped_rules(
        habits_run: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    code, out, err = run_cli(["advise", str(habits_run)], capsys)
    assert code == 0, err
    findings, _, skipped = out.partition("rules skipped")
    assert "findings, most time at stake first" in findings
    for label in ("Seen:", "Threshold:", "At stake:", "Fix:", "Source:"):
        assert label in findings
    assert "input-bound" in findings and "zero-grad-zeros" in findings
    assert "repeated-indexing" not in out  # off by default
    assert "low-utilisation" in skipped and "needs GPU activity" in skipped


def test_json_holds_findings_in_rank_order_and_skips(habits_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["advise", str(habits_run), "-f", "json", "--all"], capsys)
    assert code == 0
    document = json.loads(out)
    stakes = [f["stake_ns"] for f in document["findings"]]
    assert stakes == sorted(stakes, reverse=True)
    assert "repeated-indexing" in {f["rule"] for f in document["findings"]}
    assert all(f["evidence"] and f["threshold"] and f["source"] for f in document["findings"])
    assert {s["rule"] for s in document["skipped"]} >= {"launch-bound", "stragglers"}
    assert all(s["reason"].startswith("needs") for s in document["skipped"])


def test_rule_and_limit_choose_what_is_shown(habits_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["advise", str(habits_run), "-f", "json", "--rule", "zero-grad-zeros",
                            "--rule", "repeated-indexing"], capsys)
    assert code == 0
    assert {f["rule"] for f in json.loads(out)["findings"]} == {"zero-grad-zeros", "repeated-indexing"}
    code, out, _ = run_cli(["advise", str(habits_run), "-f", "json", "-n", "1"], capsys)
    assert len(json.loads(out)["findings"]) == 1


@pytest.mark.parametrize(("argv", "said"), [
    (["--rule", "no-such-rule"], "no rule no-such-rule; the rules are:"),
    (["--rank", "3"], "no rank 3"),
    (["--format", "csv"], "'csv' is not one of 'table', 'json'"),
])
def test_bad_input_is_one_line_and_exit_2(habits_run: Path, capsys: pytest.CaptureFixture[str],
                                          argv: list[str], said: str) -> None:
    code, out, err = run_cli(["advise", str(habits_run), *argv], capsys)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("dlprof: error:") and said in err


def test_runs_as_a_program(habits_run: Path) -> None:
    done = subprocess.run([*dlprof_program(), "advise", str(habits_run), "-f", "json", "--rule", "input-bound"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["findings"][0]["rule"] == "input-bound"


@pytest.mark.slow
def test_a_real_job_gets_the_rank_rules_and_one_rank_does_not(two_rank_gloo_run: Path) -> None:
    run = dlprof.load(two_rank_gloo_run)
    advice = advise(run)
    skipped = {s.rule for s in advice.skipped}
    assert not {"comm-not-overlapped", "stragglers"} & skipped
    late = rank_steps(run)["straggler"].astype(bool)
    assert ("stragglers" in {f.rule for f in advice.findings}) == bool(late.any())
    one_rank = {s.rule: s.reason for s in advise(run, rank=0).skipped}
    assert "needs several ranks" in one_rank["comm-not-overlapped"]
