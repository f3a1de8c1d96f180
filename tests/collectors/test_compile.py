"""torch.compile programs under dlprof: run as under python, with no graph break or recompilation
of dlprof's making, and their compiled regions recorded.

Dynamo's own counters (``torch._dynamo.utils.counters``: frames compiled, graphs, graph breaks)
of a program run plain and under dlprof must be equal. Tests with the ``eager`` backend run Dynamo
alone (what dlprof could change: what it traces) and take seconds; those with Inductor are slow
(its first compile on a CPU takes tens of seconds) and share one compile cache.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import dlprof
from dlprof.config import ProfileConfig
from dlprof.recording.session import Session

pytestmark = pytest.mark.torch

torch = pytest.importorskip("torch", reason="needs PyTorch (pip install 'dlprof[torch]')")
from torch import nn  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

# What dlprof must leave as it is: frames Dynamo compiled, graphs it made, graph breaks.
COMPILE_COUNTERS = ("frames", "stats", "graph_break")


class MLP(nn.Module):
    """A model of the program's own (Dynamo compiles its forward; torch.nn's own frames it skips)."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(8, 16)
        self.out = nn.Linear(16, 4)

    def forward(self, x: Any) -> Any:
        return self.out(torch.relu(self.hidden(x)))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return MLP()


def _compiled(how: str, model: nn.Module, backend: str) -> Callable[[Any], Any]:
    """The model compiled as a program would: torch.compile(model) with options, or model.compile()."""
    if how == "method":
        model.compile(backend=backend)
        return model
    options: dict[str, Any] = {"fullgraph": True} if how == "fullgraph" else {}
    if how in ("reduce-overhead", "max-autotune"):
        options["mode"] = how
    return torch.compile(model, backend=backend, **options)


