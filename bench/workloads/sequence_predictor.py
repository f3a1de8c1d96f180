"""A sequence predictor written the way many tutorials write one: an LSTM cell unrolled in a
Python loop over time steps, trained on synthetic sine waves. Many small ops per step (about
3,000), so a few hundred steps make about a million profiler events.

    python bench/workloads/sequence_predictor.py --steps 90
    dlprof run bench/workloads/sequence_predictor.py --steps 90
"""

from __future__ import annotations

import argparse
import math
import time

import torch
from torch import nn


class Predictor(nn.Module):
    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(1, hidden)
        self.head = nn.Linear(hidden, 1)
        self.hidden = hidden

    def forward(self, series: torch.Tensor) -> torch.Tensor:
        batch, length = series.shape
        h = series.new_zeros(batch, self.hidden)
        c = series.new_zeros(batch, self.hidden)
        outputs = []
        for t in range(length):
            h, c = self.cell(series[:, t : t + 1], (h, c))
            outputs.append(self.head(h))
        return torch.cat(outputs, dim=1)


def sine_batch(batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
    phase = torch.rand(batch, 1, generator=generator) * 2 * math.pi
    steps = torch.arange(length + 1, dtype=torch.float32) * 0.1
    return torch.sin(phase + steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=90)
    parser.add_argument("--length", type=int, default=40, help="time steps per sequence")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    model = Predictor()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    started = time.perf_counter()
    for step in range(args.steps):
        series = sine_batch(args.batch_size, args.length, generator)
        prediction = model(series[:, :-1])
        loss = nn.functional.mse_loss(prediction, series[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 100 == 0:
            print(f"step {step:4d}  loss {loss.item():.5f}", flush=True)
    print(f"trained {args.steps} steps in {time.perf_counter() - started:.1f}s", flush=True)


if __name__ == "__main__":
    main()
