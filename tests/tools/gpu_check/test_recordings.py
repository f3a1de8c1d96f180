"""The recordings part: what it checks of a run and how it brings the files back, on the H200
recording; its programs for real on the CPU (DataLoader workers under dlprof run, the GPT-style
workload under bare torch.profiler)."""

from __future__ import annotations

import shutil
import tarfile
import time
from pathlib import Path

import pytest

import dlprof
from tools.gpu_check.checks import recordings
from tools.gpu_check.checks.harness import Check, StepFailed
from tools.gpu_check.checks.recordings import Plan, Recording, cnn_workers, gpt_bare, record
from tools.gpu_check.report import Status
from tools.gpu_check.workloads import OWN_GPT, Workload

H200_RUN = Path(__file__).resolve().parents[2] / "data" / "h200" / "gpt2-dlprof-run"
TINY_GPT = ("--device", "cpu", "--vocab", "128", "--width", "32", "--heads", "2", "--seq", "16", "--layers", "1",
            "--batch", "2")


def _check(tmp_path: Path, seconds: float = 600) -> Check:
    (tmp_path / "work").mkdir(exist_ok=True)
    return Check(tmp_path / "work", tmp_path / "result.json", time.monotonic() + seconds, out=tmp_path / "out")


def test_the_h200_run_holds_kernels_and_no_graph_launch() -> None:
    figures = recordings._run_figures(H200_RUN)
    assert figures["status"] == "complete" and figures["kinds"]["kernel"] == 12472
    assert figures["graph_launches"] == 0  # not a compiled run: its recording would fail


def test_a_recording_is_packed_into_the_report_directory(tmp_path: Path) -> None:
    c = _check(tmp_path)
    (tmp_path / "out").mkdir()
    copied = shutil.copytree(H200_RUN, c.work / "gpt-dlprof-run")
    made = Recording("gpt-dlprof-run", 1, lambda check, plan: (copied, {"kinds": {}}))
    part = record(c, made, Plan(), tmp_path / "out")
    assert part.status is Status.PASSED and part.detail.startswith("gpt-dlprof-run.tar.gz: ")
    with tarfile.open(tmp_path / "out" / "gpt-dlprof-run.tar.gz") as archive:
        assert "gpt-dlprof-run/run.json" in archive.getnames()


def test_a_recording_is_skipped_with_its_reason(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()

    def fails(check: Check, plan: Plan) -> tuple[Path, dict[str, object]]:
        raise StepFailed("the run in x is complete", "it is failed: RuntimeError")

    late = record(_check(tmp_path, seconds=20), Recording("late", 90, fails), Plan(), out)
    assert late.status is Status.COULD_NOT_RUN and late.detail.startswith("out of time: ")
    assert late.detail.endswith("s left, about 90 s needed")
    failed = record(_check(tmp_path), Recording("broken", 1, fails), Plan(), out)
    assert failed.status is Status.FAILED and failed.detail == "the run in x is complete: it is failed: RuntimeError"
    for name in ("a", "b", "c", "d", "e"):
        (out / name).write_text("")
    full = record(_check(tmp_path), Recording("more", 1, fails), Plan(), out)
    assert full.status is Status.COULD_NOT_RUN and full.detail.startswith("no room: ")


@pytest.mark.slow
def test_the_workers_recording_holds_their_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recordings, "DEVICE", "cpu")
    monkeypatch.setattr(recordings, "CNN_STEPS", 4)
    path, figures = cnn_workers(_check(tmp_path), Plan())
    assert figures["kinds"]["dataloader"] >= 4 and figures["status"] == "complete"
    assert dlprof.load(path).manifest.saving.get("forked_children")


@pytest.mark.slow
def test_the_bare_trace_is_exported_after_the_gpt_workload_ends(tmp_path: Path) -> None:
    """The workload returns rather than exiting: bench/bare_profiler.py then writes its trace."""
    trace, figures = gpt_bare(_check(tmp_path), Plan(Workload("gpt", OWN_GPT, TINY_GPT)))
    assert trace.is_file() and figures["events"] > 100 and figures["steps"] == recordings.BARE_STEPS
