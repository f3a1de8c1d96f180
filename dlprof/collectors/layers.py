"""The layer view: forward and backward time of every ``nn.Module``, with or without torch.profiler.

Forward time comes from global module forward pre/post hooks. Backward time does not use full
backward hooks (they wrap tensors in a function that breaks in-place modules such as
``ReLU(inplace=True)``): a module's backward starts when the autograd node that produced its
output starts, and ends when the node that produced its input is reached, or when its own node
ends for a module whose input needs no gradient. A container's backward spans its children's.

Forward slices are named ``<path> (<Class>) forward``, backward ones ``... backward``; ``bytes``
holds the size of the forward's output tensors (the activation memory the layer keeps).

Under torch.compile the hooks do nothing while Dynamo traces them (``torch.compiler.is_compiling()``
is their first test, which Dynamo folds to a constant): the compiled code holds no trace of
them, so dlprof adds no graph break, guard or recompilation, and layers inside a compiled region
are not timed. Run uncompiled inside a compiled call (Dynamo skips torch.nn's own frames), they
are kept out of Dynamo's reach (:mod:`dlprof.support.dynamo`) and time as in eager code.
A module compiled with ``torch.compile(module)`` is called through its ``OptimizedModule``
outside the compiled code, and is timed there under the original module's name (its forward and
backward are the compiled region's); the layers of one compiled with ``module.compile()`` are
timed where Dynamo leaves them uncompiled, and not where it compiles them. torch warns that global hooks fire for the
``OptimizedModule``; that is what dlprof wants, so the warning, which the program would not
print unprofiled, is not shown while the collector runs.

With counters configured (``profile(counters=[...])``), the counters are read at each slice's
boundaries (forward: the pre- and post-hook; backward: the autograd pre-hook that starts it and
the marker that ends it) and their deltas become metrics rows of the slice, as for steps and
regions. In thread scope, backward work on another thread than the one counted records nothing.
"""

from __future__ import annotations

import threading
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any, cast

from dlprof.collectors.base import Collector, CollectorContext
from dlprof.keys import Kind
from dlprof.schedule import Action
from dlprof.store.save_jobs import OpenSlice
from dlprof.support.dynamo import compiled_graphs, keep_out_of_dynamo, nested_codes

FORWARD = "forward"
BACKWARD = "backward"


