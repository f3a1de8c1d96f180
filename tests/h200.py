"""The GPT-2-style run dlprof recorded on an NVIDIA H200 (``data/h200``), for the tests of every
GPU analysis: a fixture's copy, never the recording itself, is what a command reads."""

from __future__ import annotations

import shutil
from pathlib import Path

H200_RUN = Path(__file__).resolve().parent / "data" / "h200" / "gpt2-dlprof-run"


def h200_copy(parent: Path) -> Path:
    """A copy of the H200 run under ``parent``: a command that could write to a run writes there."""
    copied = parent / H200_RUN.name
    shutil.copytree(H200_RUN, copied)
    return copied
