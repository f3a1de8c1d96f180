"""Shared fixtures: small real runs, made once per test session with real PyTorch."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

import dlprof

# Real TensorFlow runs (tf_profile, tf_xla_profile, keras_run), shared by every test directory;
# pytester for the tests of this file's collection hook.
pytest_plugins = ["tests.tensorflow_runs", "pytester"]

# What a test needs, from the fixtures it asks for (directly or through other fixtures): a run
# made with PyTorch needs torch, one made by TensorFlow needs tf, and a job of several processes
# (torchrun, ``dlprof run --nproc``) takes tens of seconds, so it is slow.
FIXTURE_MARKERS: dict[str, tuple[str, ...]] = {
    "cnn_run": ("torch",),
    "dataloader_run": ("torch",),
    "two_rank_gloo_run": ("torch", "slow"),
    "habits_run": ("torch",),  # tests/advice/conftest.py
    "advised_run": ("torch",),  # tests/advice/conftest.py
    "tf_profile": ("tf",),  # tests/tensorflow_runs.py
    "tf_xla_profile": ("tf",),
    "keras_run": ("tf",),
    # Module fixtures with names of their own that make the same kinds of run.
    "short_cnn_run": ("torch",),  # tests/analysis/test_diff.py
    "worker_run": ("torch",),  # tests/collectors/test_dataloader.py
    "slowed_job": ("torch", "slow"),  # tests/analysis/test_ranks.py: two gloo ranks
    "thirty_step_cnn_run": ("torch",),  # tests/store/test_writing.py
}


def markers_for(fixturenames: Iterable[str]) -> set[str]:
    """The markers a test needs for asking for ``fixturenames``."""
    return {marker for name in fixturenames for marker in FIXTURE_MARKERS.get(name, ())}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test from the fixtures it asks for, so that ``-m 'not slow'`` or ``-m 'not
    torch'`` leaves out what those fixtures would make."""
    for item in items:
        for marker in sorted(markers_for(getattr(item, "fixturenames", ()))):
            if item.get_closest_marker(marker) is None:
                item.add_marker(marker)

# Real Kineto traces recorded on A100, V100 and MI250 GPUs (from Holistic Trace Analysis's tests,
# MIT licence beside them): the ground truth for the GPU half while tests run without a GPU.
KINETO_TRACES = Path(__file__).resolve().parent / "data" / "kineto-traces"


# dlprof's own run of a GPT-2-style model on an NVIDIA H200 (tests/data/h200/README.md).
H200_RUN = Path(__file__).resolve().parent / "data" / "h200" / "gpt2-dlprof-run"


@pytest.fixture(scope="session")
def h200_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The H200 run, copied: the recorded one stays as it was whatever a test runs on it."""
    import shutil

    return Path(shutil.copytree(H200_RUN, tmp_path_factory.mktemp("h200") / H200_RUN.name))


@pytest.fixture(scope="session")
def h200_paused_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The H200 run as a recording that times dlprof's pauses holds it: the run predates them,
    and its longest stall inside a step (the save in ProfilerStep#16, 740 ms with no op running
    inside a GELU layer) is marked as the pause it was, on the thread it held. (Written as a window
    of its own, it leaves the self times of the layers around it as they were.)"""
    import shutil

    from tests.builders import add_pauses, longest_stall

    run_dir = Path(shutil.copytree(H200_RUN, tmp_path_factory.mktemp("h200-paused") / H200_RUN.name))
    add_pauses(run_dir, [longest_stall(dlprof.load(run_dir))])
    return run_dir


