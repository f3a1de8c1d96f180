"""The code view's tree as the user's own code: the frames of the launcher left out, the tree
rooted at the user's program.

Under ``dlprof run`` the Python stack of every op starts with frames that are not the user's:
the ``dlprof`` console script, its command line (click), the runner and ``runpy``, and dlprof's
own wrappers (the optimizer-step marker). They are left out, their children hung from the
nearest frame kept, and siblings that then share a name merged.

torch's Python tracer also loses the frames that were already on the stack when a profiling
cycle began: what it records of them has the wrong names and times, so a later cycle's
``train.py:2:step`` can hang from the root beside the ``train.py:1:<module>`` that holds the
first cycle's; and it names a module frame by the line it was running. Module frames are shown
without a line (``train.py:<module>``), and a frame that ends up at the root, is not a ``<module>``, and is found under the
program's ``<module>`` by the same name is merged there, where its callers were seen.

    parents, names, node_of = user_code(nodes.parent, nodes.name)
"""

from __future__ import annotations

import re

# Frames that are dlprof's, its command line's or the interpreter's way into the program, as
# ``file:line:function`` labels (see trees.frame_label).
_LAUNCHER_FRAME = re.compile(
    r"^(?:(?:.*/)?dlprof:\d+:<module>"  # the console script
    r"|(?:.*/)?dlprof/[^:]*\.py:"  # dlprof's own package
    r"|(?:.*/)?click/[^:]*\.py:"  # its command line
    r"|<frozen runpy>:|(?:.*/)?runpy\.py:)"  # how the program is run
)
_MODULE_FRAME = ":<module>"
ROOT_NODE = 0


def user_label(label: str) -> str:
    """A frame's label in the user's tree: a module's frame without its line (``train.py:<module>``): a cycle that begins inside the
    program names its module frame by the line running then, not the first."""
    if label.endswith(_MODULE_FRAME):
        path = label[: -len(_MODULE_FRAME)].rpartition(":")[0]
        return f"{path}{_MODULE_FRAME}" if path else label
    return label


def is_launcher_frame(label: str) -> bool:
    """Whether a frame (``file:line:function``) is dlprof's, click's or runpy's, not the user's."""
    return _LAUNCHER_FRAME.match(label) is not None


class _Tree:
    """A tree being built, nodes interned by (parent, name); node 0 is the root."""

    def __init__(self, root: str) -> None:
        self.parents, self.names = [-1], [root]
        self._index: dict[tuple[int, str], int] = {}

    def intern(self, parent: int, name: str) -> int:
        node = self._index.get((parent, name))
        if node is None:
            node = self._index[(parent, name)] = len(self.names)
            self.parents.append(parent)
            self.names.append(name)
        return node

    def below(self) -> dict[int, list[int]]:
        children: dict[int, list[int]] = {}
        for node in range(1, len(self.names)):
            children.setdefault(self.parents[node], []).append(node)
        return children

    def home(self, node: int) -> int | None:
        """The shallowest node named as ``node`` under a program's ``<module>``: where a frame
        that strayed to the root belongs (None for a program, or when there is none)."""
        name = self.names[node]
        if name.endswith(_MODULE_FRAME):
            return None
        depth, top = [0] * len(self.names), list(range(len(self.names)))
        best: int | None = None
        for other in range(1, len(self.names)):
            parent = self.parents[other]
            depth[other] = depth[parent] + 1
            top[other] = other if parent == ROOT_NODE else top[parent]
            if (other != node and self.names[other] == name and depth[other] > 1
                    and self.names[top[other]].endswith(_MODULE_FRAME)
                    and (best is None or depth[other] < depth[best])):
                best = other
        return best

    def merge_into(self, node: int, home: int) -> dict[int, int]:
        """Copy the subtree below ``node`` under ``home``; returns each of its nodes' copy."""
        below = self.below()
        moved = {node: home}
        pending = list(below.get(node, []))
        while pending:
            child = pending.pop(0)
            moved[child] = self.intern(moved[self.parents[child]], self.names[child])
            pending.extend(below.get(child, []))
        return moved


def user_code(parents: list[int], names: list[str]) -> tuple[list[int], list[str], list[int]]:
    """The tree with the launcher's frames left out and stray frames merged under the program.

    Args:
        parents: each node's parent (node 0, the root, has none); parents come before children.
        names: each node's label.

    Returns:
        The new tree's parents and names (parents before children; nodes emptied by a merge
        stay, holding nothing), and for each old node its new node (a left-out frame maps to the
        node its children went to).
    """
    children: dict[int, list[int]] = {}
    for node in range(1, len(names)):
        children.setdefault(parents[node], []).append(node)
    tree = _Tree(names[ROOT_NODE])
    new_of = [ROOT_NODE] * len(names)

    def place(old: int) -> list[int]:
        """Place ``old``'s subtree under the root; returns the root-level nodes it made."""
        placed: list[int] = []
        pending = [(old, ROOT_NODE)]
        while pending:
            node, parent = pending.pop()
            if is_launcher_frame(names[node]):
                new_of[node] = parent
            else:
                new_of[node] = tree.intern(parent, user_label(names[node]))
                if parent == ROOT_NODE:
                    placed.append(new_of[node])
            pending.extend((child, new_of[node]) for child in reversed(children.get(node, [])))
        return placed

    # Everything is placed first, so that frames which strayed from the program find where
    # they belong wherever they came in the stack.
    at_root = [placed for node in children.get(ROOT_NODE, []) for placed in place(node)]
    for node in at_root:
        home = tree.home(node)
        if home is not None:
            moved = tree.merge_into(node, home)
            new_of = [moved.get(new, new) for new in new_of]
    return tree.parents, tree.names, new_of
