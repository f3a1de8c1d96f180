"""``python -m dlprof``: the same command line as ``dlprof`` (so ``torchrun -m dlprof run`` works)."""

from __future__ import annotations

from dlprof.cli.main import entry

entry()