@pytest.fixture(autouse=True)
def no_stored_calibration(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test reads calibrations from an empty place of its own, never the user's config
    directory: a row measured on this machine would change what the roofline tests expect."""
    from dlprof.hardware.calibration import CALIBRATION_VARIABLE

    monkeypatch.setenv(CALIBRATION_VARIABLE, str(tmp_path_factory.getbasetemp() / "no-calibration.json"))


def run_in_process(argv: list[str]) -> tuple[int, str, str]:
    """``dlprof ARGV`` in this process: its exit status, stdout and stderr."""
    from dlprof.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def dlprof_program() -> list[str]:
    """The installed ``dlprof`` script beside this Python, as a user runs it."""
    script = Path(sys.executable).with_name("dlprof")
    return [str(script)] if script.exists() else [sys.executable, "-m", "dlprof"]


def profile_tiny_cnn(out: Path, steps: int = 6, collectors: tuple[str, ...] = ("torch", "layers", "host"),
                     schedule: str | None = None) -> Path:
    """Train a tiny CNN for a few steps under dlprof, with nested regions; returns the run dir."""
    torch = pytest.importorskip("torch", reason="needs PyTorch (pip install 'dlprof[torch]')")
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(4 * 14 * 14, 10),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    inputs, labels = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    with dlprof.profile(out=out, collectors=collectors, schedule=schedule) as prof:
        for _ in range(steps):
            with dlprof.region("train_step"):
                with dlprof.region("forward"):
                    loss = nn.functional.cross_entropy(model(inputs), labels)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            prof.step()
    return out


@pytest.fixture(scope="session")
def cnn_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A complete run of a tiny CNN: ops, layers, regions, steps, memory, host counters."""
    return profile_tiny_cnn(tmp_path_factory.mktemp("runs") / "cnn")


@pytest.fixture(scope="session")
def trace_diff_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """HTA's control and test traces of one model (A100 rank 3, V100 rank 1; six steps each),
    each imported into a run as ``dlprof import`` does."""
    from dlprof.importers.trace_file import import_traces

    parent = tmp_path_factory.mktemp("trace-diff")
    for name in ("control", "test"):
        (trace,) = (KINETO_TRACES / "trace_diff" / name).glob("*.json.gz")
        import_traces([trace], parent / name)
    return parent / "control", parent / "test"


# Runs of real GPU work (recorded traces imported), for every test directory.
@pytest.fixture(scope="session")
def gpu_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One rank of real A100 work: kernels, memcpy, memset, runtime calls, flows between them."""
    from tests.builders import simple_add_trace, write_imported_run

    return write_imported_run(tmp_path_factory.mktemp("runs") / "gpu", simple_add_trace(), (0,))


@pytest.fixture(scope="session")
def two_rank_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same recorded trace as ranks 0 and 1: equal pids, tids and correlation ids on both."""
    from tests.builders import simple_add_trace, write_imported_run

    return write_imported_run(tmp_path_factory.mktemp("runs") / "ranks", simple_add_trace(), (0, 1))


EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_ddp_example(out: Path, *extra: str, steps: int = 6, nproc: int = 2) -> subprocess.CompletedProcess[str]:
    """``dlprof run --nproc N examples/ddp_train.py``: a real gloo job, one rank per process."""
    pytest.importorskip("torch", reason="needs PyTorch (pip install 'dlprof[torch]')")
    command = [*dlprof_program(), "run", "--nproc", str(nproc), "-o", str(out), *extra,
               str(EXAMPLES / "ddp_train.py"), "--steps", str(steps)]
    return subprocess.run(command, check=False, capture_output=True, text=True, timeout=300, cwd=out.parent)


@pytest.fixture(scope="session")
def two_rank_gloo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real two-rank DistributedDataParallel job on the CPU (gloo), profiled into one run."""
    out = tmp_path_factory.mktemp("runs") / "ddp"
    done = run_ddp_example(out)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def profile_dataloader_loop(out: Path, num_workers: int = 0, collectors: tuple[str, ...] = ("torch", "layers"),
                            batches: int = 6, eval_batches: int = 2) -> Path:
    """Train a small MLP on a DataLoader under dlprof, one step per batch, then evaluate it after
    the loop (inside the step open when profiling stops); returns the run dir."""
    torch = pytest.importorskip("torch", reason="needs PyTorch (pip install 'dlprof[torch]')")
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(8 * batches, 16), torch.randint(0, 4, (8 * batches,)))
    loader = DataLoader(data, batch_size=8, num_workers=num_workers)
    evaluation = DataLoader(TensorDataset(torch.randn(8 * eval_batches, 16)), batch_size=8)
    with dlprof.profile(out=out, collectors=collectors) as prof:
        for inputs, labels in loader:
            loss = nn.functional.cross_entropy(model(inputs), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            prof.step()
        with torch.no_grad():
            for (inputs,) in evaluation:
                model(inputs)
    return out


@pytest.fixture(scope="session")
def dataloader_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six training steps fed by a DataLoader in the loop (no workers), then an evaluation of two
    batches after the loop, in the step open when profiling stopped."""
    return profile_dataloader_loop(tmp_path_factory.mktemp("runs") / "dataloader")


# The CUPTI tests need NVIDIA's cupti-python; without it they skip, saying so.
HAS_CUPTI = importlib.util.find_spec("cupti") is not None
needs_cupti = pytest.mark.skipif(not HAS_CUPTI, reason="cupti-python is not installed (dlprof[gpu])")


def needs_counters() -> None:
    """Skip the test, saying why, where perf_event_open cannot count."""
    from dlprof.support.perf_event import PerfCounters

    probe = PerfCounters(["task-clock"])
    probe.close()
    if probe.failed:
        pytest.skip(f"perf_event_open cannot count here: {probe.failed}")


def blind_counters() -> None:
    """Point this process's perf_event descriptors at /dev/null, as a program that redirects the
    descriptors it did not open does: every counter reading fails from then on (nothing is read)."""
    import os

    blinded = 0
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        for name in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{name}")
            except OSError:
                continue
            if target == "anon_inode:[perf_event]":
                os.dup2(null, int(name))
                blinded += 1
    finally:
        os.close(null)
    assert blinded, "no perf_event descriptor to point away"


def dlprof_lines(err: str) -> list[str]:
    """The lines dlprof wrote among a program's stderr."""
    return [line for line in err.splitlines() if line.startswith("dlprof: ")]
