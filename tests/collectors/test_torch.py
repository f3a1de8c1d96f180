"""The torch collector on real PyTorch runs: ops, shapes, FLOPs, memory, steps, schedules."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import dlprof
from dlprof.keys import RunStatus
from dlprof.support.torch_features import torch_features
from tests.conftest import profile_tiny_cnn

pytestmark = pytest.mark.torch

torch = pytest.importorskip("torch", reason="needs PyTorch (pip install 'dlprof[torch]')")


def test_ops_carry_shapes_and_nest_under_regions_and_steps(cnn_run: Path) -> None:
    run = dlprof.load(cnn_run)
    assert run.status is RunStatus.COMPLETE
    slices = run.slices
    conv = slices[slices["name"] == "aten::conv2d"]
    assert len(conv) == 6, "one conv2d per step"
    assert conv["input_shapes"].iloc[0].startswith("[[8,1,28,28],[4,1,3,3]")
    by_id = slices.set_index("id")

    def ancestors(slice_id: int) -> list[str]:
        names = []
        parent = by_id.loc[slice_id, "parent_id"]
        while parent is not None and not (isinstance(parent, float) or parent is pd_na()):
            names.append(by_id.loc[parent, "name"])
            parent = by_id.loc[parent, "parent_id"]
        return names

    chain = ancestors(conv["id"].iloc[0])
    assert "forward" in chain and "train_step" in chain
    assert chain[-1].startswith("ProfilerStep#")
    assert not slices["name"].str.contains("dlprof::clock_sync").any()


def pd_na() -> object:
    import pandas as pd

    return pd.NA


def test_flops_match_torch_profiler(cnn_run: Path) -> None:
    from torch import nn
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(8, 1, 28, 28)
    conv, linear = nn.Conv2d(1, 4, 3, padding=1), nn.Linear(4 * 14 * 14, 10)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True) as prof:
        linear(torch.flatten(nn.functional.max_pool2d(conv(x), 2), 1))
    expected = {e.key: e.flops // e.count for e in prof.key_averages() if e.flops}
    slices = dlprof.load(cnn_run).slices
    for name in ("aten::conv2d", "aten::addmm"):
        ours = slices.loc[slices["name"] == name, "flops"].iloc[0]
        assert ours == expected[name], name


def test_memory_allocations_are_recorded_and_attributed_to_ops(cnn_run: Path) -> None:
    run = dlprof.load(cnn_run)
    memory = run.memory
    assert (memory["bytes"] > 0).any() and (memory["bytes"] < 0).any()
    attributed = memory.dropna(subset=["slice_id"])
    assert len(attributed) > len(memory) // 2
    owners = set(attributed["slice_id"]) & set(run.slices["id"])
    assert owners, "slice ids in the memory table point at slices"
    ops = run.slices[run.slices["kind"] == "op"]
    assert ops["bytes"].sum() > 0


def test_manifest_records_collectors_and_clocks(cnn_run: Path) -> None:
    manifest = dlprof.load(cnn_run).manifest
    torch_info = next(c for c in manifest.collectors if c.name == "torch")
    assert torch_info.active and torch_info.version.startswith("2.")
    if not torch.cuda.is_available():
        assert any("no CUDA" in note for note in torch_info.notes)
    kineto = next(c for c in manifest.clocks if c.name == "kineto")
    low, high = kineto.bounds_ns
    assert low <= kineto.offset_ns <= high or low > high


def test_schedule_records_only_active_steps(tmp_path: Path) -> None:
    # skip 1, wait 1, warm up 1, record 2, once: steps 3 and 4 are recorded.
    run = dlprof.load(profile_tiny_cnn(tmp_path / "run", steps=7, schedule="1,1,1,2,1"))
    slices = run.slices
    steps = sorted(slices.loc[slices["kind"] == "step", "name"])
    assert steps == ["ProfilerStep#3", "ProfilerStep#4"]
    assert (slices.loc[slices["name"] == "aten::conv2d"].shape[0]) == 2
    assert (slices.loc[slices["name"] == "train_step"].shape[0]) == 2
    step_spans = slices[slices["kind"] == "step"][["start_ns", "dur_ns"]]
    first, last = step_spans["start_ns"].min(), (step_spans["start_ns"] + step_spans["dur_ns"]).max()
    ops = slices[slices["kind"] == "op"]
    assert ops["start_ns"].min() >= first and (ops["start_ns"] + ops["dur_ns"]).max() <= last


def test_long_run_is_saved_in_several_cycles(tmp_path: Path) -> None:
    from torch import nn

    from dlprof.config import ProfileConfig
    from dlprof.recording.session import Session

    model = nn.Linear(16, 16)
    session = Session(ProfileConfig(out=tmp_path / "run", collectors=("torch",), flush_steps=3))
    with session:
        for _ in range(10):
            model(torch.randn(4, 16)).sum().backward()
            session.step()
    run = dlprof.load(tmp_path / "run")
    assert (run.slices["name"] == "aten::linear").sum() == 10
    assert not (tmp_path / "run" / "kineto").exists(), "saved traces are removed once converted"
    assert run.slices["id"].is_unique


def test_the_collector_starts_when_the_program_imports_torch(tmp_path: Path) -> None:
    """A session begun before `import torch` records the ops that follow it (a fresh process:
    this one has imported torch long ago)."""
    import subprocess
    import sys

    program = (
        "import sys, dlprof\n"
        "with dlprof.profile(out=sys.argv[1]) as prof:\n"
        "    assert 'torch' not in sys.modules\n"
        "    import torch\n"
        "    for _ in range(3):\n"
        "        torch.ones(4).sum()\n"
        "        prof.step()\n"
    )
    done = subprocess.run([sys.executable, "-c", program, str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    run = dlprof.load(tmp_path / "run")
    info = {c.name: c for c in run.manifest.collectors}
    assert info["torch"].active and info["layers"].active
    assert (run.slices.name == "aten::ones").sum() == 3


def _thread_ops(out: Path, all_threads: bool) -> tuple[dlprof.store.reader.Run, int]:
    import threading

    tids: list[int] = []

    def work() -> None:
        tids.append(threading.get_native_id())
        for _ in range(5):
            torch.ones(8).mul(2)

    with dlprof.profile(out=out, collectors=("torch",), all_threads=all_threads) as prof:
        worker = threading.Thread(target=work, name="worker")
        worker.start()
        worker.join()
        torch.ones(8).mul(3)
        prof.step()
    return dlprof.load(out), tids[0]


def test_ops_of_other_threads_are_noted_or_recorded(tmp_path: Path) -> None:
    run, worker_tid = _thread_ops(tmp_path / "main-only", all_threads=False)
    muls = run.slices[run.slices.name == "aten::mul"]
    assert len(muls) == 1 and worker_tid not in set(muls.tid)
    [note] = [n for n in run.manifest.collectors[0].notes if "thread" in n]
    assert note.startswith("1 other Python thread(s) started while profiling (worker): any torch ops they ran "
                           "were not recorded")

    run, worker_tid = _thread_ops(tmp_path / "all", all_threads=True)
    muls = run.slices[run.slices.name == "aten::mul"]
    notes = run.manifest.collectors[0].notes
    if not torch_features().all_threads:  # torch 2.4: Kineto has no profile_all_threads
        assert len(muls) == 1 and worker_tid not in set(muls.tid)
        assert any("has no profile_all_threads" in n for n in notes), notes
        return
    assert (muls.tid == worker_tid).sum() == 5 and len(muls) == 6
    assert any("their ops recorded" in n for n in notes) and any("no allocations" in n for n in notes)


RANGES_ACROSS_SAVES = """
import sys, time
import torch
import dlprof
from torch.profiler import record_function

