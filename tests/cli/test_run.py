"""``dlprof run`` as a user runs it: a real subprocess, real scripts, real signals."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import dlprof
from dlprof.keys import RunStatus

DLPROF = [sys.executable, "-m", "dlprof"]


def dlprof_run(tmp_path: Path, *args: str, collectors: str = "host", **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DLPROF, "run", "-o", str(tmp_path / "run"), "--collectors", collectors, *args],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False, **kwargs)  # type: ignore[call-overload]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_script_runs_as_main_with_argv_and_path0(tmp_path: Path) -> None:
    script = write(tmp_path / "scripts" / "show.py", (
        "import json, sys\n"
        "import dlprof\n"
        "with dlprof.region('work'):\n"
        "    sum(range(1000))\n"
        "if __name__ == '__main__':\n"
        "    json.dump({'argv': sys.argv, 'path0': sys.path[0]}, open('seen.json', 'w'))\n"
    ))
    done = dlprof_run(tmp_path, str(script), "--flag", "value", "-x")
    assert done.returncode == 0, done.stderr
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["argv"] == [str(script), "--flag", "value", "-x"]
    assert seen["path0"] == str(script.parent)
    run = dlprof.load(tmp_path / "run")
    assert run.status is RunStatus.COMPLETE
    assert "work" in set(run.slices["name"])
    assert str(tmp_path / "run") in done.stderr


def test_module_runs_as_main_with_cwd_on_path(tmp_path: Path) -> None:
    write(tmp_path / "pkg" / "__init__.py", "")
    write(tmp_path / "pkg" / "job.py", (
        "import sys\n"
        "if __name__ == '__main__':\n"
        "    open('seen.txt', 'w').write(repr((sys.argv[1:], sys.path[0])))\n"
    ))
    done = dlprof_run(tmp_path, "-m", "pkg.job", "a", "--b")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "seen.txt").read_text() == repr((["a", "--b"], str(tmp_path)))


def test_exit_code_passes_through(tmp_path: Path) -> None:
    script = write(tmp_path / "exit3.py", "import sys\nsys.exit(3)\n")
    done = dlprof_run(tmp_path, str(script))
    assert done.returncode == 3
    manifest = dlprof.load(tmp_path / "run").manifest
    assert manifest.exit_code == 3 and manifest.status is RunStatus.FAILED


def test_failing_script_shows_its_traceback_and_saves_a_failed_run(tmp_path: Path) -> None:
    script = write(tmp_path / "boom.py", (
        "import dlprof\n"
        "def inner():\n"
        "    raise ValueError('bad batch')\n"
        "with dlprof.region('before-failure'):\n"
        "    pass\n"
        "inner()\n"
    ))
    done = dlprof_run(tmp_path, str(script))
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr
    assert 'boom.py", line 6' in done.stderr and "ValueError: bad batch" in done.stderr
    assert "runner.py" not in done.stderr and "runpy" not in done.stderr
    run = dlprof.load(tmp_path / "run")
    assert run.status is RunStatus.FAILED and "bad batch" in run.manifest.error
    assert "before-failure" in set(run.slices["name"])


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_saves_an_interrupted_run_and_exits_with_the_signal(tmp_path: Path, signum: int) -> None:
    script = write(tmp_path / "sleepy.py", (
        "import time, dlprof\n"
        "with dlprof.region('started'):\n"
        "    pass\n"
        "open('ready', 'w').close()\n"
        "with dlprof.region('waiting'):\n"
        "    time.sleep(60)\n"
    ))
    process = subprocess.Popen([*DLPROF, "run", "-o", str(tmp_path / "run"), "--collectors", "host", str(script)],
                               cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "ready").exists():
        assert time.monotonic() < deadline and process.poll() is None, process.communicate()
        time.sleep(0.05)
    sent = time.monotonic()
    process.send_signal(signum)
    process.communicate(timeout=30)
    assert time.monotonic() - sent < 10, "saving an interrupted run must be quick"
    assert process.returncode == -signum
    run = dlprof.load(tmp_path / "run")
    assert run.status is RunStatus.INTERRUPTED
    assert {"started", "waiting"} <= set(run.slices["name"])


@pytest.mark.slow
@pytest.mark.torch
def test_torch_script_prints_top_ops_and_steps_come_from_optimizer(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="needs PyTorch")
    script = write(tmp_path / "train.py", (
        "import torch\n"
        "model = torch.nn.Linear(8, 2)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(5):\n"
        "    model(torch.randn(4, 8)).sum().backward()\n"
        "    opt.step(); opt.zero_grad()\n"
    ))
    done = dlprof_run(tmp_path, str(script), collectors="torch,layers,host")
    assert done.returncode == 0, done.stderr
    assert "top op by total" in done.stdout and "aten::linear" in done.stdout
    assert "USDT:" not in done.stderr, "Kineto's start/stop chatter is kept off the user's terminal"
    slices = dlprof.load(tmp_path / "run").slices
    steps = sorted(slices.loc[slices["kind"] == "step", "name"], key=lambda n: int(n.split("#")[1]))
    assert steps[:5] == [f"ProfilerStep#{i}" for i in range(5)]
    optimizer = slices[slices["name"].str.startswith("Optimizer.step#")]
    step_rows = slices[slices["kind"] == "step"].set_index("id")
    # Each optimizer step lies inside one step, not across a boundary; but the first call ends
    # its step from a post-hook, inside its own range: where a save cut the run there, the range
    # was split at the cut, a moment after the boundary.
    first_end = step_rows["start_ns"].min() + step_rows.sort_values("start_ns")["dur_ns"].iloc[0]
    for _, row in optimizer[optimizer["start_ns"] >= first_end].iterrows():
        containing = step_rows[(step_rows["start_ns"] <= row["start_ns"]) &
                               (step_rows["start_ns"] + step_rows["dur_ns"] >= row["start_ns"] + row["dur_ns"])]
        assert len(containing) == 1


def test_default_run_directory_is_under_dlprof_runs(tmp_path: Path) -> None:
    script = write(tmp_path / "quick.py", "x = 1\n")
    done = subprocess.run([*DLPROF, "run", "--collectors", "host", str(script)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    (run_dir,) = (tmp_path / "dlprof-runs").iterdir()
    assert run_dir.name.endswith("-quick") and len(run_dir.name.split("-")[0]) == 8


def test_an_existing_run_is_refused_unless_forced(tmp_path: Path) -> None:
    script = write(tmp_path / "regions.py", (
        "import sys, dlprof\n"
        "for _ in range(int(sys.argv[1])):\n"
        "    with dlprof.region('work'):\n"
        "        pass\n"
    ))
    assert dlprof_run(tmp_path, str(script), "5").returncode == 0
    before = dlprof.load(tmp_path / "run").slices
    refused = dlprof_run(tmp_path, str(script), "1")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        f"dlprof: error: {tmp_path / 'run'}: already holds a run; pass --force to replace it, "
        "or choose another run directory"]
    assert len(dlprof.load(tmp_path / "run").slices) == len(before), "the old run is untouched"
    forced = dlprof_run(tmp_path, "--force", str(script), "1")
    assert forced.returncode == 0, forced.stderr
    names = list(dlprof.load(tmp_path / "run").slices["name"])
    assert names.count("work") == 1, "the old run was replaced, not mixed with the new"


def test_a_directory_of_other_files_is_refused_even_forced(tmp_path: Path) -> None:
    write(tmp_path / "run" / "notes.txt", "mine")
    script = write(tmp_path / "quick.py", "x = 1\n")
    done = dlprof_run(tmp_path, "--force", str(script))
    assert done.returncode == 2 and "not empty and not a dlprof run" in done.stderr
    assert (tmp_path / "run" / "notes.txt").read_text() == "mine"


def test_profile_refuses_an_existing_run_unless_forced(tmp_path: Path) -> None:
    from dlprof.store.new_run import RunExistsError

    with dlprof.profile(out=tmp_path / "run", collectors=("host",)):
        with dlprof.region("old"):
            pass
    with pytest.raises(RunExistsError, match="pass force=True"):
        dlprof.profile(out=tmp_path / "run", collectors=("host",))
    with dlprof.profile(out=tmp_path / "run", collectors=("host",), force=True):
        with dlprof.region("new"):
            pass
    assert set(dlprof.load(tmp_path / "run").slices["name"]) & {"old", "new"} == {"new"}


def test_module_in_the_working_directory_runs_from_the_dlprof_script(tmp_path: Path) -> None:
    # The installed script puts its own directory first on sys.path, not the working directory:
    # the module must still be found there, as python -m finds it.
    from tests.conftest import dlprof_program

    write(tmp_path / "localpkg" / "__init__.py", "")
    write(tmp_path / "localpkg" / "job.py", "open('ran.txt', 'w').write('yes')\n")
    done = subprocess.run([*dlprof_program(), "run", "-o", str(tmp_path / "run"), "--collectors", "host",
                           "-m", "localpkg.job"], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "ran.txt").read_text() == "yes"


@pytest.mark.slow
@pytest.mark.torch
def test_the_saving_display_is_not_counted_as_a_thread_of_the_program(tmp_path: Path) -> None:
    """The spinner shown while the run is saved refreshes from a thread of dlprof's own; the
    torch collector, which notes the threads the program starts, must not count it."""
    pytest.importorskip("torch", reason="needs PyTorch")
    script = write(tmp_path / "train.py", "import torch\nprint(torch.ones(2).sum().item())\n")
    done = dlprof_run(tmp_path, str(script), collectors="torch")
    assert done.returncode == 0, done.stderr
    [torch_info] = [c for c in dlprof.load(tmp_path / "run").manifest.collectors if c.name == "torch"]
    assert not [note for note in torch_info.notes if "other Python thread" in note], torch_info.notes
