"""The in-code API: profile(), region() as context manager and decorator, steps, failures."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest

import dlprof
from dlprof.keys import RunStatus
from tests.conftest import blind_counters, needs_counters


def test_regions_nest_as_context_managers_and_decorators(tmp_path: Path) -> None:
    @dlprof.region("recurse")
    def recurse(depth: int) -> None:
        if depth:
            recurse(depth - 1)

    with dlprof.profile(out=tmp_path / "run", collectors=("host",)) as prof:
        with dlprof.region("outer"):
            with dlprof.region("inner"):
                recurse(2)
        prof.step()
    slices = dlprof.load(tmp_path / "run").slices.set_index("id")
    names = slices["name"]
    assert (names == "recurse").sum() == 3
    deepest = slices[names == "recurse"].sort_values("depth").iloc[-1]
    chain = []
    parent = deepest["parent_id"]
    while not pd.isna(parent):
        chain.append(slices.loc[parent, "name"])
        parent = slices.loc[parent, "parent_id"]
    assert chain == ["recurse", "recurse", "inner", "outer", "ProfilerStep#0"]


def test_regions_in_threads_land_on_their_own_thread(tmp_path: Path) -> None:
    def work() -> None:
        with dlprof.region("in-thread"):
            sum(range(10000))

    with dlprof.profile(out=tmp_path / "run", collectors=("host",)):
        threads = [threading.Thread(target=work) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    slices = dlprof.load(tmp_path / "run").slices
    mine = slices[slices["name"] == "in-thread"]
    assert len(mine) == 3 and mine["tid"].nunique() == 3
    assert (mine["depth"] == 0).all()


def test_region_without_session_is_harmless() -> None:
    with dlprof.region("nothing"):
        pass
    dlprof.step()
    with pytest.raises(ValueError):
        dlprof.region("")


def test_exception_inside_profile_saves_failed_run_and_propagates(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with dlprof.profile(out=tmp_path / "run", collectors=("host",)):
            with dlprof.region("kept"):
                raise RuntimeError("boom")
    run = dlprof.load(tmp_path / "run")
    assert run.status is RunStatus.FAILED and "boom" in run.manifest.error
    assert "kept" in set(run.slices["name"])


def test_keyboard_interrupt_marks_run_interrupted(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt):
        with dlprof.profile(out=tmp_path / "run", collectors=("host",)):
            raise KeyboardInterrupt
    assert dlprof.load(tmp_path / "run").status is RunStatus.INTERRUPTED


def test_only_one_session_at_a_time(tmp_path: Path) -> None:
    with dlprof.profile(out=tmp_path / "a", collectors=("host",)):
        with pytest.raises(RuntimeError, match="already active"):
            dlprof.profile(out=tmp_path / "b", collectors=("host",)).start()


def test_unavailable_collector_is_noted_and_run_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dlprof.collectors.host import HostCollector

    monkeypatch.setattr(HostCollector, "available", classmethod(lambda cls: (False, "no host here")))
    with dlprof.profile(out=tmp_path / "run", collectors=("host",)):
        with dlprof.region("still-recorded"):
            pass
    run = dlprof.load(tmp_path / "run")
    (info,) = run.manifest.collectors
    assert not info.active and info.notes == ["no host here"]
    assert "still-recorded" in set(run.slices["name"])


def test_schedule_string_is_validated() -> None:
    from dlprof.schedule import Action, Schedule, ScheduleError

    with pytest.raises(ScheduleError):
        Schedule.parse("1,2,x")
    schedule = Schedule.parse("1,1,1,2,1")
    assert [schedule.action(i) for i in range(7)] == [
        Action.NONE, Action.NONE, Action.WARMUP, Action.RECORD, Action.RECORD_AND_SAVE,
        Action.NONE, Action.NONE,
    ]


def test_a_default_framework_collector_without_its_framework_is_quiet(tmp_path: Path) -> None:
    # sys.modules[name] = None makes the package look absent to importlib, as on a machine without it.
    program = (
        "import sys; sys.modules['tensorflow'] = None\n"
        "import dlprof\n"
        "with dlprof.profile(out=sys.argv[1], collectors=eval(sys.argv[2]) or None):\n"
        "    pass\n"
    )
    quiet = subprocess.run([sys.executable, "-c", program, str(tmp_path / "default"), "()"],
                           check=False, capture_output=True, text=True, timeout=120)
    assert quiet.returncode == 0 and "tensorflow" not in quiet.stderr
    info = next(c for c in dlprof.load(tmp_path / "default").manifest.collectors if c.name == "tensorflow")
    assert not info.active and "not installed" in info.notes[0]
    asked = subprocess.run([sys.executable, "-c", program, str(tmp_path / "asked"), "('tensorflow',)"],
                           check=False, capture_output=True, text=True, timeout=120)
    assert "collector tensorflow unavailable: tensorflow is not installed" in asked.stderr


def test_a_run_whose_compaction_fails_is_still_closed(tmp_path: Path) -> None:
    with dlprof.profile(out=tmp_path / "run", collectors=()) as prof:
        with dlprof.region("work"):
            pass
        prof.step()
        # A damaged chunk (a full disk, say) makes merging the chunks fail at the end.
        chunk = tmp_path / "run" / "slices" / "rank=0" / "chunk-damaged-000000.parquet"
        chunk.parent.mkdir(parents=True, exist_ok=True)
        chunk.write_bytes(b"not parquet")
    manifest = dlprof.load(tmp_path / "run").manifest
    assert manifest.status is RunStatus.COMPLETE
    assert manifest.notes and manifest.notes[0].startswith("making the saves final failed")


@pytest.mark.torch
def test_a_program_that_ends_its_steps_itself_takes_them_over_from_the_optimizer(tmp_path: Path) -> None:
    """Under `dlprof run` each optimizer.step() ends a step, until the program calls
    dlprof.step() itself: then its calls alone end steps, and no step is counted twice."""
    import textwrap

    from dlprof.config import ProfileConfig
    from dlprof.recording.runner import Target, run_target

    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch, dlprof
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(6):
            model(torch.ones(2, 4)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            dlprof.step()
        with torch.no_grad():
            model(torch.ones(2, 4))
    """))
    config = ProfileConfig(out=tmp_path / "run", name="train", collectors=("host", "layers"), auto_steps=True)
    outcome = run_target(Target(str(script), is_module=False), config)
    run = dlprof.load(outcome.run_dir)
    steps = run.slices[run.slices["kind"] == "step"].sort_values("start_ns")
    # Six iterations, then the step open at stop (the evaluation after the loop).
    assert list(steps["name"]) == [f"ProfilerStep#{n}" for n in range(7)]
    forwards = run.slices[run.slices["name"] == "Linear (Linear) forward"]
    assert len(forwards) == 7
    for _, step in steps.iterrows():
        inside = forwards[(forwards["start_ns"] >= step["start_ns"])
                          & (forwards["start_ns"] < step["start_ns"] + step["dur_ns"])]
        assert len(inside) == 1, f"{step['name']} holds one iteration's forward"


