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
"""

from __future__ import annotations

import functools
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
        self._driver: Any = None
        self._wrapped: list[Any] = []
        # The wrapper of the optimizer's step is left to Dynamo (what it calls is the program's).
        self._outside_dynamo = keep_out_of_dynamo([step.__code__, OptimizerSteps._first_sight.__code__,
                                                   *(code for code in nested_codes(OptimizerSteps._first_sight)
                                                     if code.co_name != "step_then_mark")])
        self._handle = register_optimizer_step_pre_hook(self._first_sight)

    def _first_sight(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._compiling():
            return
        if self._driver is None:
            self._driver = optimizer
        if optimizer is self._driver and _WRAPPED not in optimizer.__dict__:
            original = optimizer.step
            end_step = self._step
            compiling = self._compiling

            @functools.wraps(original)
            def step_then_mark(*a: Any, **k: Any) -> Any:
                result = original(*a, **k)
                if not compiling():
                    end_step()
                return result

            # This call is already under way: end its step from inside, this once.
            once: Any = None

            def end_first_step(*_: Any) -> None:
                if compiling():
                    return
                once.remove()
                end_step()

            once = optimizer.register_step_post_hook(end_first_step)

            optimizer.__dict__[_WRAPPED] = True
            optimizer.step = step_then_mark
            self._wrapped.append(optimizer)

    def stop(self) -> None:
        self._handle.remove()
        self._outside_dynamo.cancel()
        for optimizer in self._wrapped:
            optimizer.__dict__.pop("step", None)
            optimizer.__dict__.pop(_WRAPPED, None)
        self._wrapped.clear()


COLLECTOR = OptimizerSteps
