"""Every ``dlprof`` line of README.md's ``sh`` blocks runs as written, in order, and exits 0.

The lines run one after another in a directory laid out as a reader's would be: a small real
run as the newest under ./dlprof-runs (layers, regions train and eval, a DataLoader, memory,
Python stacks), the files the README names (``trace.json.gz``, ``counters.json.gz``, ``rank0.json``, ``train.py``...)
and the runs its placeholders stand for (``RUN_A``, ``RUN_B``, ``baseline``, ``candidate``).
Commands run in-process through :func:`dlprof.cli.main.main`; ``dlprof run`` runs the installed
program, as a user does. A line that needs what this machine lacks is in :data:`SKIPPED` with
the reason, and each of those must still be in the README, so the list cannot go stale.
"""

from __future__ import annotations

import gzip
import json
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import dlprof
from dlprof.cli.main import main
from tests.conftest import H200_RUN, KINETO_TRACES, dlprof_program

README = Path(__file__).resolve().parents[2] / "README.md"
MEMORY_SNAPSHOT = Path(__file__).resolve().parents[1] / "data" / "memory-snapshot" / "snapshot.pickle"

# Lines not run, each with why.
SKIPPED = {
    "dlprof run examples/torch_cnn.py --steps 200": "a long run (200 steps); the prepared run stands in for it",
    "dlprof run examples/torch_cnn.py": "800 steps by default; the prepared run stands in for it",
    "dlprof run examples/keras_mlp.py": "starts TensorFlow and trains two epochs; tests/cli/test_keras_example.py runs it",
    "dlprof view": "opens a browser and serves the trace until the Perfetto UI fetches it (network)",
    "dlprof view --no-browser": "serves the trace until the Perfetto UI fetches it (network)",
    "dlprof import logs/plugins/profile/*/host.xplane.pb":
        "needs a TensorFlow profile directory; tests/importers import XPlane profiles",
    "dlprof run --nproc 2 examples/ddp_train.py":
        "a torchrun job; a recorded two-rank trace stands in for it (tests/test_distributed.py runs jobs)",
    "dlprof top --engine spark": "starts Apache Spark (Java); tests/engine run every analysis on Spark",
}

# Skipped lines that make the run the lines after them read: what stands in as the newest run.
STAND_INS = {
    "dlprof run examples/torch_cnn.py --steps 200": "prepared",
    "dlprof run examples/torch_cnn.py": "prepared",
    "dlprof run examples/keras_mlp.py": "prepared",
    "dlprof run --nproc 2 examples/ddp_train.py": "two_ranks",
}

TRAIN_SCRIPT = '''"""A few training steps of a small model, with a region, as a reader's train.py."""
import torch
from torch import nn

import dlprof

model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
inputs, labels = torch.randn(8, 16), torch.randint(0, 4, (8,))
for _ in range(4):
    with dlprof.region("train"):
        nn.functional.cross_entropy(model(inputs), labels).backward()
        optimizer.step()
        optimizer.zero_grad()
'''


def readme_lines() -> list[str]:
    """Every line of the README's ``sh`` blocks that runs dlprof, its comment left out."""
    lines = []
    for block in re.findall(r"^```sh\n(.*?)^```", README.read_text(encoding="utf-8"), re.MULTILINE | re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():  # a line continued with \ is one command
            command = " ".join(shlex.split(line, comments=True))
            if command.startswith("dlprof "):
                lines.append(command)
    return lines


def profile_readme_run(out: Path) -> Path:
    """A small model trained on a DataLoader under dlprof, then evaluated in a region named eval:
    layers, regions, steps, waits for data, allocations and Python stacks."""
    torch = pytest.importorskip("torch", reason="needs PyTorch (pip install 'dlprof[torch]')")
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(48, 16), torch.randint(0, 4, (48,))), batch_size=8)
    with dlprof.profile(out=out, collectors=("torch", "layers"), with_stack=True) as prof:
        for inputs, labels in loader:
            with dlprof.region("train"):
                nn.functional.cross_entropy(model(inputs), labels).backward()
                optimizer.step()
                optimizer.zero_grad()
            prof.step()
        with dlprof.region("eval"), torch.no_grad():
            model(torch.randn(8, 16))
    return out


