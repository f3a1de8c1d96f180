"""The layer view on real modules, in-place ones included, with and without the torch collector."""

from __future__ import annotations

import copy
import re
import traceback
from pathlib import Path

import pytest

import dlprof
from tests.conftest import blind_counters, dlprof_lines, needs_counters

pytestmark = pytest.mark.torch

torch = pytest.importorskip("torch", reason="needs PyTorch (pip install 'dlprof[torch]')")
from torch import nn  # noqa: E402


def profile_layers(out: Path, collectors: tuple[str, ...] = ("layers",)) -> dlprof.Run:
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(inplace=True), nn.Linear(64, 4))
    x = torch.randn(16, 32)
    with dlprof.profile(out=out, collectors=collectors) as prof:
        for _ in range(3):
            model(x).sum().backward()
            prof.step()
        with torch.no_grad():
            model(x)
    return dlprof.load(out)


def test_forward_and_backward_per_layer_with_inplace_relu(tmp_path: Path) -> None:
    run = profile_layers(tmp_path / "run")
    modules = run.slices[run.slices["kind"] == "module"]
    counts = modules["name"].value_counts()
    for layer in ("0 (Linear)", "1 (ReLU)", "2 (Linear)", "Sequential (Sequential)"):
        assert counts[f"{layer} forward"] == 4, layer
        assert counts[f"{layer} backward"] == 3, layer
    assert set(run.slices["kind"]) == {"module", "step"}, "no ops without the torch collector"


def test_layer_backward_spans_nest_and_forward_bytes_are_outputs(tmp_path: Path) -> None:
    run = profile_layers(tmp_path / "run")
    modules = run.slices[run.slices["kind"] == "module"].set_index("id")
    first = modules[modules["name"] == "0 (Linear) forward"].iloc[0]
    assert first["bytes"] == 16 * 64 * 4
    backward = modules[modules["name"].str.endswith("backward")]
    assert (backward["dur_ns"] > 0).all()
    container = backward[backward["name"] == "Sequential (Sequential) backward"].iloc[0]
    inner = backward[backward["name"] == "2 (Linear) backward"].iloc[0]
    assert container["start_ns"] <= inner["start_ns"]
    assert inner["start_ns"] + inner["dur_ns"] <= container["start_ns"] + container["dur_ns"]


def test_layers_beside_torch_collector_nest_ops_inside_layers(tmp_path: Path) -> None:
    run = profile_layers(tmp_path / "run", collectors=("torch", "layers"))
    slices = run.slices.set_index("id")
    addmm = slices[slices["name"] == "aten::linear"]
    parents = slices.loc[addmm["parent_id"].dropna().astype("int64"), "name"]
    assert parents.str.endswith("(Linear) forward").mean() > 0.9


def test_layer_slices_get_counter_deltas_forward_and_backward(tmp_path: Path) -> None:
    from dlprof.support.perf_event import PerfCounters

    probe = PerfCounters(["task-clock"])
    probe.close()
    if probe.failed:
        pytest.skip(f"perf_event_open cannot count here: {probe.failed}")
    small, big = nn.Linear(64, 64), nn.Linear(64, 2048)
    model = nn.Sequential(small, nn.ReLU(), big)
    x = torch.randn(256, 64)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the counted thread does all the work: its task-clock tells the sizes apart
    try:
        with dlprof.profile(out=tmp_path / "run", collectors=("layers",), counters=["task-clock"]) as prof:
            for _ in range(3):
                model(x).sum().backward()
                prof.step()
    finally:
        torch.set_num_threads(threads)
    run = dlprof.load(tmp_path / "run")
    rows = run.metrics.merge(run.slices[["id", "kind", "name"]], left_on="slice_id", right_on="id")
    rows = rows[(rows["kind"] == "module") & (rows["metric"].astype(str) == "perf:task-clock")]
    counted = rows.groupby("name")["value"]
    for layer in ("0 (Linear)", "2 (Linear)", "Sequential (Sequential)"):
        for direction in ("forward", "backward"):
            assert counted.size()[f"{layer} {direction}"] == 3, (layer, direction)
    assert (rows["value"] > 0).all()
    total = counted.sum()
    assert total["2 (Linear) forward"] > total["0 (Linear) forward"]
    assert total["2 (Linear) backward"] > total["0 (Linear) backward"]
    assert total["Sequential (Sequential) forward"] >= total["2 (Linear) forward"]


