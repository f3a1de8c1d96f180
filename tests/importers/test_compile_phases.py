"""torch.compile's compile phases are kind ``compile``, told by torch's own names: in a bare
torch.profiler trace of a compiled program imported with ``dlprof import``, and in names alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import dlprof
from dlprof.analysis.aggregate import top
from dlprof.analysis.steps import step_report
from dlprof.importers.compile_phases import compile_kinds
from dlprof.importers.trace_file import import_traces
from dlprof.keys import Kind


def test_only_torchs_own_compile_ranges_are_compiling() -> None:
    names = ["dynamo", "dynamo_data: compile_id=0/0", "bytecode_tracing (dynamo_timed)",
             "entire_frame_compile", "entire_frame_compile_data: fn_name=_compile.compile_inner, compile_id=0/0",
             "Torch-Compiled Region: 0/0", "TorchDynamo Cache Lookup", "CompiledFunction", "aten::mm",
             "inductor_compile", "my_data: step=3", "dynamo"]
    kinds = ["op", "user_annotation", "op", "op", "user_annotation", "op", "op", "op", "op",
             # a phase named without its _data annotation in the trace, and annotations of the program's
             "op", "user_annotation", "kernel"]
    found = compile_kinds(pa.array(kinds, pa.string()), pa.array(names, pa.string())).to_pylist()
    assert [name for name, kind in zip(names, found, strict=True) if kind == Kind.COMPILE] == [
        "dynamo", "dynamo_data: compile_id=0/0", "bytecode_tracing (dynamo_timed)", "entire_frame_compile",
        "entire_frame_compile_data: fn_name=_compile.compile_inner, compile_id=0/0"]
    assert found[-1] == "kernel"  # only ops and annotations are ranges torch opens


@pytest.mark.torch
@pytest.mark.filterwarnings("ignore:Profiler won't be using warmup")
def test_an_imported_trace_of_a_compiled_program_sets_compiling_apart(tmp_path: Path) -> None:
    """Dynamo's phases (the eager backend: Dynamo alone, in seconds) were ops among aten's: top
    listed them and the first step's forward held them."""
    torch = pytest.importorskip("torch", reason="needs PyTorch (pip install 'dlprof[torch]')")
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    compiled: Any = torch.compile(model, backend="eager")
    torch._dynamo.reset()
    # A schedule for ProfilerStep ranges; one cycle longer than the loop, exported whole.
    every_step = torch.profiler.schedule(wait=0, warmup=0, active=4)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=every_step) as prof:
        for _ in range(3):
            compiled(torch.randn(4, 8)).sum().backward()
            prof.step()
    trace = tmp_path / "compiled.json"
    prof.export_chrome_trace(str(trace))
    import_traces([trace], tmp_path / "run")
    run = dlprof.load(tmp_path / "run")
    kinds = run.slices.groupby("kind")["name"].agg(set)
    assert {"dynamo", "_compile.compile_inner (dynamo_timed)", "bytecode_tracing"} <= kinds[Kind.COMPILE]
    assert not any(name.endswith("(dynamo_timed)") or "_data: " in name for name in kinds[Kind.OP])
    assert {"Torch-Compiled Region: 0/0", "TorchDynamo Cache Lookup"} <= kinds[Kind.OP]
    assert "dynamo" not in set(top(run, limit=None)["name"]) and "dynamo" in set(top(run, kind="compile")["name"])
    first = step_report(run).steps.iloc[0]
    assert first["compile_ns"] >= run.slices.loc[run.slices["name"] == "dynamo", "dur_ns"].sum() > 0
