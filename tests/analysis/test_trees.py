"""tfprof's scope and code trees, checked against op time summed here by walking each op's
enclosing module slices or Python frames one parent at a time."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

import dlprof
from dlprof.analysis.tfprof import op_view
from dlprof.analysis.trees import code_tree, frame_label, scope_tree, tree
from dlprof.analysis.user_code import is_launcher_frame, user_label
from dlprof.keys import Kind, TreeView
from tests.builders import imported_tensorflow_run, op, write_rows_run
from tests.references import Walk, expected_costs


def build_model() -> object:
    """A model whose forward the code view must find by its file, line and name."""
    torch = pytest.importorskip("torch", reason="needs PyTorch (pip install 'dlprof[torch]')")

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.hidden = torch.nn.Linear(16, 32)
            self.out = torch.nn.Linear(32, 4)

        def forward(self, x: object) -> object:
            return self.out(torch.relu(self.hidden(x)))

    return Model()


@pytest.fixture(scope="session")
def stack_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real PyTorch run recorded with Python stacks (torch's with_stack)."""
    torch = pytest.importorskip("torch", reason="needs PyTorch (pip install 'dlprof[torch]')")
    torch.manual_seed(0)
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # type: ignore[attr-defined]
    inputs, labels = torch.randn(8, 16), torch.randint(0, 4, (8,))
    out = tmp_path_factory.mktemp("runs") / "stack"
    with dlprof.profile(out=out, collectors=("torch", "layers"), with_stack=True) as prof:
        for _ in range(3):
            loss = torch.nn.functional.cross_entropy(model(inputs), labels)  # type: ignore[operator]
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            prof.step()
    return out


def expected_tree(run: dlprof.Run, path_of: Callable[[int], list[str]], separator: str) -> dict[str, list[int]]:
    """Per path: [total, self, ops], from each op's execution time and its path (outermost
    first)."""
    nodes: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for op_id, cost in expected_costs(run).items():
        time = cost["cpu"] + cost["device"]
        path = path_of(op_id)
        for end in range(len(path) + 1):
            nodes[separator.join(path[:end])][0] += time
            nodes[separator.join(path[:end])][2] += 1
        nodes[separator.join(path)][1] += time
    return nodes


def labelled_ancestors(run: dlprof.Run, label_of: dict[int, str]) -> Callable[[int], list[str]]:
    """An op's path: the labels of the labelled slices around it, outermost first."""
    walk = Walk(run)
    return lambda op_id: [label_of[a] for a in walk.ancestors(op_id) if a in label_of]


def assert_tree_matches(table: pd.DataFrame, expected: dict[str, list[int]]) -> None:
    shown = {path: [total, own, ops] for path, total, own, ops in
             zip(table["path"], table["total_ns"], table["self_ns"], table["ops"], strict=True)}
    assert shown == dict(expected)


def layer_labels(run: dlprof.Run) -> dict[int, str]:
    """The scope view's names of the layers collector's module slices, as its docs describe them."""
    walk = Walk(run)
    labels = {}
    for slice_id, row in walk.rows.items():
        if row["kind"] != Kind.MODULE:
            continue
        path, cls, direction = re.fullmatch(r"(\S+) \((\w+)\) (forward|backward)", row["name"]).groups()
        outermost = walk.enclosing(slice_id, Kind.MODULE) is None
        if not outermost:
            labels[slice_id] = f"{path.split('.')[-1]} ({cls})"
        else:  # the model itself is named by its class; a layer outside any other keeps both
            labels[slice_id] = f"{path} {direction}" if path == cls else f"{path} ({cls}) {direction}"
    return labels


@pytest.mark.torch
def test_scope_tree_of_a_real_torch_run(cnn_run: Path) -> None:
    run = dlprof.load(cnn_run)
    table = scope_tree(run)
    assert_tree_matches(table, expected_tree(run, labelled_ancestors(run, layer_labels(run)), "/"))
    assert {"Sequential forward", "Sequential forward/0 (Conv2d)", "Sequential forward/4 (Linear)"} <= set(table["path"])
    # The root holds all op time, the op view's total.
    assert table["total_ns"].iloc[0] == op_view(run)["total_ns"].sum()


@pytest.mark.torch
def test_tree_shape_depth_and_minimum_share(cnn_run: Path) -> None:
    run = dlprof.load(cnn_run)
    full = scope_tree(run)
    assert full.iloc[0][["node", "parent", "depth"]].tolist() == [0, -1, 0]
    assert full["node"].tolist() == list(range(len(full)))
    for node in full.itertuples():
        children = full[full["parent"] == node.node]
        assert node.self_ns + children["total_ns"].sum() == node.total_ns
        assert (children["depth"] == node.depth + 1).all() and (children["node"] > node.node).all()
        assert children["total_ns"].is_monotonic_decreasing
    shallow = scope_tree(run, max_depth=1)
    assert shallow["depth"].max() == 1 and len(shallow) == (full["depth"] <= 1).sum()
    share = float(full["total_pct"].iloc[1:].median())
    big = scope_tree(run, min_percent=share)
    assert (big["total_pct"].iloc[1:] >= share).all() and len(big) < len(full)
    # A node is kept when it and every node above it have the share.
    kept: dict[int, bool] = {}
    for node in full.itertuples():
        kept[node.node] = node.parent < 0 or (node.total_pct >= share and kept[node.parent])
    assert big["path"].tolist() == [p for p, n in zip(full["path"], full["node"], strict=True) if kept[n]]


