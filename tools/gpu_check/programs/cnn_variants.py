"""The bundled CNN (``examples/torch_cnn.py``'s model) as the recordings part runs it: fed by a
DataLoader with worker processes, or compiled with ``torch.compile(mode="reduce-overhead")`` so
that its steps run as CUDA graphs.

    python tools/gpu_check/programs/cnn_variants.py --workers 2 --steps 40 --device cuda
    python tools/gpu_check/programs/cnn_variants.py --compile reduce-overhead --steps 40 --device cuda
    python tools/gpu_check/programs/cnn_variants.py --workers 2 --steps 3 --device cpu   # anywhere

The batches are synthetic MNIST-shaped tensors made in ``__getitem__`` (in the workers when
there are any), one ``optimizer.step()`` per step.
"""

from __future__ import annotations

import argparse
import runpy
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "torch_cnn.py"


def example_model() -> type[nn.Module]:
    """The CNN class of ``examples/torch_cnn.py`` (a script, not a package's module)."""
    model: type[nn.Module] = runpy.run_path(str(EXAMPLE), run_name="torch_cnn_example")["CNN"]
    return model


class Synthetic(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """``count`` MNIST-shaped images with labels, each made from its index (the same in any worker)."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(index)
        return torch.randn(1, 28, 28, generator=generator), torch.randint(0, 10, (), generator=generator)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--compile", default=None, metavar="MODE",
                        help="torch.compile the model with this mode (reduce-overhead: CUDA graphs)")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    device = torch.device(args.device)
    model = example_model()().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    forward = torch.compile(model, mode=args.compile) if args.compile else model
    batches = DataLoader(Synthetic(args.steps * args.batch_size), batch_size=args.batch_size,
                         num_workers=args.workers, pin_memory=device.type == "cuda", drop_last=True)
    started = time.perf_counter()
    for step, (inputs, labels) in enumerate(batches):
        inputs, labels = inputs.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        if args.compile:
            # A new step: the last one's graph outputs may be overwritten.
            torch.compiler.cudagraph_mark_step_begin()  # type: ignore[no-untyped-call]
        loss = loss_fn(forward(inputs), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 10 == 0:
            print(f"step {step:4d}  loss {loss.item():.4f}", flush=True)
    print(f"trained {args.steps} steps in {time.perf_counter() - started:.1f}s", flush=True)


if __name__ == "__main__":
    main()  # no sys.exit: under bench/bare_profiler.py a SystemExit would skip the trace's export