x = torch.randn(32, 32)


def work(seconds, least=40):
    # At least `least` matmuls: on a loaded machine a CUDA build's BLAS threads can make each
    # take tens of milliseconds, and the seconds alone ran too few for the check below.
    end, done = time.perf_counter() + seconds, 0
    while time.perf_counter() < end or done < least:
        x @ x
        done += 1


class Doubled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, value):
        work(0.15)  # Python inside a C++ range: no save may cut here
        return value * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


with dlprof.profile(out=sys.argv[1], save_seconds=0.1) as prof:
    epoch = record_function("epoch")  # open across step boundaries, entered while recording
    epoch.__enter__()
    for step in range(6):
        with record_function("outer"):  # as DDP's forward or Optimizer.step: open when saves come
            with record_function("inner"):
                work(0.15)
            Doubled.apply(torch.ones(4, requires_grad=True)).sum().backward()
            work(0.1)
        prof.step()
        if step == 2:
            epoch.__exit__(None, None, None)
"""


def test_torch_ranges_open_across_saves_are_split_not_corrupted(tmp_path: Path) -> None:
    """A record_function entered in one recording and exited in the next wrote into the stopped
    recording's freed buffers (a segfault, or std::bad_alloc); now it is split at the save."""
    import subprocess
    import sys

    script = tmp_path / "ranges.py"
    script.write_text(RANGES_ACROSS_SAVES)
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    run = dlprof.load(out)
    assert run.manifest.saving["saves_within_steps"] >= 1
    notes = " ".join(note for info in run.manifest.collectors for note in info.notes)
    assert "split there" in notes and "outer" in notes, notes
    slices = run.slices
    outer = slices[slices["name"] == "outer"]
    assert len(outer) > 6, "pieces where saves cut the ranges"
    # Every op of the program ran inside an "outer": each is in a piece of one (before, a range
    # was ended at the first cut and the ops after it were in none).
    parents = dict(zip(slices["id"], slices["parent_id"], strict=True))
    names = dict(zip(slices["id"], slices["name"], strict=True))

    def in_outer(slice_id: object) -> bool:
        while slice_id is not None and not pd.isna(slice_id):
            if names[slice_id] == "outer":
                return True
            slice_id = parents[slice_id]
        return False

    matmuls = slices[slices["name"] == "aten::mm"]
    assert len(matmuls) > 100 and all(in_outer(i) for i in matmuls["id"])
    assert (slices["name"] == "inner").sum() >= 6 and (slices["name"] == "epoch").sum() >= 1


