"""Steps from Keras: under ``dlprof run`` each training batch of ``Model.fit`` ends a step.

Once the program has imported Keras, ``keras.Model.fit`` is wrapped so that every fit gets one
more callback: its ``on_train_batch_begin`` starts the session's step again and its
``on_train_batch_end`` ends it (steps are then named ``ProfilerStep#N``, as with PyTorch). So a
step is one training batch: the validation a fit runs after an epoch's last batch, the epoch's
callbacks and the next epoch's iterator fall between two steps, in none. While a fit runs it owns the steps
(:attr:`CollectorContext.step_owner`), so a torch optimizer stepped inside it ends none.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from types import ModuleType
from typing import Any

from dlprof.collectors.base import Collector, CollectorContext, StepSource


class KerasFitSteps(Collector):
    """The wrapper around ``keras.Model.fit``, installed and removed as a whole."""

    name = "keras_steps"
    description = "a training step ends with each batch of a Keras Model.fit"
    requires = ("keras", "tf")
    framework = "keras"
    internal = True

    def start(self, context: CollectorContext) -> None:
        import keras

        self._context = context
        self._installed: tuple[Any, Any] | None = None  # (the Model class, its own fit)
        self._install(keras)

    def stop(self) -> None:
        self._uninstall()

    def _install(self, keras: ModuleType) -> None:
        model_class = keras.Model
        original = model_class.fit
        signature = inspect.signature(original)
        callback = _callback_class(keras)
        context = self._context

        def owned(action: Callable[[], None]) -> Callable[[], None]:
            """The action, taken only while this fit ends the steps (not a program that calls
            dlprof.step() itself, nor an outer fit)."""
            def when_owner() -> None:
                if context.step_owner is StepSource.KERAS_FIT:
                    action()
            return when_owner

        @functools.wraps(original)
        def fit_with_steps(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            steps = callback(owned(context.restart_step), owned(context.step))
            bound.arguments["callbacks"] = [*(bound.arguments.get("callbacks") or []), steps]
            owner = context.step_owner
            if owner is None:
                context.step_owner = StepSource.KERAS_FIT
            try:
                return original(*bound.args, **bound.kwargs)
            finally:
                if context.step_owner is StepSource.KERAS_FIT:
                    context.step_owner = owner

        model_class.fit = fit_with_steps
        self._installed = (model_class, original)

    def _uninstall(self) -> None:
        if self._installed is not None:
            model_class, original = self._installed
            model_class.fit = original
            self._installed = None


def _callback_class(keras: ModuleType) -> Callable[[Callable[[], None], Callable[[], None]], Any]:
    class DlprofSteps(keras.callbacks.Callback):  # type: ignore[misc,name-defined]
        """Times dlprof's step around each training batch."""

        def __init__(self, begin_step: Callable[[], None], end_step: Callable[[], None]) -> None:
            super().__init__()
            self._begin_step = begin_step
            self._end_step = end_step

        def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            self._begin_step()

        def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            self._end_step()

    return DlprofSteps


COLLECTOR = KerasFitSteps
