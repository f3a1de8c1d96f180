"""Steps from Keras: under ``dlprof run`` each training batch of ``Model.fit`` ends a step.

Once the program has imported Keras, ``keras.Model.fit`` is wrapped so that every fit gets one
more callback: its ``on_train_batch_begin`` starts the session's step again and its
``on_train_batch_end`` ends it (steps are then named ``ProfilerStep#N``, as with PyTorch). So a
step is one training batch: the validation a fit runs after an epoch's last batch, the epoch's
callbacks and the next epoch's iterator fall between two steps, in none. While a fit runs it owns the steps
(:attr:`CollectorContext.step_owner`), so a torch optimizer stepped inside it ends none.

The same callback records the fit's logs in the ``series`` table (for ``dlprof tta``): the
training metrics Keras gives at each epoch's end (``loss``, ``accuracy``: split ``train``), and
the validation's at its end (``on_test_end``, split ``eval``, named as the epoch's logs name them:
``val_loss``, ``val_accuracy``), between marks ``eval_start`` and ``eval_stop`` that time it.
Each value carries the epochs begun so far, so a target reached in the first epoch's validation
is reached in 1 epoch.

The fit is the program's: the wrapper calls it outside any ``try`` of its own, and a call it
cannot read (arguments Keras itself refuses) goes to Keras as it came, so Keras's own error
reaches the program. A failure of the callback's own work stops this collector
(``Collector.hook_failed``) and the fit goes on.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, TypeVar

from dlprof.collectors.base import Collector, CollectorContext, StepSource
from dlprof.keys import SeriesSource

# The marks around a validation, MLPerf's names for them (dlprof.analysis.tta reads them).
EVAL_START = "eval_start"
EVAL_STOP = "eval_stop"


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
        collector = self

        def owned(action: Callable[[], None]) -> Callable[[], None]:
            """The action, taken only while this fit ends the steps (not a program that calls
            dlprof.step() itself, nor an outer fit)."""
            def when_owner() -> None:
                if context.step_owner is StepSource.KERAS_FIT:
                    action()
            return when_owner

        @functools.wraps(original)
        def fit_with_steps(*args: Any, **kwargs: Any) -> Any:
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError:
                return original(*args, **kwargs)  # Keras refuses the call in its own words
            steps = callback(context, owned(context.restart_step), owned(context.step), collector.hook_failed)
            bound.arguments["callbacks"] = [*_as_list(bound.arguments.get("callbacks")), steps]
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


Failed = Callable[[str, BaseException], None]
Callback = TypeVar("Callback", bound=Callable[..., None])


def _guarded(method: Callback) -> Callback:
    """A callback method run inside the program's fit: what it raises stops the collector
    instead (once; the callback does nothing after), and the fit goes on."""
    @functools.wraps(method)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> None:
        if self._failed_once:
            return
        try:
            method(self, *args, **kwargs)
        except Exception as failure:  # noqa: BLE001  dlprof's failure is never the program's
            self._failed_once = True
            self._failed(f"its Keras callback ({method.__name__})", failure)

    return guarded  # type: ignore[return-value]


def _callback_class(keras: ModuleType) -> Callable[[CollectorContext, Callable[[], None], Callable[[], None], Failed],
                                                     Any]:
    class DlprofSteps(keras.callbacks.Callback):  # type: ignore[misc,name-defined]
        """Times dlprof's step around each training batch and records the fit's logs."""

        def __init__(self, context: CollectorContext, begin_step: Callable[[], None],
                     end_step: Callable[[], None], failed: Failed) -> None:
            super().__init__()
            self._context = context
            self._begin_step, self._end_step = begin_step, end_step
            self._failed, self._failed_once = failed, False
            self._epoch = 0  # epochs begun

        @_guarded
        def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            self._begin_step()

        @_guarded
        def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            self._end_step()

        @_guarded
        def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            self._epoch = epoch + 1

        @_guarded
        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            # Validation values were recorded at on_test_end, when they were known.
            values = [(k, v) for k, v in _numbers(logs) if not k.startswith("val_")]
            self._log("train", values)

        @_guarded
        def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
            self._log("eval", [(EVAL_START, None)])

        @_guarded
        def on_test_end(self, logs: dict[str, Any] | None = None) -> None:
            self._log("eval", [*((f"val_{k}", v) for k, v in _numbers(logs)), (EVAL_STOP, None)])

        def _log(self, split: str, values: Sequence[tuple[str, float | None]]) -> None:
            if values:
                self._context.log(SeriesSource.KERAS, split, values, epoch=float(self._epoch) or None)

    return DlprofSteps


def _as_list(callbacks: Any) -> list[Any]:
    """A fit's ``callbacks`` argument as a list: Keras takes a list, a tuple, None or a single
    callback (it flattens whatever it is given)."""
    if callbacks is None:
        return []
    if isinstance(callbacks, (list, tuple)):
        return list(callbacks)
    return [callbacks]


def _numbers(logs: dict[str, Any] | None) -> list[tuple[str, float]]:
    """The logs' values that are numbers (Keras gives floats, or 0-d tensors)."""
    found = []
    for name, value in (logs or {}).items():
        try:
            found.append((str(name), float(value)))
        except (TypeError, ValueError, OverflowError):  # not a number, or past a float's range
            continue
    return found


COLLECTOR = KerasFitSteps