class LayersCollector(Collector):
    name = "layers"
    description = "nn.Module hooks: forward and backward time per layer"
    requires = ("torch", "torch")
    framework = "torch"
    default = True

    def start(self, context: CollectorContext) -> None:
        import torch
        from torch.nn.modules import module as module_hooks

        self._grad_enabled = torch.is_grad_enabled
        self._in_backward = torch._C._current_autograd_node
        self._compiling = torch.compiler.is_compiling
        self._slices = context.slices
        self._kind = self._slices.kind_code(Kind.MODULE)
        # id(module) -> (weak reference, forward code, backward code); a WeakKeyDictionary
        # would build a weak reference on every lookup, and this runs twice per module call.
        self._names: dict[int, tuple[weakref.ref[Any], int, int]] = {}
        # id() of the modules a torch.compile wrapper (OptimizedModule) holds: the wrapper's call
        # is the layer's slice, and the module's own call inside it (where Dynamo leaves the
        # hooks uncompiled) is not another.
        self._compiled: set[int] = set()
        self._local = threading.local()
        self._recording = context.action.records
        self._calls: list[list[Any]] = []
        # None without counters: then the hooks pay one attribute check for them, nothing more.
        self._reader = context.counter_reader
        self._record_counts = context.record_counts
        self._outside_dynamo = keep_out_of_dynamo([
            LayersCollector._pre_forward.__code__, LayersCollector._post_forward.__code__,
            *nested_codes(_watch_backward), _end.__code__,
        ])
        warnings.filterwarnings("ignore", message=COMPILED_MODULE_WARNING, category=UserWarning)
        self._warning_filter = warnings.filters[0]
        self._handles = [
            module_hooks.register_module_forward_pre_hook(self._pre_forward),
            module_hooks.register_module_forward_hook(self._post_forward),
        ]

    def stop(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._outside_dynamo.cancel()
        # An ignore filter leaves nothing in the warning registries: removing it is enough.
        filters = cast(list[Any], warnings.filters)  # a list, which typeshed calls a Sequence
        if self._warning_filter in filters:
            filters.remove(self._warning_filter)
        self._record_backward()
        if compiled_graphs():
            self.notes.append(COMPILED_NOTE)

    def on_step(self, step: int, previous: Action, action: Action) -> None:
        self._recording = action.records
        self._record_backward()

    def save(self) -> None:
        """A save inside a step: the backwards that have run join it, with the autograd ops they
        span (those yet to run wait for theirs)."""
        self._record_backward(keep_unstarted=True)

    def save_would_split(self) -> bool:
        """Inside a backward (a Python hook of the autograd engine): the layers under way there
        are timed around ops the profiler hands over at the save."""
        return self._in_backward() is not None

    def open_slices(self) -> list[OpenSlice]:
        """The forwards under way on the saving thread (the one a save runs on)."""
        opened = []
        tid = threading.get_native_id()
        for start, call, module in getattr(self._local, "stack", ()):
            codes = self._codes(module)
            if codes is None:
                continue
            if call[_FORWARD_ID] < 0:
                call[_FORWARD_ID] = self._slices.reserve_id()
            opened.append(OpenSlice(call[_FORWARD_ID], self._slices.pid, tid, Kind.MODULE,
                                    self._slices.name_of(codes[0]), self._slices.epoch_ns(start)))
        return opened

    # --- forward ------------------------------------------------------------------------------

    def _pre_forward(self, module: Any, args: tuple[Any, ...]) -> None:
        # First, before any attribute is read: Dynamo traces nothing past it (a guard on
        # _recording would recompile at each change of the schedule).
        if self._compiling() or not self._recording:
            return
        # The module's own code runs outside this hook: what raises here is dlprof's (a try costs
        # nothing until something is raised).
        try:
            try:
                stack: list[tuple[int, list[Any], Any]] = self._local.stack
            except AttributeError:
                stack = self._local.stack = []
            if (self._compiled and id(module) in self._compiled and stack
                    and getattr(stack[-1][2], _COMPILED_ORIGINAL, None) is module):
                return  # called by its torch.compile wrapper, timed as this layer already
            codes = self._codes(module)
            if not stack and codes is None:
                # The outermost module names every layer below it by its path.
                top = _class_name(module)
                for path, child in module.named_modules():
                    self._name(child, _layer_path(path) or top)
            elif codes is not None and self._slices.is_throttled(codes[0]):
                self._slices.count_untimed(codes[0])  # counted, not traced (as TAU throttles)
                return
            call = [stack[-1][1] if stack else None, -1, 0, 0, 0, 0, _first_grad_fn(args), (), (), (), (), -1]
            self._calls.append(call)
            reader = self._reader
            if reader is not None:
                call[_FORWARD_COUNTS] = reader()
            stack.append((time.perf_counter_ns(), call, module))
        except Exception as failure:  # noqa: BLE001  dlprof's failure is never the program's
            self._stop_hooks("its forward pre-hook", failure)

    def _post_forward(self, module: Any, args: tuple[Any, ...], output: Any) -> None:
        if self._compiling():
            return
        try:
            stack: list[tuple[int, list[Any], Any]] | None = getattr(self._local, "stack", None)
            if not stack:
                return  # recording began inside this module's forward
            if stack[-1][2] is not module:
                # Forwards that raised inside this one (the program caught it) never reached this
                # hook: theirs are dropped. Not on the stack: begun before recording, or throttled.
                depth = next((i for i in range(len(stack) - 1, -1, -1) if stack[i][2] is module), None)
                if depth is None:
                    return
                del stack[depth + 1:]
            end = time.perf_counter_ns()
            start, call, _ = stack.pop()
            codes = self._codes(module) or self._name(module, _class_name(module))
            reader = self._reader
            after = reader() if reader is not None else ()
            slice_id = self._slices.record(
                self._kind, codes[0], threading.get_native_id(), start, end, _tensor_bytes(output),
                call[_FORWARD_ID],
            )
            if slice_id < 0:  # throttled from this call on: no backward either
                call[_NAME] = -1
                call[_INPUT_NODE] = None
                return
            if reader is not None:
                self._record_counts(slice_id, call[_FORWARD_COUNTS], after)
                call[_FORWARD_COUNTS] = ()
            call[_NAME] = codes[1]
            input_node = call[_INPUT_NODE]
            call[_INPUT_NODE] = None  # do not keep the graph alive
            if self._grad_enabled():
                _watch_backward(call, _first_grad_fn((output,)), input_node, reader, self._stop_hooks)
        except Exception as failure:  # noqa: BLE001  dlprof's failure is never the program's
            self._stop_hooks("its forward hook", failure)

    def _stop_hooks(self, where: str, failure: BaseException) -> None:
        """A hook failed: the hooks stop timing at once (on every thread), and the session
        stops the collector and says why."""
        self._recording = False
        self.hook_failed(where, failure)

    def _codes(self, module: Any) -> tuple[int, int] | None:
        entry = self._names.get(id(module))
        if entry is None or entry[0]() is not module:
            return None
        return entry[1], entry[2]

    def _name(self, module: Any, path: str) -> tuple[int, int]:
        if type(module).__name__ == _COMPILED_WRAPPER:
            self._compiled.add(id(getattr(module, _COMPILED_ORIGINAL)))
        label = f"{path} ({_class_name(module)})"
        forward = self._slices.intern(f"{label} {FORWARD}")
        backward = self._slices.intern(f"{label} {BACKWARD}")
        self._names[id(module)] = (weakref.ref(module), forward, backward)
        return forward, backward

    # --- backward -----------------------------------------------------------------------------

    def _record_backward(self, keep_unstarted: bool = False) -> None:
        """Record the backward slices of the calls whose backward has run; ``keep_unstarted``:
        keep the calls whose backward has not begun (a save between a forward and its backward),
        else drop them (a step's forwards without a backward, as in evaluation)."""
        calls, self._calls = self._calls, []
        for call in reversed(calls):  # children come after their parent
            if call[_END] == 0:
                call[_END], call[_END_COUNTS] = call[_NODE_END], call[_NODE_END_COUNTS]
            parent = call[_PARENT]
            if parent is None or call[_START] == 0:
                continue
            if parent[_START] == 0 or call[_START] < parent[_START]:
                parent[_START], parent[_START_COUNTS] = call[_START], call[_START_COUNTS]
                parent[_TID] = call[_TID]
            if parent[_END] == 0:
                parent[_END], parent[_END_COUNTS] = parent[_NODE_END], parent[_NODE_END_COUNTS]
            if call[_END] > parent[_END]:  # the counts go with the end they were read at
                parent[_END], parent[_END_COUNTS] = call[_END], call[_END_COUNTS]
        for call in calls:
            start, end = call[_START], call[_END]
            if keep_unstarted and not start:
                self._calls.append(call)
            elif start and end > start and call[_NAME] >= 0:
                slice_id = self._slices.record(self._kind, call[_NAME], call[_TID], start, end)
                if self._reader is not None:
                    self._record_counts(slice_id, call[_START_COUNTS], call[_END_COUNTS])


# What torch says when a module compiled with torch.compile(module) is called while global
# module hooks are registered (torch/_dynamo/eval_frame.py, OptimizedModule.__call__).
COMPILED_MODULE_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks"
COMPILED_NOTE = ("torch.compile: layers inside compiled code are not timed (a hook there would change "
                 "what Dynamo compiles); a compiled module is one layer holding its compiled region, "
                 "and the layers Dynamo leaves uncompiled (torch.nn's own containers) are timed")
# torch.compile's wrapper of a module, and the attribute it holds the module in; a path through
# it names the same layer as the module's own path.
_COMPILED_WRAPPER = "OptimizedModule"
_COMPILED_ORIGINAL = "_orig_mod"


def _class_name(module: Any) -> str:
    """A module's class, the original's for torch.compile's OptimizedModule wrapper."""
    return type(getattr(module, _COMPILED_ORIGINAL, module)).__name__


def _layer_path(path: str) -> str:
    """A module's path, without the steps through torch.compile's wrappers
    (``encoder._orig_mod.fc`` is ``encoder.fc``, as in the eager model)."""
    return ".".join(part for part in path.split(".") if part and part != _COMPILED_ORIGINAL)


# One forward call: [parent call, backward name code, backward start, backward end,
# end of the call's own autograd node, backward thread, autograd node of its input, then the
# counter readings (empty without counters) at the forward's start, the backward's start, the
# backward's end and the node's end, then the forward's slice id if a save found it open (-1)].
(_PARENT, _NAME, _START, _END, _NODE_END, _TID, _INPUT_NODE,
 _FORWARD_COUNTS, _START_COUNTS, _END_COUNTS, _NODE_END_COUNTS, _FORWARD_ID) = range(12)


def _watch_backward(call: list[Any], node: Any, input_node: Any,
                    reader: Callable[[], tuple[int, ...]] | None,
                    failed: Callable[[str, BaseException], None]) -> None:
    """Time a call's backward: from its output's node starting to its input's node being reached.

    A call whose input needs no gradient has no input node; then its own node's end closes it.
    With a counter ``reader``, the counters are read at the same two moments. The autograd
    hooks run inside the program's ``backward()``: a failure of theirs goes to ``failed``.
    """
    if node is None:
        return

    def started(grad_outputs: Any) -> None:
        if call[_START] == 0:
            try:
                if reader is not None:
                    call[_START_COUNTS] = reader()
                call[_START] = time.perf_counter_ns()
                call[_TID] = threading.get_native_id()
            except Exception as failure:  # noqa: BLE001  dlprof's failure is never the program's
                failed("its backward hook", failure)

    node.register_prehook(started)
    if input_node is not None and input_node is not node:

        def reached_input(grad_outputs: Any) -> None:
            if call[_END] == 0:
                _end(call, _END, _END_COUNTS, reader, failed)

        input_node.register_prehook(reached_input)
    else:

        def node_done(grad_inputs: Any, grad_outputs: Any) -> None:
            _end(call, _NODE_END, _NODE_END_COUNTS, reader, failed)

        node.register_hook(node_done)


def _end(call: list[Any], end: int, counts: int, reader: Callable[[], tuple[int, ...]] | None,
         failed: Callable[[str, BaseException], None]) -> None:
    """Keep the time now, then the counters, in ``call[end]`` and ``call[counts]``."""
    try:
        call[end] = time.perf_counter_ns()
        if reader is not None:
            call[counts] = reader()
    except Exception as failure:  # noqa: BLE001  dlprof's failure is never the program's
        failed("its backward hook", failure)


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