@pytest.mark.parametrize("blinded_at", ["enter", "exit"])
def test_a_region_whose_counters_cannot_be_read_stops_the_recording_not_the_block(
        blinded_at: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before, the failed counter reading was raised from the program's with statement (and,
    had the block got through, from the session's end as well)."""
    needs_counters()
    ran = []
    with dlprof.profile(out=tmp_path / "run", collectors=["host"], counters=["task-clock"]) as prof:
        with dlprof.region("before"):
            pass
        prof.step()
        if blinded_at == "enter":
            blind_counters()
        with dlprof.region("blind"):
            if blinded_at == "exit":
                blind_counters()
            ran.append("the block")
        ran.append("after it")
    assert ran == ["the block", "after it"]
    run = dlprof.load(tmp_path / "run")
    (reason,) = run.manifest.degraded
    assert re.fullmatch(r"recording failed \(error: unpack requires a buffer of \d+ bytes\) after step 1: "
                        r"recording stopped", reason), reason
    err = capsys.readouterr().err
    (line,) = err.splitlines()
    assert line.startswith(f"dlprof: {reason}; the program goes on"), err
    assert run.status is RunStatus.DEGRADED
    regions = run.slices[run.slices["kind"] == "region"]["name"].tolist()
    assert "before" in regions, "what was recorded before the failure is saved, though no save had come yet"


def test_a_profiled_program_is_told_of_no_file_dlprof_left_open(tmp_path: Path) -> None:
    """A program run with ResourceWarning shown (python -X dev, a test suite) sees none of
    dlprof's: the finisher's pipes are closed, whichever child they came from."""
    pytest.importorskip("torch", reason="needs PyTorch (pip install 'dlprof[torch]')")
    program = (
        "import torch, dlprof\n"
        "model = torch.nn.Linear(8, 8)\n"
        f"with dlprof.profile(out={str(tmp_path / 'run')!r}) as prof:\n"
        "    for _ in range(3):\n"
        "        model(torch.randn(2, 8)).sum().backward()\n"
        "        prof.step()\n"
    )
    done = subprocess.run([sys.executable, "-W", "always::ResourceWarning", "-c", program],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert "ResourceWarning" not in done.stderr, done.stderr
    assert dlprof.load(tmp_path / "run").manifest.saving["saves"] >= 1, "a save was made, through the finisher"