def test_recorded_name_scopes(tmp_path: Path) -> None:
    # TensorFlow-style ops: the scope is recorded on each op; unscoped ops stay at the root.
    run = write_rows_run(tmp_path, [
        op(1, "sequential/dense/MatMul", 0, 100, op_type="MatMul", scope="sequential/dense"),
        op(2, "sequential/dense/BiasAdd", 100, 20, op_type="BiasAdd", scope="sequential/dense"),
        op(3, "sequential/dense_1/MatMul", 200, 50, op_type="MatMul", scope="sequential/dense_1"),
        op(4, "sequential/Relu", 300, 5, op_type="Relu", scope="sequential"),
        op(5, "Identity", 400, 7, op_type="Identity"),
    ])
    table = scope_tree(run).set_index("path")
    assert table.loc["sequential", ["total_ns", "self_ns", "ops"]].tolist() == [175, 5, 4]
    assert table.loc["sequential/dense", ["total_ns", "self_ns", "depth"]].tolist() == [120, 120, 2]
    assert table.loc["sequential/dense_1", "name"] == "dense_1"
    assert table.loc["", ["total_ns", "self_ns", "ops"]].tolist() == [182, 7, 5]


@pytest.mark.tf
def test_scope_tree_of_a_real_tensorflow_profile(tf_profile: Path, tmp_path: Path) -> None:
    run = imported_tensorflow_run(tf_profile, tmp_path / "tf")
    table = scope_tree(run)
    # Each op sits at the path of its recorded scope, whatever slices lie around it.
    scopes = run.slices.set_index("id")["scope"]
    recorded = {i: [] if pd.isna(scope) else str(scope).split("/") for i, scope in scopes.items()}
    assert_tree_matches(table, expected_tree(run, recorded.__getitem__, "/"))
    assert any(path.startswith("gradient_tape/") for path in table["path"])


@pytest.mark.torch
def test_code_tree_of_a_real_torch_run_with_stacks(stack_run: Path) -> None:
    run = dlprof.load(stack_run)
    walk = Walk(run)
    # The code view leaves the launcher's frames out (dlprof's own, click's, runpy's).
    frames = {i: user_label(label) for i, r in walk.rows.items() if r["kind"] == Kind.PYTHON
              and not is_launcher_frame(label := _kineto_frame(str(r["name"])))}
    table = code_tree(run)
    assert_tree_matches(table, expected_tree(run, labelled_ancestors(run, frames), ";"))
    # The model's forward is a node, named by this file, the line its def starts on, its name.
    forward = build_model().forward.__code__  # type: ignore[attr-defined]
    own = f"{Path(__file__).name}:{forward.co_firstlineno}:forward"
    assert any(name.endswith(own) for name in table["name"]), own
    # Built-ins are one node per method, not per object they were bound to.
    assert not table["name"].str.contains(" at 0x").any()


def _kineto_frame(name: str) -> str:
    matched = re.fullmatch(r"(.+)\((\d+)\): (.+)", name)
    if matched:
        return ":".join(matched.groups())
    return re.sub(r" at 0x[0-9a-f]+", "", name)


@pytest.mark.torch
def test_scope_tree_of_a_run_with_stacks_uses_torch_module_frames(stack_run: Path) -> None:
    table = tree(dlprof.load(stack_run), TreeView.SCOPE)
    assert any(name.startswith("Model") for name in table.loc[table["depth"] == 1, "name"])
    assert table["total_ns"].iloc[0] > table["self_ns"].iloc[0]


@pytest.mark.parametrize(("name", "label"), [
    ("torch/nn/modules/conv.py(546): _conv_forward", "torch/nn/modules/conv.py:546:_conv_forward"),
    ("$conv.py:546 _conv_forward", "conv.py:546:_conv_forward"),
    ("conv.py:546 _conv_forward", "conv.py:546:_conv_forward"),  # as the XPlane importer stores it
    ("<built-in method add_ of Parameter object at 0x7f5e3b85c870>", "<built-in method add_ of Parameter object>"),
    ("nn.Module: Linear_0", "nn.Module: Linear_0"),
])
def test_frame_labels(name: str, label: str) -> None:
    assert frame_label(name) == label


def test_one_rank_of_two(two_rank_run: Path) -> None:
    # Imported traces have no scopes: all op time is the root's, half of it per rank.
    run = dlprof.load(two_rank_run)
    both, first = scope_tree(run), scope_tree(run, rank=1)
    assert len(both) == len(first) == 1
    assert both["total_ns"].iloc[0] == 2 * first["total_ns"].iloc[0] == 2 * first["self_ns"].iloc[0]


@pytest.mark.torch
def test_within_a_region_the_tree_holds_only_the_ops_inside_it(cnn_run: Path) -> None:
    run = dlprof.load(cnn_run)
    walk = Walk(run)
    inside = [i for i in walk.ops() if any(walk.rows[a]["name"] == "forward" for a in walk.ancestors(i))]
    whole, forward = tree(run, TreeView.SCOPE), tree(run, TreeView.SCOPE, within="forward")
    assert forward["ops"].iloc[0] == len(inside) < whole["ops"].iloc[0]
    assert not forward["name"].str.contains("backward").any(), "the forward region holds no backward"