def test_a_layer_called_too_often_too_briefly_is_throttled(tmp_path: Path) -> None:
    """Past THROTTLE_CALLS calls at under 10 us each, a layer's later calls are counted, not
    timed, as a region's are; its earlier slices stay.

    No save may fall inside the loop: a slice a save finds open is always recorded outside the
    count, so a save (by time, or by the events the default memory cap allows) adds a timed call.
    The loop is a step of its own: a program still in its first step gets its first save a
    second in, where no layer is open, and a slow machine takes longer than that here."""
    from dlprof.keys import THROTTLE_CALLS

    layer, x = nn.Identity(), torch.ones(1)
    with torch.no_grad(), dlprof.profile(out=tmp_path / "run", collectors=("layers",),
                                         save_seconds=3600, memory_cap_mib=4096) as prof:
        prof.step()
        for _ in range(THROTTLE_CALLS + 50):
            layer(x)
    run = dlprof.load(tmp_path / "run")
    name = "Identity (Identity) forward"
    assert (run.slices.name == name).sum() == THROTTLE_CALLS
    assert run.manifest.saving["throttled"][name]["calls"] == 50


def bundled_cnn() -> nn.Module:
    """The CNN of examples/torch_cnn.py: convolutions in one Sequential, a classifier in another."""
    import importlib.util

    from tests.conftest import EXAMPLES

    spec = importlib.util.spec_from_file_location("torch_cnn_example", EXAMPLES / "torch_cnn.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    model: nn.Module = example.CNN()
    return model


@pytest.fixture(scope="module")
def cnn_layers_run(tmp_path_factory: pytest.TempPathFactory) -> dlprof.Run:
    torch.manual_seed(0)
    model = bundled_cnn()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    inputs, labels = torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,))
    out = tmp_path_factory.mktemp("layers") / "cnn"
    with dlprof.profile(out=out, collectors=("torch", "layers")) as prof:
        for _ in range(6):
            optimizer.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(inputs), labels).backward()
            optimizer.step()
            prof.step()
    return dlprof.load(out)


def test_backward_layers_nest_as_autograd_ran_them(cnn_layers_run: dlprof.Run) -> None:
    """Each layer's backward lies in its container's backward, and holds the autograd nodes it
    ran: ``features.5 (MaxPool2d) backward``, whose node runs where ``classifier``'s backward
    ends, once sat inside it; leaf layers sat inside their own node's ``evaluate_function``."""
    slices = cnn_layers_run.slices
    names = dict(zip(slices["id"], slices["name"], strict=True))
    backward = slices[(slices["kind"] == "module") & slices["name"].str.endswith(" backward")]
    parents = {name: {names.get(p) for p in group["parent_id"]} for name, group in backward.groupby("name")}
    containers = {"features": "features (Sequential)", "classifier": "classifier (Sequential)"}
    for layer, found in parents.items():
        path = layer.split(" ")[0]
        if "." in path:
            assert found == {f"{containers[path.split('.')[0]]} backward"}, (layer, found)
        elif path in containers:
            assert found == {"CNN (CNN) backward"}, (layer, found)
    assert (backward.groupby("name").size() == 6).all()
    # The node each leaf ran is inside it, not around it.
    nodes = slices[slices["name"].str.startswith("autograd::engine::evaluate_function: ")]
    held = nodes.assign(parent=nodes["parent_id"].map(names))
    pool = held[held["name"].str.endswith("MaxPool2DWithIndicesBackward0")]
    assert set(pool["parent"]) == {"features.2 (MaxPool2d) backward", "features.5 (MaxPool2d) backward"}
    assert (pool["parent"] == "features.5 (MaxPool2d) backward").sum() == 6
    assert not backward["parent_id"].map(names).str.startswith("autograd::engine").any()
    # Nothing was moved to force the tree: the backward layers were aligned to their nodes.
    normalised = cnn_layers_run.manifest.normalised
    assert normalised.get("aligned_to_autograd", 0) > 0
    assert not {"moved_past_parent", "extended_over_parent"} & set(normalised), normalised


def test_leaf_layers_count_every_call(cnn_layers_run: dlprof.Run) -> None:
    from dlprof.analysis.aggregate import top

    leaves = top(cnn_layers_run, kind="module", limit=None, leaves=True).set_index("name")["calls"]
    expected = [f"features.{i}" for i in range(6)] + [f"classifier.{i}" for i in range(4)]
    for layer in expected:
        for phase in ("forward", "backward"):
            matches = [n for n in leaves.index if n.startswith(f"{layer} (") and n.endswith(phase)]
            assert len(matches) == 1 and leaves[matches[0]] == 6, (layer, phase, matches)


LAYERS_STOPPED = re.compile(r"layers collector: recording failed \(error: unpack requires a buffer of \d+ bytes\) "
                            r"in its (forward pre-hook|backward hook) after step 2: its recording stopped")