OPTIMIZER_IN_BACKWARD = """
import time
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
optimizers = {p: torch.optim.SGD([p], lr=0.01) for p in model.parameters()}
first = next(iter(optimizers.values()))


def step_in_backward(param):  # each parameter's step as soon as its gradient is ready
    optimizers[param].step()
    optimizers[param].zero_grad()
    if optimizers[param] is first:
        time.sleep(0.15)  # a step longer than --save-seconds: its boundary saves


for p in model.parameters():
    p.register_post_accumulate_grad_hook(step_in_backward)
x = torch.randn(32, 64)
for _ in range(6):
    model(x).sum().backward()
    time.sleep(0.3)  # outside the backward: where the save that waited is made
print("done")
"""


@pytest.mark.slow
def test_a_step_that_ends_inside_the_backward_saves_after_it(tmp_path: Path) -> None:
    """The optimizer stepped inside the backward (a gradient hook) ends each step inside an
    autograd node's C++ range: the boundary's save cut the recording there and the process died
    of SIGSEGV (before). The save now waits until the backward is done, inside the next step."""
    import subprocess

    from tests.conftest import dlprof_program

    script = tmp_path / "in_backward.py"
    script.write_text(OPTIMIZER_IN_BACKWARD)
    out = tmp_path / "run"
    done = subprocess.run([*dlprof_program(), "run", "-o", str(out), "-n", "0", "--save-seconds", "0.1", str(script)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "done\n"
    run = dlprof.load(out)
    assert str(run.status) == "complete"
    assert run.manifest.saving["saves_within_steps"] >= 3, "the boundaries' saves, made once the backward ended"
    assert (run.slices["name"] == "Optimizer.step#SGD.step").sum() == 6 * 4
