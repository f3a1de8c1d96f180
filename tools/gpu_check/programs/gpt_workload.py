"""A GPT-style language model in plain torch, trained on random tokens: the GPU check's own workload
for the overhead and recordings parts (until ``bench/workloads/`` has one; see :mod:`tools.gpu_check.workloads`).

    python tools/gpu_check/programs/gpt_workload.py --steps 20                 # cuda, bf16 autocast
    python tools/gpu_check/programs/gpt_workload.py --device cpu --steps 2 --vocab 256 --width 64 --seq 32

The shape of ``tests/data/h200/gpt_train.py`` (the H200 recording's program): 6 pre-norm blocks of
width 768 and 12 heads, vocabulary 50,257, sequence 512, batch 8, AdamW, bf16 autocast on CUDA,
one ``optimizer.step()`` per step; written out in plain torch (no transformers), causal attention
through ``scaled_dot_product_attention``. On the CPU it trains in float32.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.nn import functional


class Block(nn.Module):
    """One pre-norm transformer block: causal self-attention, then a GELU MLP, each residual."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        attended = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, width))
        mixed: torch.Tensor = self.mlp(self.norm2(x))
        return x + mixed


class GPT(nn.Module):
    """Token and position embeddings, the blocks, a final norm and the vocabulary head."""

    def __init__(self, vocab: int, seq: int, layers: int, width: int, heads: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(seq, width)
        self.blocks = nn.Sequential(*(Block(width, heads) for _ in range(layers)))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        logits: torch.Tensor = self.head(self.norm(self.blocks(self.tokens(ids) + self.positions(positions))))
        return logits


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--device", default="cuda", help="cuda (bf16 autocast) or cpu (float32)")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    device = torch.device(args.device)
    model = GPT(args.vocab, args.seq, args.layers, args.width, args.heads).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    on_gpu = device.type == "cuda"
    started = time.perf_counter()
    for step in range(args.steps):
        ids = torch.randint(0, args.vocab, (args.batch, args.seq), device=device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=on_gpu):
            logits = model(ids)
            loss = functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 10 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
    if on_gpu:
        torch.cuda.synchronize(device)
    print(f"trained {args.steps} steps in {time.perf_counter() - started:.2f} s", flush=True)


if __name__ == "__main__":
    main()  # no sys.exit: under bench/bare_profiler.py a SystemExit would skip the trace's export
