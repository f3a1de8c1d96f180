"""Processes the profiled program forks: a child that ends normally never hangs the run, and
children the program starts otherwise are noted."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import dlprof

pytestmark = pytest.mark.torch

pytest.importorskip("torch", reason="needs PyTorch (pip install 'dlprof[torch]')")

# A bare os.fork() child that ends with sys.exit(0) once torch.profiler has run: its exit ran
# libkineto's static destructors, which wait on a condition variable whose waiter (Kineto's
# config thread) stayed in the parent, so the child never ended (torch 2.13, every time here).
FORKING_PROGRAM = """
import os, sys
import torch
torch.ones(3).sum()
pid = os.fork()
if pid == 0:
    torch.ones(3).sum()
    sys.exit(0)
_, status = os.waitpid(pid, 0)
print("child exited", os.waitstatus_to_exitcode(status), flush=True)
"""


def test_a_forked_child_that_exits_never_hangs_the_run(tmp_path: Path) -> None:
    script = tmp_path / "forker.py"
    script.write_text(FORKING_PROGRAM)
    done = subprocess.run([sys.executable, "-m", "dlprof", "run", "--top", "0", "-o", str(tmp_path / "run"),
                           str(script)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("child exited 0") == 1
    assert done.stderr.count("dlprof: run complete") == 1, "the child leaves, it does not finish dlprof's command"


def test_a_child_of_a_profiled_block_exits_with_its_code(tmp_path: Path) -> None:
    program = tmp_path / "block.py"
    program.write_text(textwrap.dedent("""
        import os, sys, dlprof, torch
        with dlprof.profile(out=sys.argv[1]):
            torch.ones(3).sum()
            pid = os.fork()
            if pid == 0:
                torch.ones(3).sum()
                sys.exit(3)
            _, status = os.waitpid(pid, 0)
        print("child exited", os.waitstatus_to_exitcode(status), flush=True)
    """))
    done = subprocess.run([sys.executable, str(program), str(tmp_path / "run")], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "child exited 3" in done.stdout


def test_children_started_otherwise_are_noted(tmp_path: Path) -> None:
    script = tmp_path / "launcher.py"
    script.write_text(textwrap.dedent("""
        import subprocess, sys, time, torch
        sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
        torch.ones(3).sum()
        time.sleep(0.2)
        # still running when the program ends: dlprof sees it among its children
    """))
    done = subprocess.run([sys.executable, "-m", "dlprof", "run", "--top", "0", "-o", str(tmp_path / "run"),
                           str(script)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    noted = dlprof.load(tmp_path / "run").manifest.saving["forked_children"]["not_followed"]
    assert len(noted) == 1 and "time.sleep(5)" in noted[0]


def test_each_rank_gathers_only_its_own_childrens_acknowledgements(tmp_path: Path) -> None:
    """The ranks of a job share the run directory and stop at about the same moment: one rank
    neither takes another's children's counts nor removes the folder they acknowledge in."""
    import os

    from dlprof.recording.forks import ForkFollower
    from dlprof.store.sink import Sink
    from dlprof.store.slice_buffer import SliceBuffer
    from dlprof.store.writer import RankWriter

    def follower(rank: int) -> ForkFollower:
        return ForkFollower(SliceBuffer(rank, os.getpid(), 0), Sink(RankWriter(tmp_path, rank)), tmp_path,
                            on_child=lambda: None)

    first, second = follower(0), follower(1)
    child_of_second = follower(1)
    child_of_second.in_child = True
    child_of_second.slices.record(child_of_second.slices.kind_code("dataloader"),
                                  child_of_second.slices.intern("DataLoader.fetch"), 1, 0, 10)
    child_of_second.save()  # what a worker of rank 1 does when its parent stops
    assert first.gather(timeout_s=0)["children"] == {}
    assert second.gather(timeout_s=0)["children"] == {str(os.getpid()): {"dataloader": 1}}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("forks")], "each rank removes its folder"


# A follower whose hand-over to the child fails: the child's recording stops, the child does not.
FOLLOW_FAILS = """
import os, sys
from pathlib import Path
from dlprof.recording.forks import ForkFollower
from dlprof.store.sink import Sink
from dlprof.store.slice_buffer import SliceBuffer
from dlprof.store.writer import RankWriter

run = Path(sys.argv[1])
def drop_parent_state():
    raise RuntimeError("the parent's state could not be dropped")

follower = ForkFollower(SliceBuffer(0, os.getpid(), 0), Sink(RankWriter(run, 0)), run, on_child=drop_parent_state)
follower.follow()
pid = os.fork()
if pid == 0:
    print("the child runs", flush=True)
    sys.exit(3)
_, status = os.waitpid(pid, 0)
print("child exited", os.waitstatus_to_exitcode(status), flush=True)
"""


def test_a_failure_following_a_fork_stops_the_childs_recording_not_the_child(tmp_path: Path) -> None:
    """Before, Python printed the fork handler's exception as a traceback on the child's stderr
    ("Exception ignored in"), and the child went on half recording."""
    script = tmp_path / "follow.py"
    script.write_text(FOLLOW_FAILS)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["the child runs", "child exited 3"], "the child ran to its own exit code"
    (line,) = done.stderr.splitlines()
    assert re.fullmatch(r"dlprof: forked process \d+: recording failed \(RuntimeError: the parent's state could "
                        r"not be dropped\): its recording stopped", line), done.stderr