def _train(how: str, backend: str, steps: int, profiled: Callable[[], Session] | None) -> dict[str, dict[str, int]]:
    """Train the tiny model compiled ``how``, plain or inside the session ``profiled`` makes, and
    return Dynamo's counters of it."""
    torch._dynamo.reset()
    counters.clear()
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 8), torch.randn(4, 4)
    forward = model if how == "train_step" else _compiled(how, model, backend)

    def train_step() -> Any:
        loss = nn.functional.mse_loss(forward(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    if how == "train_step":  # the whole step compiled, the optimizer's step among it
        train_step = torch.compile(train_step, backend=backend)
    if profiled is None:
        for _ in range(steps):
            train_step()
    else:
        with profiled():
            for _ in range(steps):
                train_step()
    return {name: dict(counters[name]) for name in COMPILE_COUNTERS}


def _session(out: Path, collectors: tuple[str, ...] | None = None) -> Callable[[], Session]:
    # auto_steps as under dlprof run: the optimizer's hooks are there too.
    return lambda: Session(ProfileConfig(out=out, collectors=collectors, auto_steps=True))


@pytest.mark.parametrize("how", ["module", "method", "fullgraph", "train_step"])
def test_dynamo_traces_the_same_under_dlprof(tmp_path: Path, how: str) -> None:
    """dlprof's module and optimizer hooks, traced by Dynamo, add nothing to what it compiles.

    Before, the layers collector's hooks were traced: Dynamo raised ``UnspecializedNNModuleVariable
    (Sequential) is already tracked for mutation`` in the program (and with fullgraph=True any
    graph break in them is an error)."""
    plain = _train(how, "eager", 3, None)
    profiled = _train(how, "eager", 3, _session(tmp_path / "run", ("layers",)))
    assert profiled == plain
    assert plain["stats"]["unique_graphs"] >= 1, "the program compiled something"


def test_a_compiled_module_is_one_layer_named_as_the_eager_one(tmp_path: Path) -> None:
    """torch.compile(model) is called through its OptimizedModule outside the compiled code: one
    layer per call, named as the model's own (not OptimizedModule, no _orig_mod in paths), with
    its backward, and the note says what is not timed inside."""
    _train("module", "eager", 3, _session(tmp_path / "run", ("layers",)))
    run = dlprof.load(tmp_path / "run")
    names = run.slices[run.slices["kind"] == "module"]["name"].value_counts()
    assert names["MLP (MLP) forward"] == 3
    assert names["MLP (MLP) backward"] == 3
    assert not any("OptimizedModule" in name or "_orig_mod" in name for name in names.index)
    notes = next(info.notes for info in run.manifest.collectors if info.name == "layers")
    assert any("torch.compile" in note for note in notes), notes


def test_a_container_compiled_by_its_compile_method_keeps_its_layers(tmp_path: Path) -> None:
    """Dynamo skips torch.nn's own frames: a Sequential's ``compile()`` compiles nothing, and its
    layers' hooks run uncompiled inside the compiled call. Before, Dynamo compiled each hook as a
    frame of its own (frames in its counters the program does not have), and ran its traced,
    empty version: no layer was recorded."""
    def sequential() -> Any:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        model.compile(backend="eager")
        return model

    def counted(out: Path | None) -> dict[str, dict[str, int]]:
        torch._dynamo.reset()
        counters.clear()
        model, x = sequential(), torch.randn(4, 8)
        if out is None:
            model(x).sum().backward()
        else:
            with dlprof.profile(out=out, collectors=["layers"]):
                model(x).sum().backward()
        return {name: dict(counters[name]) for name in COMPILE_COUNTERS}

    assert counted(tmp_path / "run") == counted(None)
    run = dlprof.load(tmp_path / "run")
    names = set(run.slices[run.slices["kind"] == "module"]["name"])
    assert {"Sequential (Sequential) forward", "0 (Linear) forward", "2 (Linear) backward"} <= names


def test_no_warning_about_dlprofs_global_hooks(tmp_path: Path) -> None:
    """torch warns that global module hooks fire for an OptimizedModule: dlprof's hooks are meant
    to, and the program would print no such warning unprofiled."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _train("module", "eager", 2, _session(tmp_path / "run", ("layers",)))
    assert not [w for w in caught if "global hooks" in str(w.message)]


def test_compiling_is_set_apart_from_the_ops_in_a_recorded_run(tmp_path: Path) -> None:
    """Dynamo's phases in dlprof's own recording are kind compile (they were ops among aten's, at
    the top of top): top lists them with --kind compile only, and the first step's breakdown
    gives them a part of their own, carved out of the forward they compile in."""
    from dlprof.analysis.aggregate import top
    from dlprof.analysis.steps import step_report

    _train("module", "eager", 3, _session(tmp_path / "run", ("torch", "layers")))
    run = dlprof.load(tmp_path / "run")
    kinds = run.slices.groupby("kind")["name"].agg(set)
    assert {"dynamo", "bytecode_tracing", "_compile.compile_inner (dynamo_timed)"} <= kinds["compile"]
    assert not any(name.endswith("(dynamo_timed)") for name in kinds["op"])
    assert {"Torch-Compiled Region: 0/0", "TorchDynamo Cache Lookup"} <= kinds["op"]  # running, not compiling
    assert not set(top(run, limit=None)["name"]) & kinds["compile"]
    assert "dynamo" in set(top(run, kind="compile")["name"])
    report = step_report(run)
    first = report.steps.iloc[0]
    compiling = run.slices.loc[run.slices["name"] == "dynamo", "dur_ns"].sum()
    assert first["compile_ns"] >= compiling > 0 and first["forward_ns"] < first["dur_ns"] - compiling
    assert (report.steps.iloc[1:]["compile_ns"] == 0).all()
    parts = [c for c in report.steps.columns if c.endswith("_ns") and c not in ("start_ns", "dur_ns")]
    assert (report.steps[parts].sum(axis=1) == report.steps["dur_ns"]).all()


def _inside(x: Any) -> Any:
    with dlprof.region("inside"):
        y = torch.relu(x)
    return y * 2


@dlprof.region("decorated")
def _decorated(x: Any) -> Any:
    return torch.sin(x)


def _calls_decorated(x: Any) -> Any:
    return _decorated(x) * 2


@pytest.mark.parametrize("function", [_inside, _calls_decorated], ids=["with", "decorator"])
def test_a_region_inside_compiled_code_adds_no_graph_break(tmp_path: Path, function: Callable[[Any], Any]) -> None:
    """A region inside a compiled function does nothing while Dynamo traces it: the same graphs
    as without a session, none broken (before, Dynamo broke the graph at the region's clock and
    thread readings, or gave up on the frame), and only the region around the compiled call
    recorded. Compiled before the session started, it is not compiled again inside it."""
    def program(out: Path | None) -> dict[str, dict[str, int]]:
        torch._dynamo.reset()
        counters.clear()
        compiled, x = torch.compile(function, backend="eager"), torch.randn(8)
        compiled(x)  # compiled with no session recording
        if out is None:
            for _ in range(3):
                with dlprof.region("around"):
                    compiled(x)
        else:
            with dlprof.profile(out=out, collectors=["host"]):
                for _ in range(3):
                    with dlprof.region("around"):
                        compiled(x)
        return {name: dict(counters[name]) for name in (*COMPILE_COUNTERS, "recompiles")}

    plain = program(None)
    assert program(tmp_path / "run") == plain
    assert plain["stats"]["unique_graphs"] == 1 and not plain["graph_break"] and not plain["recompiles"]
    run = dlprof.load(tmp_path / "run")
    assert run.slices[run.slices["kind"] == "region"]["name"].value_counts().to_dict() == {"around": 3}


RANGE_CUT_IN_COMPILE = """
import sys
import torch
from torch import nn
import dlprof

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
compiled = torch.compile(model, backend="aot_eager")
x = torch.randn(8, 16)
with dlprof.profile(out=sys.argv[1], collectors=["torch"], save_seconds=0.1) as prof:
    for step in range(3):
        compiled(x).sum().backward()
        prof.step()
print("trained")
"""


@pytest.mark.slow
def test_saves_wait_while_compiling(tmp_path: Path) -> None:
    """Compiling takes seconds inside C++ ranges (Dynamo's _RecordFunctionFast, the compiled
    region's): a save by time made there stopped the recording they write into when they end,
    and the process died of SIGSEGV (3 of 3 before). Saves now wait until the compile is done."""
    script = tmp_path / "compiled.py"
    script.write_text(RANGE_CUT_IN_COMPILE)
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "trained"
    run = dlprof.load(out)
    assert str(run.status) == "complete"
    names = set(run.slices["name"])
    assert "Torch-Compiled Region: 0/0" in names and "CompiledFunction" in names


@pytest.fixture(scope="module")
def inductor_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One Inductor cache for the module's tests: a plain run compiles, the profiled one reuses it."""
    return tmp_path_factory.mktemp("inductor-cache")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["module", "reduce-overhead", "max-autotune"])
def test_inductor_modes_compile_the_same_under_the_default_collectors(
        tmp_path: Path, how: str, inductor_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Inductor modes (on a CPU reduce-overhead has no CUDA graphs to make and max-autotune
    few choices to tune: they compile as Inductor does here), under every default collector."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(inductor_cache))
    plain = _train(how, "inductor", 2, None)
    profiled = _train(how, "inductor", 2, _session(tmp_path / "run"))
    assert profiled == plain
    run = dlprof.load(tmp_path / "run")
    assert str(run.status) == "complete", run.manifest.degraded
    assert {"Torch-Compiled Region: 0/0", "CompiledFunction"} <= set(run.slices["name"])


COMPILED_MLP = """
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
compiled = torch.compile(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = nn.CrossEntropyLoss()
x = torch.randn(32, 64)
y = torch.randint(0, 10, (32,))
for step in range(30):
    optimizer.zero_grad()
    loss = loss_fn(compiled(x), y)
    loss.backward()
    optimizer.step()
print(f"loss {loss.item():.4f}")
"""


@pytest.mark.slow
def test_the_compiled_mlp_runs_under_dlprof_run_as_under_python(tmp_path: Path, inductor_cache: Path) -> None:
    """The issue's script: died in Dynamo under the default collectors before. Now its output and
    exit code are python's, and top shows its ops, its layer and its compiled regions."""
    from tests.conftest import dlprof_program

    script = tmp_path / "mlp.py"
    script.write_text(COMPILED_MLP)
    env = {**__import__("os").environ, "TORCHINDUCTOR_CACHE_DIR": str(inductor_cache)}
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                           timeout=600, check=False)
    out = tmp_path / "run"
    profiled = subprocess.run([*dlprof_program(), "run", "-o", str(out), "-n", "0", str(script)],
                              capture_output=True, text=True, env=env, timeout=600, check=False)
    assert profiled.returncode == plain.returncode == 0, profiled.stderr[-3000:]
    assert profiled.stdout == plain.stdout
    assert "global hooks" not in profiled.stderr
    run = dlprof.load(out)
    assert str(run.status) == "complete"
    slices = run.slices
    by_kind = slices.groupby("kind")["name"].agg(set)
    assert "aten::addmm" in by_kind["op"]
    assert {"Torch-Compiled Region: 0/0", "CompiledFunction", "CompiledFunctionBackward"} <= by_kind["op"]
    # Inductor compiling (forward, then backward at the first backward) is set apart from the ops.
    assert {"inductor_compile", "compile_fx_inner (dynamo_timed)", "backend_compile"} <= by_kind["compile"]
    assert "Sequential (Sequential) forward" in by_kind["module"]
    # The compiled region runs inside the compiled module's layer slice.
    rows = slices.set_index("id")
    region = rows[rows["name"] == "Torch-Compiled Region: 0/0"].iloc[-1]
    assert rows.loc[int(region["parent_id"]), "name"] == "Sequential (Sequential) forward"