def small_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


@pytest.mark.parametrize("fails_in", ["forward pre-hook", "backward hook"])
def test_a_hook_that_fails_stops_the_layers_collector_not_the_program(
        fails_in: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The counters are read in every hook: with their descriptors pointed away by the program,
    the first reading fails inside its forward (or its backward). Before, that exception reached
    the program's model(x) (or loss.backward())."""
    needs_counters()
    model, x = small_model(), torch.randn(4, 8)
    expected = copy.deepcopy(model)
    expected(x).sum().backward()
    with dlprof.profile(out=tmp_path / "run", collectors=("layers",), counters=["task-clock"]) as prof:
        for _ in range(2):
            model.zero_grad()
            model(x).sum().backward()
            prof.step()
        model.zero_grad()
        if fails_in == "forward pre-hook":
            blind_counters()
        loss = model(x).sum()
        if fails_in == "backward hook":
            blind_counters()
        loss.backward()
    for mine, theirs in zip(model.parameters(), expected.parameters(), strict=True):
        assert torch.equal(mine.grad, theirs.grad), "the program computed what it computes unprofiled"
    run = dlprof.load(tmp_path / "run")
    stopped = run.manifest.degraded[0]
    assert LAYERS_STOPPED.fullmatch(stopped) and fails_in in stopped, run.manifest.degraded
    # Then the session's own reading of the counters at the step's end fails, and stops the rest.
    assert len(run.manifest.degraded) == 2 and run.manifest.degraded[1].endswith("recording stopped")
    err = capsys.readouterr().err
    assert "Traceback" not in err and dlprof_lines(err)[0] == f"dlprof: {stopped}; the program goes on", err
    assert len(dlprof_lines(err)) == 2 == len(err.splitlines()), err
    assert str(run.status) == "degraded"


class Refusing(nn.Module):
    """A module whose forward raises, as a program's own check does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != 3:
            raise ValueError(f"expected 3 features, got {x.shape[-1]}")
        return x


def raised_by(model: nn.Module) -> tuple[BaseException, list[tuple[str, str, int]]]:
    """What calling the model raises, and its traceback's frames outside torch (whose own call
    takes another path when global hooks are registered)."""
    try:
        model(torch.zeros(2, 5))
    except ValueError as error:
        frames = traceback.extract_tb(error.__traceback__)
        return error, [(f.filename, f.name, f.lineno or 0) for f in frames if TORCH_DIR not in f.filename]
    raise AssertionError("the module did not raise")


TORCH_DIR = str(Path(torch.__file__).parent)


def test_a_modules_own_exception_reaches_the_program_unchanged(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(5, 5), Refusing())
    alone, alone_frames = raised_by(model)
    with dlprof.profile(out=tmp_path / "run", collectors=("layers",)):
        profiled, profiled_frames = raised_by(model)
    assert type(profiled) is ValueError and str(profiled) == str(alone) == "expected 3 features, got 5"
    assert profiled_frames == alone_frames, "no frame of dlprof's, none of the program's lost"
    assert [name for _, name, _ in profiled_frames] == ["raised_by", "forward"]
    assert dlprof.load(tmp_path / "run").manifest.degraded == []


class Fallback(nn.Module):
    """Tries a layer that refuses its input and, as a program would, falls back to another."""

    def __init__(self) -> None:
        super().__init__()
        self.strict = Refusing()
        self.plain = nn.Linear(5, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            return self.strict(x)
        except ValueError:
            return self.plain(x)


def test_a_forward_that_raised_and_was_caught_leaves_its_parents_timed(tmp_path: Path) -> None:
    model = nn.Sequential(Fallback(), nn.ReLU())
    with dlprof.profile(out=tmp_path / "run", collectors=("layers",)) as prof:
        for _ in range(2):
            model(torch.zeros(2, 5))
            prof.step()
    slices = dlprof.load(tmp_path / "run").slices
    modules = slices[slices["kind"] == "module"].set_index("id")
    counts = modules["name"].value_counts()
    for layer in ("Sequential (Sequential)", "0 (Fallback)", "0.plain (Linear)", "1 (ReLU)"):
        assert counts.get(f"{layer} forward") == 2, layer
    assert "0.strict (Refusing) forward" not in counts, "a forward that raised has no end to record"
    relu = modules[modules["name"] == "1 (ReLU) forward"]
    parents = modules.loc[relu["parent_id"].astype("int64"), "name"]
    assert (parents == "Sequential (Sequential) forward").all(), "the failed forward is no one's parent"
