"""ParaDnn-style parameterised models (Wang, Wei and Brooks, 2019), each trained for a few steps
under a profiling session: what ``dlprof sweep`` runs for each point of its grid.

    point = Point(Family.FC, layers=4, width=256, batch=64, input=128)
    profile_point(point, torch_device(DeviceType.CPU), Path("sweep/fc-l4-w256-b64-i128"), steps=5)

A family reads a point's width and input as follows:

- ``fc``: ``layers`` Linear+ReLU layers of ``width`` units on ``input`` features, then a
  10-class Linear head.
- ``cnn``: ``layers`` 3x3 Conv2d+ReLU layers (plain convolutions, as ResNet's without the
  shortcuts) of ``width`` channels on 3-channel ``input`` x ``input`` images, then global average
  pooling and a 10-class Linear head.
- ``rnn``: an ``layers``-layer LSTM of ``width`` hidden units over sequences of ``input`` steps of
  ``width`` features, then a 10-class Linear head on the last step.

A training step is forward, cross-entropy loss, backward and an SGD step. The ``rnn`` family runs
PyTorch's own LSTM (oneDNN's and cuDNN's fused RNNs off), whose per-step GEMMs are ops with FLOPs
the profiler counts; a fused RNN is one op with none.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from itertools import product
from pathlib import Path
from typing import TYPE_CHECKING

from dlprof.config import ProfileConfig
from dlprof.schedule import Schedule
from dlprof.workloads.torch_device import synchronize

if TYPE_CHECKING:
    import torch

CLASSES = 10  # outputs of every model's head
WARMUP_STEPS = 2  # steps run before the profiled ones, never recorded (the schedule's warm-up)


class Family(StrEnum):
    """``--family``: the kind of model."""

    FC = "fc"
    CNN = "cnn"
    RNN = "rnn"


@dataclass(frozen=True)
class Point:
    """One model of the grid and the data it trains on."""

    family: Family
    layers: int
    width: int  # units (fc), channels (cnn), hidden units (rnn)
    batch: int
    input: int  # features (fc), image side (cnn), sequence length (rnn)

    @property
    def name(self) -> str:
        """The point's run directory name: ``fc-l2-w64-b16-i32``."""
        return f"{self.family}-l{self.layers}-w{self.width}-b{self.batch}-i{self.input}"


def grid(families: list[Family], layers: list[int], widths: list[int], batches: list[int],
         inputs: list[int]) -> list[Point]:
    """Every combination of the values, family by family, smallest first within each."""
    return [Point(f, *values) for f in families
            for values in product(sorted(layers), sorted(widths), sorted(batches), sorted(inputs))]


@dataclass(frozen=True)
class Workload:
    """A point's model, optimizer and one batch, on its device."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    inputs: torch.Tensor
    labels: torch.Tensor

    def train_step(self) -> None:
        """Forward, loss, backward and an SGD step."""
        import torch

        with _unfused(self.model):
            loss = torch.nn.functional.cross_entropy(self.model(self.inputs), self.labels)
            loss.backward()  # type: ignore[no-untyped-call]
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    @property
    def parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def model(point: Point) -> torch.nn.Module:
    """The point's model, on the CPU, in fp32."""
    from torch import nn

    if point.family is Family.FC:
        fc: list[nn.Module] = []
        for index in range(point.layers):
            fc += [nn.Linear(point.input if index == 0 else point.width, point.width), nn.ReLU()]
        return nn.Sequential(*fc, nn.Linear(point.width, CLASSES))
    if point.family is Family.CNN:
        convs: list[nn.Module] = []
        for index in range(point.layers):
            convs += [nn.Conv2d(3 if index == 0 else point.width, point.width, 3, padding=1), nn.ReLU()]
        return nn.Sequential(*convs, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(point.width, CLASSES))
    return _recurrent(point.layers, point.width)


def _recurrent(layers: int, width: int) -> torch.nn.Module:
    """An LSTM and a head on its last step's output (the class is made here, where torch is
    imported)."""
    from torch import nn

    class Recurrent(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = nn.LSTM(width, width, num_layers=layers, batch_first=True)
            self.head = nn.Linear(width, CLASSES)

        def forward(self, inputs: torch.Tensor) -> torch.Tensor:
            output, _ = self.lstm(inputs)
            result: torch.Tensor = self.head(output[:, -1])
            return result

    return Recurrent()


@contextmanager
def _unfused(built: torch.nn.Module) -> Iterator[None]:
    """For a model with an LSTM: oneDNN and cuDNN off (their fused RNN ops have no FLOPs)."""
    import torch

    if not any(isinstance(m, torch.nn.LSTM) for m in built.modules()):
        yield
        return
    backends = (torch.backends.mkldnn, torch.backends.cudnn)
    before = [b.enabled for b in backends]
    for backend in backends:
        backend.enabled = False  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for backend, enabled in zip(backends, before, strict=True):
            backend.enabled = enabled  # type: ignore[attr-defined]


def batch_shape(point: Point) -> tuple[int, ...]:
    """The shape of one batch of the point's inputs."""
    if point.family is Family.FC:
        return (point.batch, point.input)
    if point.family is Family.CNN:
        return (point.batch, 3, point.input, point.input)
    return (point.batch, point.input, point.width)


def workload(point: Point, device: torch.device, seed: int = 0) -> Workload:
    """The point's model, an SGD optimizer and a random batch, on ``device``."""
    import torch

    torch.manual_seed(seed)
    built = model(point).to(device)
    inputs = torch.randn(batch_shape(point), device=device)
    labels = torch.randint(0, CLASSES, (point.batch,), device=device)
    return Workload(built, torch.optim.SGD(built.parameters(), lr=0.01), inputs, labels)


def warm_up_profiler(point: Point, device: torch.device) -> None:
    """Train ``point`` a few steps under a bare torch.profiler recording, kept nowhere.

    The first recording in a process pays torch's and Kineto's one-time start-up in its steps
    (tens of milliseconds a step here); the sweep's first point must not.
    """
    from torch.profiler import profile

    work = workload(point, device)
    with profile(record_shapes=True, profile_memory=True, with_flops=True):
        for _ in range(WARMUP_STEPS):
            work.train_step()
            synchronize(device)


def profile_point(point: Point, device: torch.device, out: Path, steps: int) -> Workload:
    """Train the point's model under a profiling session that writes the run ``out``.

    The first :data:`WARMUP_STEPS` steps are the schedule's warm-up (not recorded); the next
    ``steps`` are recorded, each ended by a step call.

    Args:
        point: the model and batch.
        device: where it runs.
        out: the run directory (missing or empty).
        steps: profiled steps.

    Returns:
        The workload that ran (for its parameter count).
    """
    from dlprof.recording.session import Session

    work = workload(point, device)
    config = ProfileConfig(out=out, name=point.name, collectors=("torch",),
                           schedule=Schedule(warmup=WARMUP_STEPS, active=steps, repeat=1))
    with Session(config) as session:
        for _ in range(WARMUP_STEPS + steps):
            work.train_step()
            synchronize(device)
            session.step()
    return work
