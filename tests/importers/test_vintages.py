"""Every Kineto vintage and every accelerator, through ``dlprof import`` and the commands.

Traces are built in the shapes each version writes: torch 1.8's (categories ``Operator``,
``Kernel``, ``Memcpy``, ``Memset``, ``Runtime``, threads and streams named as strings, ``external
id``), Kineto's of 2023-2024 (recorded on an A100 and an MI250, ``baseTimeNanoseconds`` after the
events), torch 2.x's own two writers (Kineto's C++ one, a field per line, and the Python one, an
event per line), and an MTIA trace (``mtia_runtime`` launches, ``mtia_ccp_events`` on the device).
Device work counts as device work in ``gpu``, ``ranks`` and ``top --kind kernel`` whatever the
vintage or the accelerator.
"""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import dlprof
from dlprof.cli.main import main
from dlprof.importers.trace_file import import_traces
from tests.conftest import KINETO_TRACES


def _block_layout(header: dict[str, Any], events: list[dict[str, Any]]) -> str:
    """A trace as Kineto's C++ writer lays it out: a field per line, the args on one line."""
    lines = ["{"] + [f'  "{k}": {json.dumps(v)},' for k, v in header.items()] + ['  "traceEvents": [']
    for i, event in enumerate(events):
        fields = [f"    {json.dumps(k)}: {json.dumps(v)}" for k, v in event.items() if k != "args"]
        if "args" in event:
            fields.append(f'    "args": {{\n      {json.dumps(event["args"])[1:-1]}\n    }}')
        lines.append("  {\n" + ",\n".join(fields) + "\n  }" + ("," if i + 1 < len(events) else ""))
    return "\n".join(lines) + '\n  ],\n  "traceName": "t"\n}\n'


def torch_18_trace() -> str:
    """Two steps of torch 1.8's Kineto: a matmul launching a kernel, a copy and a memset."""
    events: list[dict[str, Any]] = []
    for step in range(2):
        t = 1000.0 * step
        correlation = 100 * step
        events += [
            {"ph": "X", "cat": "Operator", "name": f"ProfilerStep#{step}", "pid": 13721, "tid": "123",
             "ts": t, "dur": 900, "args": {"Input Dims": [], "External id": 10 * step + 1}},
            {"ph": "X", "cat": "Operator", "name": "aten::mm", "pid": 13721, "tid": "123",
             "ts": t + 10, "dur": 300, "args": {"Input Dims": [[64, 256], [256, 256]], "External id": 10 * step + 2}},
            {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 13721, "tid": "123",
             "ts": t + 20, "dur": 5, "args": {"correlation": correlation + 1, "external id": 10 * step + 2}},
            {"ph": "X", "cat": "Kernel", "name": "volta_sgemm_128x64_nn", "pid": 0, "tid": "stream 7",
             "ts": t + 30, "dur": 200, "args": {"correlation": correlation + 1, "external id": 10 * step + 2,
                                                "device": 0, "stream": 7}},
            {"ph": "X", "cat": "Runtime", "name": "cudaMemcpyAsync", "pid": 13721, "tid": "123",
             "ts": t + 400, "dur": 5, "args": {"correlation": correlation + 2, "external id": 10 * step + 1}},
            {"ph": "X", "cat": "Memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0,
             "tid": "stream 7", "ts": t + 410, "dur": 50,
             "args": {"stream": 7, "correlation": correlation + 2, "external id": 10 * step + 1}},
            {"ph": "X", "cat": "Runtime", "name": "cudaMemsetAsync", "pid": 13721, "tid": "123",
             "ts": t + 500, "dur": 5, "args": {"correlation": correlation + 3, "external id": 10 * step + 1}},
            {"ph": "X", "cat": "Memset", "name": "Memset (Device)", "pid": 0, "tid": "stream 7",
             "ts": t + 510, "dur": 20, "args": {"stream": 7, "correlation": correlation + 3,
                                                 "external id": 10 * step + 1}},
        ]
    events.append({"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
                   "tid": "PyTorch Profiler", "ts": 0, "dur": 2000, "args": {"Op count": 0}})
    return _block_layout({"schemaVersion": 1}, events)


def mtia_trace() -> str:
    """An MTIA trace: host runtime calls launching work on the accelerator's command processors."""
    events: list[dict[str, Any]] = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 500, "tid": 500,
         "ts": 0.0, "dur": 1000.0},
    ]
    for i in range(4):
        t = 100.0 + 200 * i
        events += [
            {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 500, "tid": 500, "ts": t, "dur": 50.0,
             "args": {"External id": 10 + i}},
            {"ph": "X", "cat": "mtia_runtime", "name": "runFunction - job_prep_and_submit_for_execution",
             "pid": 500, "tid": 500, "ts": t + 10, "dur": 20.0, "args": {"correlation": 70 + i, "External id": 10 + i}},
            {"ph": "X", "cat": "mtia_ccp_events", "name": f"fused_addmm_{i}", "pid": 1, "tid": 3,
             "ts": t + 40, "dur": 80.0, "args": {"correlation": 70 + i, "device": 1, "stream": 3}},
        ]
    return _block_layout({"schemaVersion": 1, "distributedInfo": {"rank": 0},
                          "baseTimeNanoseconds": 1_700_000_000_000_000_000}, events)


