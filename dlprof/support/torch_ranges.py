"""torch ranges (``record_function``) that stay open across a cut of the recording.

A ``record_function`` entered while Kineto records keeps, in C++, a pointer into that recording's
event buffers; exited after the recording was stopped and a new one started, it writes into the
freed buffers of the old one (a segmentation fault, or ``std::bad_alloc`` later). torch.profiler's
own schedule has the same hazard; DistributedDataParallel's forward, ``Optimizer.step`` and a
DataLoader's ``__next__`` are such ranges, so a save inside a step can land in one.

So the ranges the program enters on the profiling thread while recording are followed: at each
stop of the recording they are ended in it (innermost first, as Kineto would end them), and at
the next start they are entered again (outermost first), so that the program's own exit ends
them in the recording they belong to. A range split this way is one slice per recording it
spans; the splits are counted for the run's notes.

What runs inside a C++ range and calls back into Python cannot be split:
:meth:`RangeCuts.inside_cpp_range` says so, and no save is made there. Such Python is a custom
``autograd.Function``'s forward, the autograd engine's nodes, a ``__torch_dispatch__`` (a tensor
subclass or mode, called from inside the op it handles), a custom op's Python kernel, and all of
torch.compile: Dynamo and Inductor time their compilation with C++ ranges
(``_RecordFunctionFast``, seconds long), and a compiled region runs inside C++ ranges
(``Torch-Compiled Region``, ``## Call CompiledFxGraph ##``) while its Python wrapper code calls
the kernels. A save made there stopped the recording those ranges write into when they end: the
process was killed by SIGSEGV.

The wrappers' own bookkeeping is dlprof's: a failure there goes to ``on_failure`` (the torch
collector then stops recording for good, so no range it lost track of can be cut), while
torch's ``__enter__`` and ``__exit__`` run outside it and what they raise is the program's.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Callable
from types import FrameType
from typing import Any

# What failed, as the collector's reason says it.
WRAPPER = "its record_function wrapper"


class RangeCuts:
    """Follows the program's ``record_function`` ranges and splits them at the recording's cuts."""

    def __init__(self, on_failure: Callable[[str, BaseException], None]) -> None:
        import torch
        from torch.autograd.profiler import record_function

        self._on_failure = on_failure
        self._torch = torch
        self._class: Any = record_function
        self._originals: tuple[Any, Any] | None = None
        self._wrappers: tuple[Any, Any] | None = None
        self._thread = threading.get_ident()  # the profiling thread: Kineto follows its ranges only
        self._open: dict[int, Any] = {}  # ranges entered while recording and not exited, in entry order
        self._suspended: set[int] = set()  # ended at a stop, to be entered again at the next start
        self._recording = False
        self._uninstalling = False  # asked to go while ended ranges were still open
        self.splits: Counter[str] = Counter()  # range name -> times split at a cut

    def install(self) -> None:
        enter, exit_ = self._class.__enter__, self._class.__exit__
        cuts = self

        def entered(instance: Any) -> Any:
            result = enter(instance)  # the program's range: what it raises is its own
            if cuts._recording and threading.get_ident() == cuts._thread:
                try:
                    cuts._open[id(instance)] = instance
                except Exception as failure:  # noqa: BLE001  dlprof's failure is never the program's
                    cuts._on_failure(WRAPPER, failure)
            return result

        def exited(instance: Any, *exception: Any) -> Any:
            key = id(instance)
            if cuts._open.pop(key, None) is None or key not in cuts._suspended:
                return exit_(instance, *exception)
            # Ended at a stop and not entered again: there is nothing left to end in C++.
            cuts._suspended.discard(key)
            try:
                instance.run_callbacks_on_exit = False
            except Exception as failure:  # noqa: BLE001  dlprof's failure is never the program's
                cuts._on_failure(WRAPPER, failure)
                return None  # its C++ range ended at the stop: nothing is left to end
            try:
                return exit_(instance, *exception)
            finally:
                try:
                    instance.run_callbacks_on_exit = True
                    if cuts._uninstalling and not cuts._suspended:
                        cuts._restore()
                except Exception as failure:  # noqa: BLE001  dlprof's failure is never the program's
                    cuts._on_failure(WRAPPER, failure)

        self._originals = (enter, exit_)
        self._wrappers = (entered, exited)
        self._class.__enter__, self._class.__exit__ = entered, exited

    def uninstall(self) -> None:
        """Stop following ranges; ranges ended at the last stop and still open keep the wrapper
        until they exit (torch's own exit would end them a second time)."""
        self._recording = False
        self._open = {key: instance for key, instance in self._open.items() if key in self._suspended}
        if self._suspended:
            self._uninstalling = True
        else:
            self._restore()

    def _restore(self) -> None:
        # A later session may have wrapped these wrappers: they then stay, passing calls through.
        if self._originals is not None and (self._class.__enter__, self._class.__exit__) == self._wrappers:
            self._class.__enter__, self._class.__exit__ = self._originals
        self._originals = None
        self._uninstalling = False

    def started(self) -> None:
        """The recording has started: enter the ranges ended at the last stop again."""
        self._recording = True
        enter = self._torch.ops.profiler._record_function_enter_new
        for key, instance in self._open.items():
            if key in self._suspended:
                instance.record = enter(instance.name, instance.args)
                self._suspended.discard(key)

    def stopping(self) -> None:
        """The recording is about to stop: end the open ranges in it, innermost first."""
        self._recording = False
        end = self._torch.ops.profiler._record_function_exit._RecordFunction
        for key, instance in reversed(list(self._open.items())):
            if key in self._suspended or instance.record is None or not instance.run_callbacks_on_exit:
                continue
            end(instance.record)
            self._suspended.add(key)
            self.splits[instance.name] += 1

    def inside_cpp_range(self) -> bool:
        """Whether Python code called from inside a C++ range runs on this thread now (see the
        module's docstring): an autograd node, a custom ``autograd.Function``'s forward, a
        ``__torch_dispatch__``, a custom op's kernel, torch.compile compiling or a compiled
        region running."""
        if self._torch._C._current_autograd_node() is not None:
            return True
        function_base = self._torch._C._FunctionBase
        frame: FrameType | None = sys._getframe(1)
        while frame is not None:
            code = frame.f_code
            if code.co_name == "__torch_dispatch__":
                return True
            if code.co_name == "forward" and isinstance(frame.f_locals.get("ctx"), function_base):
                return True
            if (str(frame.f_globals.get("__name__", "")).startswith(_INSIDE_CPP_RANGES)
                    and not code.co_qualname.startswith(_DYNAMO_DISABLED)):
                return True
            frame = frame.f_back
        return False


# torch's modules whose Python runs inside C++ ranges: torch.compile's (compiling, and running a
# compiled region: every compiled call passes through torch._dynamo.eval_frame), and the wrappers
# custom ops' Python kernels run in, called from inside the op's dispatch.
_INSIDE_CPP_RANGES = ("torch._dynamo.", "torch._inductor.", "torch._functorch._aot_autograd.",
                      "torch._library.")
# Dynamo's wrapper of a function it must not compile (torch._dynamo.disable, which eager torch
# code uses too: activation checkpointing, an optimizer's state_dict) opens no range itself; one
# called from a compiled region has that region's wrapper further down the stack.
_DYNAMO_DISABLED = "DisableContext."
