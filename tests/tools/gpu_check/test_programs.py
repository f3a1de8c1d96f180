"""The programs the checks run, where they can run here: without CuPy, without CUDA, on the CPU."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dlprof.config import ProfileConfig
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
from tools.gpu_check.programs import cupy_work, torch_reference
from tools.gpu_check.programs.torch_reference import USER_SCOPE, device_events, user_ranges

HAS_CUPY = importlib.util.find_spec("cupy") is not None
H200_TRACE = ROOT / "tests" / "data" / "h200" / "gpt2-torch-profiler.json.gz"  # torch 2.11
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


# The optional _KinetoEvent methods the reference reads, as each torch release has them.
KINETO_EVENT_SURFACES = {
    "torch 2.13 and 2.15": ("activity_type", "is_user_annotation"),
    "torch 2.11": ("is_user_annotation",),
    "torch 2.4": (),
}
# What every supported torch's _KinetoEvent has, and the reference reads.
KINETO_EVENT_METHODS = ("name", "device_type", "duration_ns", "correlation_id", "linked_correlation_id",
                        "is_async", "scope")
HOST_CATEGORIES = ("cpu_op", "user_annotation")
DEVICE_SIDE = (*DEVICE_CATEGORIES, "gpu_user_annotation")  # what Kineto puts on a GPU's streams


def kineto_events(events: list[dict[str, Any]], methods: tuple[str, ...],
                  launcher: Callable[[dict[str, Any]], dict[str, Any] | None]) -> list[Any]:
    """The trace as torch's ``_KinetoEvent``s of a release whose optional methods are ``methods``:
    CPU ops keyed by their own correlation id, device work linked to the op ``launcher`` names, as
    Kineto links them."""
    def event(e: dict[str, Any], device: str, correlation: int, linked: int) -> Any:
        category = e["cat"]
        fields = {"name": lambda: e["name"], "device_type": lambda: device, "duration_ns": lambda: ns(e["dur"]),
                  "correlation_id": lambda: correlation, "linked_correlation_id": lambda: linked,
                  "is_async": lambda: False,
                  "scope": lambda: USER_SCOPE if category == "user_annotation" else 0}
        if "activity_type" in methods:
            fields["activity_type"] = lambda: category
        if "is_user_annotation" in methods:
            fields["is_user_annotation"] = lambda: category in ("user_annotation", "gpu_user_annotation")
        return SimpleNamespace(**fields)

    ops = [e for e in events if e.get("cat") in HOST_CATEGORIES]
    op_ids = {id(op): position + 1 for position, op in enumerate(ops)}
    made = [event(op, "CPU", op_ids[id(op)], 0) for op in ops]
    for position, e in enumerate(events):
        if e.get("cat") in DEVICE_SIDE:
            op = launcher(e) if e["cat"] in DEVICE_CATEGORIES else None
            made.append(event(e, "CUDA", len(ops) + position + 1, op_ids[id(op)] if op is not None else 0))
    return made


@pytest.mark.parametrize("surface", KINETO_EVENT_SURFACES)
def test_torchs_events_become_device_work_with_their_launching_ops(surface: str) -> None:
    events = raw_events(ALEXNET)
    linked = launches(events)

    def launcher(e: dict[str, Any]) -> dict[str, Any] | None:
        call = linked.get(int(e["args"]["correlation"]))
        return call[1] if call else None

    device, cpu_ops = device_events(kineto_events(events, KINETO_EVENT_SURFACES[surface], launcher), "CPU")
    assert cpu_ops == sum(e.get("cat") in HOST_CATEGORIES for e in events)
    ours = Counter(Work(d["kind"], d["name"], d["dur_ns"], d["launcher"]) for d in device)
    assert ours == Counter(reference_work(events)) and len(device) == 98


@pytest.mark.parametrize("surface", KINETO_EVENT_SURFACES)
def test_ranges_on_the_gpu_are_not_device_work_on_any_torch(surface: str) -> None:
    """The bare torch.profiler trace recorded on the H200 with torch 2.11 (whose _KinetoEvent has
    no activity_type: the reference crashed there): its kernels, copies and memsets, and not the
    GPU spans of the optimizer's ranges (gpu_user_annotation)."""
    with gzip.open(H200_TRACE) as file:
        events = [e for e in json.load(file)["traceEvents"] if e.get("ph") == "X"]
    by_external_id = {e["args"]["External id"]: e for e in events if e.get("cat") in HOST_CATEGORIES}

    def launcher(e: dict[str, Any]) -> dict[str, Any] | None:
        return by_external_id.get(e["args"].get("External id"))

    device, _ = device_events(kineto_events(events, KINETO_EVENT_SURFACES[surface], launcher), "CPU")
    recorded = [e for e in events if e.get("cat") in DEVICE_CATEGORIES]
    assert any(e.get("cat") == "gpu_user_annotation" for e in events)
    assert Counter((d["kind"], d["name"], d["dur_ns"]) for d in device) == Counter(
        (DEVICE_CATEGORIES[e["cat"]], e["name"], ns(e["dur"])) for e in recorded)
    assert Counter(d["kind"] for d in device) == {"kernel": 5080, "memset": 476, "memcpy": 77}
    assert sum(d["launcher"] is not None for d in device) == len(recorded)


@pytest.mark.torch
def test_the_installed_torchs_events_are_read_through_what_it_offers() -> None:
    """On the CPU, in each torch environment: this torch's _KinetoEvent is one of the surfaces the
    reference reads, record_function ranges have the user scope it looks for, and a recording of
    CPU work has ops and no device work."""
    pytest.importorskip("torch", reason="needs PyTorch")
    import torch
    from torch._C._autograd import DeviceType, _KinetoEvent
    from torch.profiler import ProfilerActivity, profile, record_function

    assert all(hasattr(_KinetoEvent, method) for method in KINETO_EVENT_METHODS)
    optional = tuple(m for m in ("activity_type", "is_user_annotation") if hasattr(_KinetoEvent, m))
    assert optional in KINETO_EVENT_SURFACES.values(), optional
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("reference_probe"):
            torch.randn(16, 16) @ torch.randn(16, 16)
    events = list(prof.profiler.kineto_results.events())
    ranges = user_ranges(events, DeviceType.CPU)
    assert "reference_probe" in ranges and "aten::mm" not in ranges
    if "is_user_annotation" in optional:
        assert ranges == {e.name() for e in events if e.is_user_annotation()}
    device, cpu_ops = device_events(events, DeviceType.CPU)
    assert device == [] and cpu_ops >= 4  # the range, two randn and the matmul at least


def test_the_reference_profiles_as_dlprofs_defaults_do() -> None:
    """The reference imports nothing of dlprof: its profiler settings are written out, and held
    equal to ProfileConfig's defaults here."""
    config = ProfileConfig()
    assert (torch_reference.RECORD_SHAPES, torch_reference.PROFILE_MEMORY, torch_reference.WITH_FLOPS,
            torch_reference.WITH_STACK) == (config.record_shapes, config.profile_memory, config.with_flops,
                                            config.with_stack)
    source = Path(torch_reference.__file__).read_text()
    assert "dlprof" not in "".join(line for line in source.splitlines() if line.startswith(("import", "from")))


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
