"""Each check in a process of its own: a hang, a crash or a bug loses that check only, and the
parts it found before are kept. Real processes, through a stand-in check module."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from tools.gpu_check.checks import CheckSpec
from tools.gpu_check.report import Status
from tools.gpu_check.runner import ROOT, run_check

SPEC = CheckSpec("stand_in", "a stand-in check", "tests.tools.gpu_check.stand_in_check", (), 60, ("a row",))


def run(behaviour: str, tmp_path: Path, timeout_s: float = 60) -> tuple[Status, list[tuple[str, Status]], str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GPU_CHECK_STAND_IN": behaviour,
           "GPU_CHECK_STAND_IN_PID": str(tmp_path / "grandchild.pid")}
    result = run_check(SPEC, sys.executable, tmp_path, timeout_s, env)
    assert result.name == "stand_in" and result.covers == ("a row",)
    return result.status, [(p.what, p.status) for p in result.parts], result.reason


FIRST = ("a first part", Status.PASSED)


def test_a_check_that_ends_passes_on_its_parts(tmp_path: Path) -> None:
    assert run("pass", tmp_path) == (Status.PASSED, [FIRST], "")


@pytest.mark.slow
def test_a_hanging_check_is_killed_at_its_limit_and_keeps_its_parts(tmp_path: Path) -> None:
    started = time.monotonic()
    status, parts, reason = run("hang", tmp_path, timeout_s=8)
    assert time.monotonic() - started < 30
    assert status is Status.COULD_NOT_RUN
    assert parts == [FIRST, ("the check finished in time", Status.COULD_NOT_RUN)]
    assert reason.startswith("killed after 8 s with everything it started")


@pytest.mark.parametrize(("behaviour", "status", "last", "reason"), [
    ("crash", Status.COULD_NOT_RUN, "the check ran to its end", "its process exited 7"),
    ("raise", Status.COULD_NOT_RUN, "the check ran to its end", "the check raised ValueError: a bug in the check"),
    ("cannot", Status.COULD_NOT_RUN, "a GPU is there", "none here"),
    ("step-fails", Status.FAILED, "a step that fails", "exited 3: boom"),
])
def test_a_check_cut_short_has_not_passed(tmp_path: Path, behaviour: str, status: Status, last: str,
                                          reason: str) -> None:
    got, parts, why = run(behaviour, tmp_path)
    assert got is status
    assert parts[0] == FIRST and parts[-1][0] == last
    assert why.startswith(reason)


@pytest.mark.slow
def test_a_hanging_step_is_killed_with_its_children(tmp_path: Path) -> None:
    status, parts, reason = run("step-hangs", tmp_path)
    assert status is Status.FAILED and parts[-1] == ("a step that hangs", Status.FAILED)
    assert reason.startswith("did not finish in 3 s (killed)")
    grandchild = int((tmp_path / "grandchild.pid").read_text())
    deadline = time.monotonic() + 5
    while Path(f"/proc/{grandchild}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # killed, then reaped by init
    assert not Path(f"/proc/{grandchild}").exists() or "Z" in Path(f"/proc/{grandchild}/stat").read_text().split()[2]