def dated(run_dir: Path, start_ns: int) -> Path:
    """``run_dir`` with the start time commands without RUN order runs by."""
    manifest = run_dir / "run.json"
    fields = json.loads(manifest.read_text())
    fields["start_ns"] = start_ns
    manifest.write_text(json.dumps(fields))
    return run_dir


def copy_run(source: Path, target: Path, start_ns: int) -> Path:
    shutil.copytree(source, target)
    return dated(target, start_ns)


@pytest.fixture()
def reader_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A directory as a reader's: the prepared run newest under ./dlprof-runs, the files the README
    names, and the runs its placeholders stand for; returns the stand-in runs by name."""
    from dlprof.importers.trace_file import import_traces

    prepared = profile_readme_run(tmp_path / "dlprof-runs" / "20260101-000000-train")
    for name in ("baseline", "candidate"):
        copy_run(prepared, tmp_path / "dlprof-runs" / name, start_ns=1)
    (simple_add,) = (KINETO_TRACES / "critical_path" / "simple_add").glob("*.json.gz")
    shutil.copy(simple_add, tmp_path / "trace.json.gz")
    (counted,) = (KINETO_TRACES / "cupti_profiler").glob("*.json.gz")
    shutil.copy(counted, tmp_path / "counters.json.gz")
    ranks = [KINETO_TRACES / "timeline_analysis" / "sampled_rank-0.json.gz",
             KINETO_TRACES / "trace_filter" / "sampled_rank-1.json.gz"]
    for number, trace in enumerate(ranks):
        (tmp_path / f"rank{number}.json").write_bytes(gzip.decompress(trace.read_bytes()))
    two_ranks = tmp_path / "stand-ins" / "two-ranks"
    import_traces(ranks, two_ranks)
    shutil.copy(MEMORY_SNAPSHOT, tmp_path / "snapshot.pickle")
    (tmp_path / "train.py").write_text(TRAIN_SCRIPT)
    monkeypatch.chdir(tmp_path)
    return {"prepared": prepared, "two_ranks": two_ranks, "RUN_A": prepared, "RUN_B": prepared,
            "tests/data/h200/gpt2-dlprof-run": H200_RUN}


def run_line(line: str, stand_ins: dict[str, Path]) -> tuple[int, str]:
    """Run one README line (``&&`` between commands as a shell does); its exit status and output."""
    for part in line.split(" && "):
        argv = [str(stand_ins.get(word, word)) for word in shlex.split(part)][1:]
        if argv[0] == "run":
            done = subprocess.run([*dlprof_program(), *argv], capture_output=True, text=True, check=False,
                                  timeout=300)
            code, output = done.returncode, done.stdout + done.stderr
        else:
            code, output = main(argv), ""
        if code:
            return code, output
    return 0, ""


@pytest.mark.slow
@pytest.mark.torch
def test_readme_examples_run_as_written(reader_directory: dict[str, Path],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    lines = readme_lines()
    assert len(lines) > 40, "the README's sh blocks were not found"
    failures = []
    for line in lines:
        if line in SKIPPED:
            if line in STAND_INS:
                copy_run(reader_directory[STAND_INS[line]], Path("dlprof-runs") / f"stand-in-{len(failures)}-"
                         f"{time.time_ns()}", start_ns=time.time_ns())
            continue
        code, output = run_line(line, reader_directory)
        captured = capsys.readouterr()
        if code:
            failures.append(f"{line}: exit {code}: {(output or captured.err).strip()[-500:]}")
    assert not failures, "\n".join(failures)


def test_every_skipped_line_is_still_in_the_readme() -> None:
    lines = readme_lines()
    assert [line for line in SKIPPED if line not in lines] == []
    assert set(STAND_INS) <= set(SKIPPED)


def test_the_readme_uses_only_the_new_spellings() -> None:
    old = re.compile(r"--by micros|--out\b|\brun\b.*--top\b|--format text|-f text")
    assert [line for line in readme_lines() if old.search(line)] == []
