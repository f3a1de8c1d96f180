"""``python -m dlprof``: the same command line as ``dlprof`` (so ``torchrun -m dlprof run`` works)."""

from dlprof.cli.main import entry

entry()
