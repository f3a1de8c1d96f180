"""Steps from the optimizer: under ``dlprof run`` each ``optimizer.step()`` ends a training step.

The wrapper is set on the optimizer instance, outside torch's own ``Optimizer.step#...`` range,
so the step boundary falls after the optimizer's work rather than inside it. The first call of
an optimizer, under way when it is first seen, ends its step from a post-hook instead; only the first optimizer seen drives steps
(a GAN's two optimizers make one step, not two). The session starts this once the program imports
torch, so a program that never does (a Keras one) does not load it; inside a Keras fit, Keras's
batches end the steps instead (:mod:`dlprof.collectors.keras_steps`).

An optimizer's step traced by torch.compile (a compiled training step) ends no step: the hook and
the wrapper test ``torch.compiler.is_compiling()`` first and do nothing when Dynamo traces them,
so the compiled code holds no trace of dlprof; such a program ends its steps with
``dlprof.step()`` outside the compiled function.

The wrapper is a method bound to the optimizer, as the step it replaces is: an LR scheduler
created after the first step wraps ``optimizer.step.__func__`` in turn. The optimizer's own step
runs outside the hook's and the wrapper's ``try``, so its exceptions reach the program as they
are; a failure of dlprof's part stops this collector (``Collector.hook_failed``), and the
wrapper then only calls the step.
"""

from __future__ import annotations

import functools
import types
from typing import Any

from dlprof.collectors.base import Collector, CollectorContext, StepSource
from dlprof.support.dynamo import keep_out_of_dynamo, nested_codes

_WRAPPED = "_dlprof_step_wrapper"


class OptimizerSteps(Collector):
    name = "optimizer_steps"
    description = "a training step ends with each optimizer.step()"
    requires = ("torch", "torch")
    framework = "torch"
    internal = True

    def start(self, context: CollectorContext) -> None:
        import torch
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self._compiling = torch.compiler.is_compiling

        def step() -> None:
            if context.step_owner in (None, StepSource.OPTIMIZER):  # not inside a Keras fit
                context.step()

        self._step = step
        self._live = True  # False once stopped: a wrapper left in place only calls the step
        self._driver: Any = None
        self._wrapped: list[Any] = []
        # The wrapper of the optimizer's step is left to Dynamo (what it calls is the program's).
        self._outside_dynamo = keep_out_of_dynamo([step.__code__, OptimizerSteps._first_sight.__code__,
                                                   OptimizerSteps._wrap.__code__,
                                                   *(code for code in nested_codes(OptimizerSteps._wrap)
                                                     if code.co_name != "step_then_mark")])
        self._handle = register_optimizer_step_pre_hook(self._first_sight)

    def _first_sight(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._compiling():
            return
        try:
            if self._driver is None:
                self._driver = optimizer
            if optimizer is self._driver and _WRAPPED not in optimizer.__dict__:
                self._wrap(optimizer)
        except Exception as failure:  # noqa: BLE001  dlprof's failure is never the program's
            self.hook_failed("its optimizer step pre-hook", failure)

    def _wrap(self, optimizer: Any) -> None:
        original = optimizer.step
        end_step = self._step
        compiling = self._compiling
        collector = self

        @functools.wraps(original)
        def step_then_mark(optimizer: Any, *a: Any, **k: Any) -> Any:
            result = original(*a, **k)  # the program's step: what it raises is the program's
            if not compiling() and collector._live:
                end_step()  # the session's: never raises
            return result

        # This call is already under way: end its step from inside, this once.
        once: Any = None

        def end_first_step(*_: Any) -> None:
            if compiling():
                return
            once.remove()
            if collector._live:
                end_step()

        once = optimizer.register_step_post_hook(end_first_step)
        optimizer.step = types.MethodType(step_then_mark, optimizer)
        optimizer.__dict__[_WRAPPED] = optimizer.__dict__["step"]
        self._wrapped.append(optimizer)

    def stop(self) -> None:
        self._live = False
        self._handle.remove()
        self._outside_dynamo.cancel()
        for optimizer in self._wrapped:
            wrapper = optimizer.__dict__.pop(_WRAPPED, None)
            # A wrapper of the program's own (an LR scheduler's) around dlprof's stays: it calls
            # the step through dlprof's, which only calls it from now on.
            if optimizer.__dict__.get("step") is wrapper:
                del optimizer.__dict__["step"]
        self._wrapped.clear()


COLLECTOR = OptimizerSteps