def _imported(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(text)
    import_traces([path], tmp_path / name)
    return tmp_path / name


def _csv(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def _command(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(args) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def test_torch_18_categories_are_todays_kinds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = _imported(tmp_path, "torch18", torch_18_trace())
    slices = dlprof.load(run_dir).slices
    kinds = Counter(slices["kind"])
    assert kinds == {"step": 2, "op": 2, "runtime": 6, "kernel": 2, "memcpy": 2, "memset": 2}
    device = slices[slices["kind"].isin(["kernel", "memcpy", "memset"])]
    assert set(device["device"]) == {"cuda:0"} and set(device["tid"]) == {7}, "streams named as text"
    assert set(slices.loc[slices["kind"] == "runtime", "external_id"]) == {1, 2, 11, 12}
    gpu = _csv(_command(["gpu", str(run_dir), "--format", "csv"], capsys))
    whole = next(row for row in gpu if row["step"] == "all")
    assert (whole["device"], whole["kernel_ns"], whole["memcpy_ns"], whole["memset_ns"]) == (
        "cuda:0", "400000", "100000", "40000")
    assert [row["step"] for row in gpu] == ["ProfilerStep#0", "ProfilerStep#1", "all"]
    top = _command(["top", str(run_dir), "--kind", "kernel", "--format", "csv"], capsys)
    assert "volta_sgemm_128x64_nn" in top
    ranks = _command(["ranks", str(run_dir), "--format", "csv"], capsys)
    assert ranks.strip()


def test_mtia_device_work_is_device_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = _imported(tmp_path, "mtia", mtia_trace())
    slices = dlprof.load(run_dir).slices
    work = slices[slices["category"] == "mtia_ccp_events"]
    assert len(work) == 4 and set(work["kind"]) == {"kernel"} and set(work["device"]) == {"mtia:1"}
    assert set(slices.loc[slices["category"] == "mtia_runtime", "kind"]) == {"runtime"}
    top = _command(["top", str(run_dir), "--kind", "kernel", "--format", "csv"], capsys)
    assert all(f"fused_addmm_{i}" in top for i in range(4))
    gpu = _csv(_command(["gpu", str(run_dir), "--format", "csv"], capsys))
    whole = next(row for row in gpu if row["step"] == "all")
    assert (whole["device"], whole["kernel_ns"], whole["kernels"]) == ("mtia:1", str(4 * 80_000), "4")
    assert _command(["ranks", str(run_dir), "--format", "csv"], capsys).strip()


@pytest.mark.parametrize("folder", ["amd_trace", "critical_path/simple_add"])
def test_recorded_rocm_and_cuda_traces_have_device_work(folder: str, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    (path,) = (KINETO_TRACES / folder).glob("*.json.gz")
    import_traces([path], tmp_path / "run")
    slices = dlprof.load(tmp_path / "run").slices
    assert (slices["kind"] == "kernel").sum() > 0
    gpu = _csv(_command(["gpu", str(tmp_path / "run"), "--format", "csv"], capsys))
    kernels = slices[slices["kind"] == "kernel"]
    for device, rows in kernels.groupby("device"):
        whole = next(row for row in gpu if row["step"] == "all" and row["device"] == device)
        assert int(whole["kernels"]) == len(rows)


@pytest.mark.torch
def test_torch_2s_two_writers_import_alike(tmp_path: Path) -> None:
    """Kineto's C++ writer (a field per line) and torch's Python one (an event per line, the base
    before the events) of one real profile give the same slices."""
    torch = pytest.importorskip("torch", reason="needs PyTorch (pip install 'dlprof[torch]')")
    model, inputs = torch.nn.Linear(8, 8), torch.randn(4, 8)
    with torch.profiler.profile(record_shapes=True) as prof:
        for _ in range(2):
            with torch.profiler.record_function("train_step"):
                model(inputs).sum().backward()
    prof.export_chrome_trace(str(tmp_path / "kineto.json"))
    prof.export_chrome_trace(str(tmp_path / "python.json"), use_python_export=True)
    assert (tmp_path / "python.json").read_text().count("\n") > 100, "an event per line"
    found = {}
    for writer in ("kineto", "python"):
        import_traces([tmp_path / f"{writer}.json"], tmp_path / writer)
        slices = dlprof.load(tmp_path / writer).slices
        found[writer] = sorted(zip(slices["kind"], slices["name"], slices["start_ns"], slices["dur_ns"], strict=True))
    assert len(found["kineto"]) > 100
    assert found["kineto"] == found["python"]
