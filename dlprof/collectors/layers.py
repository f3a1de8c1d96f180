"""The layer view: forward and backward time of every ``nn.Module``, with or without torch.profiler.

Forward time comes from global module forward pre/post hooks. Backward time does not use full
backward hooks (they wrap tensors in a function that breaks in-place modules such as
``ReLU(inplace=True)``): a module's backward starts when the autograd node that produced its
output starts, and ends when the node that produced its input is reached, or when its own node
ends for a module whose input needs no gradient. A container's backward spans its children's.

Forward slices are named ``<path> (<Class>) forward``, backward ones ``... backward``; ``bytes``
holds the size of the forward's output tensors (the activation memory the layer keeps).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import threading
import time
import weakref
from typing import Any

from dlprof.collectors.base import Collector, CollectorContext
from dlprof.keys import Kind
from dlprof.schedule import Action

FORWARD = "forward"
BACKWARD = "backward"


class LayersCollector(Collector):
    name = "layers"
    description = "nn.Module hooks: forward and backward time per layer"

    @classmethod
    def available(cls) -> tuple[bool, str]:
        if importlib.util.find_spec("torch") is None:
            return False, "torch is not installed (pip install 'dlprof[torch]')"
        return True, ""

    @classmethod
    def version(cls) -> str:
        return importlib.metadata.version("torch")

    def start(self, context: CollectorContext) -> None:
        import torch
        from torch.nn.modules import module as module_hooks

        self._torch = torch
        self._context = context
        self._slices = context.slices
        self._kind = self._slices.kind_code(Kind.MODULE)
        self._names: weakref.WeakKeyDictionary[Any, tuple[int, int]] = weakref.WeakKeyDictionary()
        self._local = threading.local()
        self._calls = _Calls()
        self._handles = [
            module_hooks.register_module_forward_pre_hook(self._pre_forward),
            module_hooks.register_module_forward_hook(self._post_forward),
        ]

    def stop(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._record_backward(final=True)

    def on_step(self, step: int, previous: Action, action: Action) -> None:
        self._record_backward(final=False)

    # --- forward ------------------------------------------------------------------------------

    def _stack(self) -> list[tuple[int, int]]:
        stack: list[tuple[int, int]] | None = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def _pre_forward(self, module: Any, args: tuple[Any, ...]) -> None:
        if not self._context.action.records:
            return
        stack = self._stack()
        if not stack and module not in self._names:
            # The outermost module names every layer below it by its path.
            for path, child in module.named_modules():
                self._name(child, path or type(module).__name__)
        parent = stack[-1][1] if stack else -1
        index = self._calls.open(parent, _first_grad_fn(args))
        stack.append((time.perf_counter_ns(), index))

    def _post_forward(self, module: Any, args: tuple[Any, ...], output: Any) -> None:
        stack = self._stack()
        if not stack:
            return  # recording began inside this module's forward
        end = time.perf_counter_ns()
        start, index = stack.pop()
        forward_code, backward_code = self._names.get(module) or self._name(module, type(module).__name__)
        tid = threading.get_native_id()
        self._slices.record(self._kind, forward_code, tid, start, end, _tensor_bytes(output))
        self._calls.name[index] = backward_code
        if self._torch.is_grad_enabled():
            self._watch_backward(index, output)

    def _name(self, module: Any, path: str) -> tuple[int, int]:
        label = f"{path} ({type(module).__name__})"
        codes = (
            self._slices.intern(f"{label} {FORWARD}"),
            self._slices.intern(f"{label} {BACKWARD}"),
        )
        self._names[module] = codes
        return codes

    # --- backward -----------------------------------------------------------------------------

    def _watch_backward(self, index: int, output: Any) -> None:
        node = _first_grad_fn((output,))
        if node is None:
            return
        calls = self._calls

        def started(grad_outputs: Any) -> None:
            if calls.start[index] == 0:
                calls.start[index] = time.perf_counter_ns()
                calls.tid[index] = threading.get_native_id()

        def node_done(grad_inputs: Any, grad_outputs: Any) -> None:
            calls.node_end[index] = time.perf_counter_ns()

        node.register_prehook(started)
        node.register_hook(node_done)
        input_node = calls.input_node[index]
        if input_node is not None and input_node is not node:

            def reached_input(grad_outputs: Any) -> None:
                if calls.end[index] == 0:
                    calls.end[index] = time.perf_counter_ns()

            input_node.register_prehook(reached_input)
        calls.input_node[index] = None  # do not keep the graph alive

    def _record_backward(self, final: bool) -> None:
        """Record the backward slices of the calls whose backward has run."""
        calls = self._calls
        count = len(calls.parent)
        end = [e or n for e, n in zip(calls.end, calls.node_end, strict=True)]
        start = list(calls.start)
        tid = list(calls.tid)
        for index in range(count - 1, -1, -1):  # children come after their parent
            parent = calls.parent[index]
            if parent < 0 or start[index] == 0:
                continue
            if start[parent] == 0 or start[index] < start[parent]:
                start[parent] = start[index]
                tid[parent] = tid[index]
            end[parent] = max(end[parent], end[index])
        for index in range(count):
            if start[index] and end[index] > start[index] and calls.name[index] >= 0:
                self._slices.record(self._kind, calls.name[index], tid[index], start[index], end[index])
        calls.clear()


class _Calls:
    """Per forward call, columns that the backward hooks fill in."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.parent: list[int] = []
        self.name: list[int] = []
        self.start: list[int] = []
        self.end: list[int] = []
        self.node_end: list[int] = []
        self.tid: list[int] = []
        self.input_node: list[Any] = []

    def open(self, parent: int, input_node: Any) -> int:
        self.parent.append(parent)
        self.name.append(-1)
        self.start.append(0)
        self.end.append(0)
        self.node_end.append(0)
        self.tid.append(0)
        self.input_node.append(input_node)
        return len(self.parent) - 1


def _first_grad_fn(values: tuple[Any, ...]) -> Any:
    """The autograd node of the first tensor (looking into tuples, lists, dicts) that has one."""
    for value in values:
        node = getattr(value, "grad_fn", None)
        if node is not None:
            return node
        if isinstance(value, (tuple, list)):
            node = _first_grad_fn(tuple(value))
        elif isinstance(value, dict):
            node = _first_grad_fn(tuple(value.values()))
        if node is not None:
            return node
    return None


def _tensor_bytes(value: Any) -> int:
    size = getattr(value, "untyped_storage", None)
    if size is not None and hasattr(value, "element_size"):
        return int(value.numel() * value.element_size())
    if isinstance(value, (tuple, list)):
        return sum(_tensor_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    return 0


COLLECTOR = LayersCollector
