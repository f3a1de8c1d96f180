"""Steps ended by the optimizer, on real torch optimizers: LR schedulers wrap the step too, an
optimizer's own failure is the program's, and dlprof's failure there never is."""

from __future__ import annotations

import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import dlprof
from dlprof.config import ProfileConfig
from dlprof.recording.session import Session

pytestmark = pytest.mark.torch

torch = pytest.importorskip("torch", reason="needs PyTorch (pip install 'dlprof[torch]')")


def session(out: Path) -> Session:
    """A session whose steps the optimizer ends, as under ``dlprof run``."""
    return Session(ProfileConfig(out=out, name="steps", collectors=("host",), auto_steps=True))


def train(optimizer: torch.optim.Optimizer, model: torch.nn.Module, steps: int,
          after: Callable[[], Any] = lambda: None) -> None:
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.ones(2, 4)).sum().backward()
        optimizer.step()
        after()


def step_names(out: Path) -> list[str]:
    steps = dlprof.load(out).slices
    return sorted(steps[steps.kind == "step"].name, key=lambda name: int(name.split("#")[1]))


def test_an_lr_scheduler_made_after_the_first_step_wraps_dlprofs_wrapper(tmp_path: Path) -> None:
    """Before, StepLR(optimizer) made after a step failed in the program with AttributeError:
    'function' object has no attribute '__func__' (it wraps optimizer.step.__func__)."""
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    with warnings.catch_warnings():
        # The scheduler warns if it saw no optimizer step before its own.
        warnings.filterwarnings("error", category=UserWarning, module="torch.optim.lr_scheduler")
        with session(tmp_path / "run"):
            train(optimizer, model, 2)
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
            train(optimizer, model, 2, scheduler.step)
        train(optimizer, model, 2, scheduler.step)  # after profiling, through the scheduler's wrapper
    assert optimizer.param_groups[0]["lr"] == 0.5**4
    assert step_names(tmp_path / "run") == [f"ProfilerStep#{n}" for n in range(5)]
    assert dlprof.load(tmp_path / "run").manifest.degraded == []


class FrozenSGD(torch.optim.SGD):  # type: ignore[misc]
    """An optimizer of the program's that refuses new attributes once made."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._frozen = True

    def __setattr__(self, name: str, value: Any) -> None:
        if getattr(self, "_frozen", False):
            raise AttributeError(f"{type(self).__name__} is frozen: cannot set {name}")
        super().__setattr__(name, value)


def test_an_optimizer_dlprof_cannot_wrap_stops_the_collector_not_the_step(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before, the AttributeError of dlprof's wrapping reached the program's optimizer.step()."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    expected = torch.nn.Linear(4, 4)
    expected.load_state_dict(model.state_dict())
    train(FrozenSGD(expected.parameters(), lr=0.1), expected, 3)
    with session(tmp_path / "run"):
        train(FrozenSGD(model.parameters(), lr=0.1), model, 3)
    assert torch.equal(model.weight, expected.weight), "every step of the program was taken"
    reason = ("optimizer_steps collector: recording failed (AttributeError: FrozenSGD is frozen: cannot set step) "
              "in its optimizer step pre-hook after step 0: its recording stopped")
    assert dlprof.load(tmp_path / "run").manifest.degraded == [reason]
    assert capsys.readouterr().err == f"dlprof: {reason}; the program goes on\n"


def test_the_optimizers_own_exception_reaches_the_program_unchanged(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def closure() -> torch.Tensor:
        raise FloatingPointError("the loss diverged")

    with session(tmp_path / "run"):
        train(optimizer, model, 2)  # its step is dlprof's wrapper from the first on
        with pytest.raises(FloatingPointError, match=r"^the loss diverged$") as raised:
            optimizer.step(closure)
    assert traceback.extract_tb(raised.value.__traceback__)[-1].name == "closure"
    assert dlprof.load(tmp_path / "run").manifest.degraded == []
