"""The files the installed torch writes, read by ``dlprof import``: run in each torch environment.

`make test-torch-versions` runs this module on torch 2.4, 2.11 and 2.15 (and `make test` on
2.13), so a release that writes its Chrome trace or its raw memory timeline differently shows
here. Memory snapshots (``torch.cuda.memory._dump_snapshot``) need a CUDA device to be made and
are tested on their recorded shapes in test_memory_snapshot.py.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import dlprof
from dlprof.importers.memory_timeline import CATEGORIES
from dlprof.importers.trace_file import import_traces

pytestmark = pytest.mark.torch

torch = pytest.importorskip("torch", reason="needs PyTorch (pip install 'dlprof[torch]')")
from torch.profiler import ProfilerActivity, profile  # noqa: E402

STEPS = 3


def train(prof: profile) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    inputs = torch.randn(16, 32)
    for _ in range(STEPS):
        model(inputs).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        prof.step()


def test_torchs_own_chrome_trace_imports_with_shapes_and_flops(tmp_path: Path) -> None:
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True,
                 with_flops=True) as prof:
        train(prof)
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    addmms = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("name") == "aten::addmm"]
    import_traces([trace], tmp_path / "run")
    slices = dlprof.load(tmp_path / "run").slices
    ours = slices[slices["name"] == "aten::addmm"]
    assert len(ours) == len(addmms) == 2 * STEPS
    # The first Linear: a 16x32 input times a 32x64 weight, 2 FLOPs per multiply-add.
    assert (ours["flops"] == 2 * 16 * 32 * 64).sum() == STEPS, ours["flops"].tolist()
    assert (ours["input_shapes"] == "[[64],[16,32],[32,64],[],[]]").sum() == STEPS, ours["input_shapes"].tolist()


def test_torchs_category_order_is_the_importers(tmp_path: Path) -> None:
    """The raw timeline writes each category as its index in torch's own table: the importer's
    names must follow that table's order in every torch."""
    from torch.profiler import _memory_profiler

    torchs = [category.name.lower() if category is not None else "unknown"
              for category in _memory_profiler._CATEGORY_TO_INDEX]
    assert torchs == list(CATEGORIES)


def test_torchs_raw_memory_timeline_imports_with_its_categories(tmp_path: Path) -> None:
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True,
                 with_stack=True) as prof:
        train(prof)
    path = tmp_path / "memory.raw.json.gz"
    prof.export_memory_timeline(str(path), device="cpu")
    rows = json.loads(gzip.decompress(path.read_bytes()))
    import_traces([path], tmp_path / "run")
    memory = dlprof.load(tmp_path / "run").memory
    assert len(memory) == len(rows) > 0
    assert int(memory["total_allocated"].iloc[-1]) == sum(row[2] for row in rows)
    assert {"parameter", "gradient"} <= set(memory["category"]), set(memory["category"])
