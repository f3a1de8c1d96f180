"""Small real PyTorch runs that the advice rules judge: one trained with the habits the rules
name, one trained the way they advise, and the recorded GPU traces as runs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import dlprof
from tests.builders import write_imported_run
from tests.conftest import KINETO_TRACES

STEPS = 7
SLOW_BATCH_S = 0.03  # the bad run's dataset: long enough that waiting for it dominates a step
# The good run's steps: long enough that neither noise nor the workers' hand-over (a few ms on
# a busy machine) makes them unsteady or input-bound.
STEADY_STEP_S = 0.1


def _train(out: Path, *, bias: bool, workers: int, foreach: bool, set_to_none: bool, batch_s: float,
           pause_s: tuple[float, ...], index_loop: int) -> Path:
    torch = pytest.importorskip("torch", reason="needs PyTorch (pip install 'dlprof[torch]')")
    from torch import nn
    from torch.utils.data import DataLoader, Dataset

    class Images(Dataset[Any]):
        def __len__(self) -> int:
            return 8 * (STEPS + 1)

        def __getitem__(self, index: int) -> tuple[Any, int]:
            time.sleep(batch_s / 8)
            return torch.randn(3, 12, 12), index % 4

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, bias=bias), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                          nn.Linear(8 * 10 * 10, 4))
    optimizer = torch.optim.Adam(model.parameters(), foreach=foreach)
    loader = DataLoader(Images(), batch_size=8, num_workers=workers)
    with dlprof.profile(out=out, collectors=("torch", "layers")) as prof:
        for step, (inputs, labels) in enumerate(loader):
            loss = nn.functional.cross_entropy(model(inputs), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=set_to_none)
            scores = loss.detach().repeat(index_loop)
            for position in range(index_loop):  # a Python loop over a tensor's elements
                scores[position].item()
            time.sleep(pause_s[step % len(pause_s)])
            prof.step()
    return out


@pytest.fixture(scope="package")
def habits_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A slow dataset loaded without workers, Adam(foreach=False), zero_grad writing zeros, a
    biased convolution into batch norm, a Python loop indexing a tensor, and every other step
    held back by a pause."""
    return _train(tmp_path_factory.mktemp("advice") / "habits", bias=True, workers=0, foreach=False,
                  set_to_none=False, batch_s=SLOW_BATCH_S, pause_s=(0.0, 0.15), index_loop=300)


@pytest.fixture(scope="package")
def advised_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same model trained as the rules advise: workers, foreach, set_to_none, no bias before
    batch norm, no indexing loop, steps of equal length."""
    return _train(tmp_path_factory.mktemp("advice") / "advised", bias=False, workers=2, foreach=True,
                  set_to_none=True, batch_s=0.0, pause_s=(STEADY_STEP_S,), index_loop=0)


def _imported(tmp_path_factory: pytest.TempPathFactory, folder: str) -> Path:
    (trace,) = (KINETO_TRACES / folder).glob("*.json.gz")
    return write_imported_run(tmp_path_factory.mktemp("advice-gpu") / trace.parent.name, trace, (0,))


@pytest.fixture(scope="package")
def v100_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A recorded V100 (sm 7.0) training job: FP32 GEMMs on volta_sgemm kernels, apex FusedAdam."""
    return _imported(tmp_path_factory, "trace_diff/test")


@pytest.fixture(scope="package")
def a100_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same job recorded on an A100 (sm 8.0): mostly TF32 tensor-op GEMMs, some ampere_sgemm."""
    return _imported(tmp_path_factory, "trace_diff/control")


