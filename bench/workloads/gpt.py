"""A GPT-style language model trained the way nanoGPT trains one, in plain PyTorch: token and
position embeddings, pre-norm transformer blocks (causal self-attention through
``scaled_dot_product_attention``, a GELU MLP), a tied output head, AdamW with weight decay on the
matrices only, gradient accumulation over micro-batches, gradient clipping and a cosine learning
rate. The data are random tokens (a character vocabulary by default), drawn a micro-batch at a
time as nanoGPT's ``get_batch`` does. Each iteration prints its time, as nanoGPT's
``train.py`` does, so a benchmark reads the step times from the output.

    python bench/workloads/gpt.py                        # about a million profiler events a minute on CPU
    python bench/workloads/gpt.py --preset nanogpt       # nanoGPT's train.py at 2 layers, width 64
    python bench/workloads/gpt.py --device cuda --dtype bfloat16 --iterations 20
    dlprof run bench/workloads/gpt.py --preset nanogpt --iterations 10
"""

from __future__ import annotations

import argparse
import math
import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional


@dataclass(frozen=True)
class Shape:
    layers: int
    width: int
    heads: int
    block: int  # tokens of context
    batch: int  # sequences per micro-batch
    accumulation: int  # micro-batches per optimizer step (one iteration)
    iterations: int


PRESETS = {
    # Sized so that torch.profiler records about a million events a minute on one CPU thread.
    "gpt": Shape(layers=4, width=128, heads=4, block=128, batch=8, accumulation=4, iterations=60),
    # nanoGPT's train.py with its default 40 micro-batches per iteration, made small enough for
    # a CPU (--n_layer=2 --n_embd=64 --block_size=64 --batch_size=8).
    "nanogpt": Shape(layers=2, width=64, heads=4, block=64, batch=8, accumulation=40, iterations=40),
}


class SelfAttention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.out = nn.Linear(width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        q, k, v = (t.view(batch, tokens, self.heads, width // self.heads).transpose(1, 2)
                   for t in self.qkv(x).split(width, dim=2))
        y = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(batch, tokens, width))


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm_1 = nn.LayerNorm(width, bias=False)
        self.attention = SelfAttention(width, heads)
        self.norm_2 = nn.LayerNorm(width, bias=False)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width, bias=False), nn.GELU(),
                                 nn.Linear(4 * width, width, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm_1(x))
        return x + self.mlp(self.norm_2(x))


class LanguageModel(nn.Module):
    def __init__(self, vocabulary: int, shape: Shape) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocabulary, shape.width)
        self.positions = nn.Embedding(shape.block, shape.width)
        self.blocks = nn.ModuleList(Block(shape.width, shape.heads) for _ in range(shape.layers))
        self.norm = nn.LayerNorm(shape.width, bias=False)
        self.head = nn.Linear(shape.width, vocabulary, bias=False)
        self.head.weight = self.tokens.weight  # tied, as GPT-2's
        for name, parameter in self.named_parameters():
            if parameter.dim() == 2:
                # GPT-2's scaled initialisation of the projections into the residual stream.
                std = 0.02 / math.sqrt(2 * shape.layers) if name.endswith(("out.weight", "mlp.2.weight")) else 0.02
                nn.init.normal_(parameter, mean=0.0, std=std)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tokens(tokens) + self.positions(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        return functional.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def optimizer_for(model: nn.Module, learning_rate: float) -> torch.optim.Optimizer:
    """AdamW with weight decay on the matrices (embeddings and linear weights) only."""
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": matrices, "weight_decay": 0.1}, {"params": vectors, "weight_decay": 0.0}],
                             lr=learning_rate, betas=(0.9, 0.95))


def learning_rate_at(iteration: int, peak: float, warmup: int, total: int) -> float:
    """Linear warm-up, then a cosine down to a tenth of the peak."""
    if iteration < warmup:
        return peak * (iteration + 1) / (warmup + 1)
    progress = min(1.0, (iteration - warmup) / max(1, total - warmup))
    return peak / 10 + 0.5 * (1.0 + math.cos(math.pi * progress)) * (peak - peak / 10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="gpt")
    parser.add_argument("--iterations", type=int, default=None, help="optimizer steps (default: the preset's)")
    parser.add_argument("--accumulation", type=int, default=None, help="micro-batches per iteration")
    parser.add_argument("--vocabulary", type=int, default=65, help="65: Shakespeare's characters")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="bfloat16: the forward under autocast, as nanoGPT on a GPU")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    preset = PRESETS[args.preset]
    iterations = args.iterations if args.iterations is not None else preset.iterations
    accumulation = args.accumulation if args.accumulation is not None else preset.accumulation
    torch.set_num_threads(args.threads)
    torch.manual_seed(1337)
    device = torch.device(args.device)
    model = LanguageModel(args.vocabulary, preset).to(device)
    optimizer = optimizer_for(model, learning_rate=1e-3)
    autocast = (torch.autocast(device_type=device.type, dtype=torch.bfloat16) if args.dtype == "bfloat16"
                else nullcontext())
    corpus = torch.randint(args.vocabulary, (200_000,), generator=torch.Generator().manual_seed(0))

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(len(corpus) - preset.block - 1, (preset.batch,))
        x = torch.stack([corpus[s:s + preset.block] for s in starts.tolist()])
        y = torch.stack([corpus[s + 1:s + 1 + preset.block] for s in starts.tolist()])
        return x.to(device, non_blocking=True), y.to(device, non_blocking=True)

    print(f"{sum(p.numel() for p in model.parameters()):,} parameters; {accumulation} micro-batches of "
          f"{preset.batch}x{preset.block} tokens per iteration", flush=True)
    began = time.perf_counter()
    x, y = batch()
    for iteration in range(iterations):
        started = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = learning_rate_at(iteration, 1e-3, warmup=max(1, iterations // 10), total=iterations)
        for _ in range(accumulation):
            with autocast:
                loss = model(x, y) / accumulation
            x, y = batch()
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        lossf = loss.item() * accumulation  # a synchronisation point on a GPU, as nanoGPT's logging
        print(f"iter {iteration}: loss {lossf:.4f}, time {(time.perf_counter() - started) * 1000:.2f}ms", flush=True)
    print(f"trained {iterations} iterations in {time.perf_counter() - began:.1f}s", flush=True)


if __name__ == "__main__":
    main()
