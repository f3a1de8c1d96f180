"""A small CNN trained on synthetic MNIST-shaped data, on the CPU: dlprof's bundled example.

    dlprof run examples/torch_cnn.py --steps 300
    dlprof run examples/torch_cnn.py --device cuda    # on a GPU: kernels, memcpy and memset too
    dlprof run examples/torch_cnn.py --compile        # the model compiled with torch.compile
    dlprof run examples/torch_cnn.py --compile max-autotune   # a torch.compile mode
    python examples/torch_cnn.py          # the same, unprofiled

Regions mark data loading and validation; under `dlprof run` each optimizer.step() ends a step.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

import dlprof


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def synthetic_batches(count: int, batch_size: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(batch_size, 1, 28, 28, generator=generator), torch.randint(0, 10, (batch_size,), generator=generator))
        for _ in range(count)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=800, help="training steps")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--device", default="cpu", help="where to train: cpu, cuda or cuda:N")
    parser.add_argument("--compile", nargs="?", const="default", default=None, metavar="MODE",
                        choices=["default", "reduce-overhead", "max-autotune"],
                        help="compile the model with torch.compile (MODE: default, reduce-overhead, max-autotune)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    model = CNN().to(device)
    forward = torch.compile(model, mode=args.compile) if args.compile else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    data = synthetic_batches(16, args.batch_size)
    started = time.perf_counter()
    for step in range(args.steps):
        with dlprof.region("data"):
            inputs, labels = data[step % len(data)]
            if device.type != "cpu":  # a host-to-device copy each step, as an input pipeline makes
                inputs, labels = inputs.to(device), labels.to(device)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(forward(inputs), labels)
        loss.backward()
        optimizer.step()
        if step % 100 == 0:
            print(f"step {step:4d}  loss {loss.item():.4f}")
    with dlprof.region("validate"), torch.no_grad():
        inputs, labels = (tensor.to(device) for tensor in data[0])
        accuracy = (forward(inputs).argmax(1) == labels).float().mean().item()
    print(f"trained {args.steps} steps in {time.perf_counter() - started:.1f}s, accuracy {accuracy:.2f}")


if __name__ == "__main__":
    main()
