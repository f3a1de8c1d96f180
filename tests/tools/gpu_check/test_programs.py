"""The programs the checks run, where they can run here: without CuPy, without CUDA, on the CPU."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.tools.gpu_check.recorded import (
    ALEXNET,
    DEVICE_CATEGORIES,
    launches,
    ns,
    raw_events,
    reference_work,
)
from tools.gpu_check.checks.harness import PROGRAMS, ROOT
from tools.gpu_check.compare import Work
from tools.gpu_check.programs import cupy_work
from tools.gpu_check.programs.torch_reference import device_events

HAS_CUPY = importlib.util.find_spec("cupy") is not None
SAMPLE_INTERVAL_S = 100e-6  # dlprof's PM sampling interval
# The fastest GPUs the check is meant for: H200's memory (4.8 TB/s), H100 SXM's FP32 FMA rate
# (132 SMs x 128 lanes x 1.98 GHz).
FASTEST_BYTES_PER_S = 4.8e12
FASTEST_FMA_PER_S = 132 * 128 * 1.98e9


def test_each_metrics_kernel_spans_several_samples_on_the_fastest_gpu() -> None:
    sizes = cupy_work.Sizes()
    stream_s = 2 * sizes.stream_elements * 4 / FASTEST_BYTES_PER_S  # one load and one store per element
    fma_s = 4 * sizes.fma_rounds * sizes.fma_grid * sizes.fma_block / FASTEST_FMA_PER_S
    assert stream_s / SAMPLE_INTERVAL_S >= 4 and fma_s / SAMPLE_INTERVAL_S >= 4
    assert sizes.fma_grid * sizes.fma_block == sizes.fma_threads  # every output element is written


def test_the_kernels_are_named_as_the_check_looks_them_up() -> None:
    declared = re.findall(r'extern "C" __global__ void (\w+)\(', cupy_work.FMA_LOOP_SOURCE)
    assert declared == [cupy_work.COMPUTE_BOUND]
    assert cupy_work.MEMORY_BOUND == "stream_scale"


@pytest.mark.skipif(HAS_CUPY, reason="CuPy is installed here: the program would run for real")
def test_without_cupy_the_program_says_so_in_one_line() -> None:
    done = subprocess.run([sys.executable, str(PROGRAMS / "cupy_work.py"), "--phase", "activity"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["cupy_work: CuPy does not import here: No module named 'cupy'"]


def kineto_events(events: list[dict[str, Any]]) -> list[Any]:
    """The trace as torch's ``_KinetoEvent``s: CPU ops keyed by their own correlation id, device work
    linked to the op that launched it, as Kineto links them."""
    def event(name: str, activity: str, device: str, dur_ns: int, correlation: int, linked: int) -> Any:
        return SimpleNamespace(name=lambda: name, activity_type=lambda: activity, device_type=lambda: device,
                               duration_ns=lambda: dur_ns, correlation_id=lambda: correlation,
                               linked_correlation_id=lambda: linked, is_async=lambda: False)

    linked = launches(events)
    ops = [e for e in events if e.get("cat") in ("cpu_op", "user_annotation")]
    op_ids = {id(op): position + 1 for position, op in enumerate(ops)}
    made = [event(op["name"], op["cat"], "CPU", ns(op["dur"]), op_ids[id(op)], 0) for op in ops]
    for e in events:
        if e.get("cat") in DEVICE_CATEGORIES:
            call = linked.get(int(e["args"]["correlation"]))
            op = call[1] if call else None
            made.append(event(e["name"], e["cat"], "CUDA", ns(e["dur"]), int(e["args"]["correlation"]),
                              op_ids[id(op)] if op is not None else 0))
    return made


def test_torchs_events_become_device_work_with_their_launching_ops() -> None:
    events = raw_events(ALEXNET)
    device, cpu_ops = device_events(kineto_events(events), "CPU")
    assert cpu_ops == sum(e.get("cat") == "cpu_op" for e in events)
    ours = Counter(Work(d["kind"], d["name"], d["dur_ns"], d["launcher"]) for d in device)
    assert ours == Counter(reference_work(events)) and len(device) == 98


@pytest.mark.torch
@pytest.mark.slow
def test_without_cuda_the_busy_program_says_so() -> None:
    pytest.importorskip("torch", reason="needs PyTorch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is here: the program would run for real")
    done = subprocess.run([sys.executable, str(PROGRAMS / "gpu_busy.py"), "--phases", "/nonexistent/x.json"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and done.stderr.strip() == "gpu_busy: torch sees no CUDA device"


@pytest.mark.torch
@pytest.mark.slow
def test_the_torch_reference_runs_the_cnn_as_main_under_torch_profiler(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="needs PyTorch")
    out = tmp_path / "reference.json"
    done = subprocess.run([sys.executable, "-m", "tools.gpu_check.programs.torch_reference", str(out),
                           str(ROOT / "examples" / "torch_cnn.py"), "--steps", "2", "--batch-size", "4"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert "trained 2 steps" in done.stdout  # the script ran as __main__ with its own arguments
    data = json.loads(out.read_text())
    assert data["device"] == [] and data["cpu_ops"] > 100  # CPU only here: no device work, many ops
