"""Data-parallel training on the CPU: two ranks, the gloo backend, synthetic data.

    dlprof run --nproc 2 examples/ddp_train.py
    torchrun --nproc_per_node 2 -m dlprof run examples/ddp_train.py
    torchrun --nproc_per_node 2 examples/ddp_train.py      # the same, unprofiled

Each rank trains a small MLP on its own shard; DistributedDataParallel all-reduces the gradients
after every backward pass, and a DataLoader worker process prepares each rank's batches.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

import dlprof


class SyntheticData(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Random features and labels, made on demand (in the DataLoader's worker processes)."""

    def __init__(self, size: int, features: int, seed: int) -> None:
        self.size, self.features, self.seed = size, features, seed

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        x = torch.randn(self.features, generator=generator)
        return x, (x.sum() > 0).long()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="training steps per rank")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--workers", type=int, default=1, help="DataLoader worker processes per rank")
    args = parser.parse_args()

    torch.set_num_threads(1)  # ranks share the machine's cores
    if "RANK" not in os.environ:  # started without a launcher: a job of one
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29511")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial weights on every rank
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(args.features, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 2))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    data = DataLoader(
        SyntheticData(args.steps * args.batch_size, args.features, seed=rank),
        batch_size=args.batch_size,
        num_workers=args.workers,
    )
    for x, y in data:
        with dlprof.region("train_step"):
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()  # DDP all-reduces the gradients here
            optimizer.step()
    if rank == 0:
        print(f"trained {args.steps} steps on {world} ranks (pid {os.getpid()}), last loss {loss.item():.3f}")
    # The DDP model's reducer holds the process group: drop it first, so that the group ends in
    # destroy_process_group(), which stops gloo's threads with the GIL released. Ended later by
    # the reducer's destructor, it would join them holding the GIL while a thread still freeing
    # its last work waits for the GIL (torch 2.13; more likely while a profiler runs). And no
    # barrier just before this: it leaves one more such work behind.
    del model, optimizer, loss
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
