"""tfprof's scope and code views: op time attributed to a hierarchy, with self and total per node.

    tree = scope_tree(dlprof.load("dlprof-runs/20261122-101500-train"))
    tree[["depth", "name", "total_ns", "self_ns", "total_pct"]]

As in tfprof, a node's time is the execution time of the ops under it (an op's CPU time less the
ops nested in it, plus the device time of what it launched: ``exec_ns`` of
:func:`dlprof.analysis.tfprof.op_costs`), so the root's total is the op view's total and nothing is
counted twice. A node's self time is that of the ops directly in it, not in a child node; the
root's self time is that of ops outside any scope or Python frame.

- Scope view (:func:`scope_tree`): an op's name scope (``sequential/dense_1``), where the source
  records one (TensorFlow). Otherwise, for PyTorch, the ``nn.Module`` calls around the op: the
  layer slices of the layers collector (the outermost one named with its pass, ``Net forward``,
  the ones inside by attribute and class, ``0 (Conv2d)``), and Kineto's own module frames
  (``nn.Module: Conv2d_0``) recorded with Python stacks.
- Code view (:func:`code_tree`): the Python frames around the op (slices of kind ``python``, from
  PyTorch's ``with_stack`` or TensorFlow's Python tracer), each shown as ``file:line:function``,
  the line being where the function starts. Calls of the same function from different callers
  are different nodes, as in a call tree. The tree is the user's code: dlprof's, click's and
  runpy's frames are left out and it starts at the program's ``<module>``
  (see :mod:`dlprof.analysis.user_code`).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pandas as pd

from dlprof.analysis.ancestry import nearest_ancestor
from dlprof.analysis.sql import rank_condition
from dlprof.analysis.tfprof import IS_OP, kept_op_costs
from dlprof.analysis.user_code import user_code
from dlprof.keys import Kind, TreeView
from dlprof.store.reader import Run

NONE = -1  # no node, no position

# The columns of a tree, one row per node in depth-first order, children by total time.
TREE_COLUMNS = ["node", "parent", "depth", "name", "path", "ops", "total_ns", "self_ns",
                "total_pct", "self_pct"]
ROOT = "(all ops)"
# How a node's path joins the names from the root down: scopes as they are written; Python
# frames as folded stacks (the flame-graph format), since file paths hold slashes.
PATH_SEPARATOR = {TreeView.SCOPE: "/", TreeView.CODE: ";"}

_LAYER = re.compile(r"^(?P<path>.*) \((?P<cls>[^()]*)\) (?P<pass>forward|backward)$")
KINETO_MODULE_PREFIX = "nn.Module: "
# Frame names as sources write them: Kineto ``file.py(12): fn``, TensorFlow ``$file.py:12 fn``
# (the XPlane importer drops the ``$``).
_FRAME_FORMATS = (
    re.compile(r"^(?P<file>.+)\((?P<line>\d+)\): (?P<function>.+)$"),
    re.compile(r"^\$?(?P<file>[^\s:]+):(?P<line>\d+) (?P<function>.+)$"),
)
# Built-in calls name the object they are bound to by address; one node per method, not object.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def frame_label(name: str) -> str:
    """A Python frame's name as ``file:line:function`` (built-ins without their object's address).

    Args:
        name: the slice's name, as Kineto (``torch/nn/modules/conv.py(546): _conv_forward``) or
            TensorFlow's Python tracer (``$conv.py:546 _conv_forward``) wrote it.

    Returns:
        ``torch/nn/modules/conv.py:546:_conv_forward``; other names (``<built-in method conv2d
        of type object at 0x7f...>``) with any ``at 0x...`` address removed.
    """
    for pattern in _FRAME_FORMATS:
        match = pattern.match(name)
        if match:
            return f"{match['file']}:{match['line']}:{match['function']}"
    return _ADDRESS.sub("", name).removeprefix("$")


def layer_label(name: str, outermost: bool) -> str:
    """A module's node name: ``0 (Conv2d)`` from the layer slice ``features.0 (Conv2d) forward``;
    the outermost module keeps its pass (``Net forward``), which splits forward from backward."""
    if name.startswith(KINETO_MODULE_PREFIX):
        return name.removeprefix(KINETO_MODULE_PREFIX)
    match = _LAYER.match(name)
    if match is None:
        return name
    path, cls = match["path"], match["cls"]
    if outermost:
        return f"{path} {match['pass']}" if path == cls else f"{path} ({cls}) {match['pass']}"
    return f"{path.rsplit('.', 1)[-1]} ({cls})"


class _Nodes:
    """The nodes of a tree, interned by (parent node, name); node 0 is the root."""

    def __init__(self) -> None:
        self.parent: list[int] = [NONE]
        self.name: list[str] = [ROOT]
        self._index: dict[tuple[int, str], int] = {}

    def intern(self, parent: int, name: str) -> int:
        key = (parent, name)
        node = self._index.get(key)
        if node is None:
            node = self._index[key] = len(self.name)
            self.parent.append(parent)
            self.name.append(name)
        return node

    def of_path(self, components: list[str]) -> int:
        node = 0
        for component in components:
            node = self.intern(node, component)
        return node


def _frame_nodes(frames: pd.DataFrame, nodes: _Nodes, label: Callable[[str, bool], str]) -> dict[int, int]:
    """The node of every frame in the tree its enclosing frames make.

    A frame's node is (its enclosing frame's node, its label); frames are taken level by level,
    each level after the one around it, so each step is a few vectorised operations however many
    frames there are.

    Args:
        frames: ``id``, ``name``, ``depth`` and ``enclosing_id`` (the innermost frame around it,
            missing for none) of every frame.
        nodes: the tree's nodes, added to.
        label: a frame's node name from its slice name, and whether it hangs from the root.

    Returns:
        Frame id -> node.
    """
    if frames.empty:
        return {}
    ids = frames["id"].to_numpy(dtype=np.int64)
    position = pd.Index(ids)
    enclosing = position.get_indexer(frames["enclosing_id"].astype("Int64").fillna(NONE).to_numpy(dtype=np.int64))
    names = frames["name"].astype(str).to_numpy()
    depth = frames["depth"].to_numpy(dtype=np.int64)
    node_of = np.zeros(len(frames), dtype=np.int64)
    for level in np.unique(depth):
        here = np.flatnonzero(depth == level)
        around = enclosing[here]
        pairs = pd.DataFrame({
            "parent": np.where(around == NONE, 0, node_of[np.maximum(around, 0)]),
            "name": names[here],
        })
        distinct = pairs.drop_duplicates()
        distinct = distinct.assign(node=[
            nodes.intern(parent, label(name, parent == 0))
            for parent, name in zip(distinct["parent"], distinct["name"], strict=True)
        ])
        node_of[here] = pairs.merge(distinct, on=["parent", "name"], how="left")["node"].to_numpy()
    return dict(zip(ids.tolist(), node_of.tolist(), strict=True))


# Slices that are frames of each view: module calls (the layers collector's, or Kineto's
# ``nn.Module:`` frames), or Python frames.
_FRAMES = {
    TreeView.SCOPE: f"(kind = '{Kind.MODULE}' OR (kind = '{Kind.PYTHON}' AND name LIKE '{KINETO_MODULE_PREFIX}%'))",
    TreeView.CODE: f"kind = '{Kind.PYTHON}'",
}


def _tree(run: Run, view: TreeView, rank: int | None, max_depth: int | None, min_percent: float,
          within: str | None = None) -> pd.DataFrame:
    """One query finds the frames, another sums the ops' execution time per (innermost frame,
    scope); the tree is built from those two small results."""
    scope = "s.scope" if view is TreeView.SCOPE else "CAST(NULL AS STRING)"
    inside = ""
    if within is not None:  # only the ops inside a slice of that name
        enclosing = nearest_ancestor(run.engine.dialect, f"name = {run.engine.dialect.literal(within)}", rank)
        inside = (f" JOIN ({enclosing}) AS w ON w.rank = s.rank AND w.id = s.id"
                  " AND w.ancestor_id IS NOT NULL")
    frame_ancestry = nearest_ancestor(run.engine.dialect, _FRAMES[view], rank)
    with run.kept("dlprof_frame_ancestry", frame_ancestry) as ancestry, kept_op_costs(run, rank) as costs:
        frames = run.sql(
            f"SELECT s.id, s.name, s.depth, a.ancestor_id AS enclosing_id "
            f"FROM {ancestry} a JOIN slices s ON s.rank = a.rank AND s.id = a.id WHERE a.is_wanted "
            "ORDER BY s.rank, s.pid, s.tid, s.start_ns, s.dur_ns DESC, s.depth, s.id"
        )
        per_place = run.sql(
            f"SELECT a.ancestor_id AS frame_id, {scope} AS scope, sum(c.exec_ns) AS exec_ns, count(*) AS ops "
            f"FROM slices s JOIN {costs} c ON c.rank = s.rank AND c.id = s.id "
            f"LEFT JOIN {ancestry} a ON a.rank = s.rank AND a.id = s.id{inside} "
            f"WHERE s.{IS_OP}{rank_condition(rank, 's.rank')} GROUP BY a.ancestor_id, {scope}"
        )
    nodes = _Nodes()
    if view is TreeView.SCOPE:
        frame_node = _frame_nodes(frames, nodes, layer_label)
    else:
        frame_node = _frame_nodes(frames, nodes, lambda name, _outermost: frame_label(name))
        nodes.parent, nodes.name, new_of = user_code(nodes.parent, nodes.name)
        frame_node = {frame: new_of[node] for frame, node in frame_node.items()}
    place = []
    for frame_id, scope_path in zip(per_place["frame_id"], per_place["scope"], strict=True):
        if isinstance(scope_path, str):
            # A recorded scope (TensorFlow) wins over module slices around the op.
            place.append(nodes.of_path([part for part in scope_path.split("/") if part]))
        else:
            place.append(0 if pd.isna(frame_id) else frame_node.get(int(frame_id), 0))
    count = len(nodes.name)
    where = np.asarray(place, dtype=np.int64)
    self_ns = np.bincount(where, weights=per_place["exec_ns"].to_numpy(dtype=np.float64),
                          minlength=count).round().astype(np.int64)
    self_ops = np.bincount(where, weights=per_place["ops"].to_numpy(dtype=np.float64),
                           minlength=count).astype(np.int64)
    return tree_frame(nodes.parent, nodes.name, self_ns, self_ops, PATH_SEPARATOR[view], max_depth, min_percent)


def scope_tree(run: Run, rank: int | None = None, max_depth: int | None = None,
               min_percent: float = 0.0) -> pd.DataFrame:
    """tfprof's scope view: op time per name scope (TensorFlow) or module path (PyTorch).

    Args:
        run: the run.
        rank: only this rank's ops (None: every rank).
        max_depth: show nodes down to this depth (the root is depth 0; None: all).
        min_percent: hide nodes whose total is below this share of the root's (and all below
            them).

    Returns:
        :data:`TREE_COLUMNS`, one row per node (see :func:`tree_frame`).
    """
    return _tree(run, TreeView.SCOPE, rank, max_depth, min_percent)


def code_tree(run: Run, rank: int | None = None, max_depth: int | None = None,
              min_percent: float = 0.0) -> pd.DataFrame:
    """tfprof's code view: op time per Python call path, frames shown as ``file:line:function``.

    Args:
        run: the run (recorded with Python stacks: ``dlprof run --with-stack``).
        rank: only this rank's ops (None: every rank).
        max_depth: show nodes down to this depth (the root is depth 0; None: all).
        min_percent: hide nodes whose total is below this share of the root's.

    Returns:
        :data:`TREE_COLUMNS`, one row per node (see :func:`tree_frame`).
    """
    return _tree(run, TreeView.CODE, rank, max_depth, min_percent)


def tree(run: Run, view: TreeView, rank: int | None = None, max_depth: int | None = None,
         min_percent: float = 0.0, within: str | None = None) -> pd.DataFrame:
    """The scope or the code tree (see :func:`scope_tree` and :func:`code_tree`); ``within``:
    only the ops inside a slice of that name (a region such as ``eval``, a step)."""
    return _tree(run, view, rank, max_depth, min_percent, within)


def tree_frame(parents: list[int], names: list[str], self_ns: npt.NDArray[np.int64],
               self_ops: npt.NDArray[np.int64], separator: str, max_depth: int | None = None,
               min_percent: float = 0.0) -> pd.DataFrame:
    """A tree as a frame: totals rolled up from self times, nodes depth-first.

    Args:
        parents: each node's parent (node 0, the root, has none); a parent comes before its
            children.
        names: each node's name.
        self_ns: each node's own time.
        self_ops: how many ops each node holds directly.
        separator: what joins names into a node's ``path``.
        max_depth: the deepest level shown (root: 0; None: all).
        min_percent: nodes whose total is below this share of the root's are left out, with
            everything below them.

    Returns:
        :data:`TREE_COLUMNS`: ``node`` numbers rows 0.. in the order shown, ``parent`` is the
        parent's ``node`` (-1 for the root), ``ops`` counts the ops in the subtree; nodes without
        any op under them are left out. Children follow their parent, largest total first.
    """
    count = len(names)
    parent = np.asarray(parents, dtype=np.int64)
    total_ns = np.asarray(self_ns, dtype=np.int64).copy()
    total_ops = np.asarray(self_ops, dtype=np.int64).copy()
    depth = np.zeros(count, dtype=np.int64)
    for node in range(1, count):  # parents come first, so their depth is known
        depth[node] = depth[parent[node]] + 1
    for level in range(int(depth.max(initial=0)), 0, -1):
        at = np.flatnonzero(depth == level)
        np.add.at(total_ns, parent[at], total_ns[at])
        np.add.at(total_ops, parent[at], total_ops[at])
    whole = total_ns[0]
    children: dict[int, list[int]] = {}
    for node in range(1, count):
        if total_ops[node]:
            children.setdefault(int(parent[node]), []).append(node)
    rows: list[tuple[int, int, int, str, str, int, int, int]] = []
    stack: list[tuple[int, int, str]] = [(0, NONE, "")]
    while stack:
        node, shown_parent, parent_path = stack.pop()
        if node and whole and 100.0 * total_ns[node] / whole < min_percent:
            continue
        path = f"{parent_path}{separator}{names[node]}" if parent_path else names[node] if node else ""
        row = len(rows)
        rows.append((row, shown_parent, int(depth[node]), names[node], path, int(total_ops[node]),
                     int(total_ns[node]), int(self_ns[node])))
        if max_depth is None or depth[node] < max_depth:
            below = sorted(children.get(node, []), key=lambda c: (-total_ns[c], names[c]))
            stack.extend((child, row, path) for child in reversed(below))
    frame = pd.DataFrame(rows, columns=TREE_COLUMNS[:-2])
    frame["total_pct"] = 100.0 * frame["total_ns"] / whole if whole else 0.0
    frame["self_pct"] = 100.0 * frame["self_ns"] / whole if whole else 0.0
    return frame
