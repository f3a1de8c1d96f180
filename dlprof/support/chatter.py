"""Profilers' chatter on file descriptor 2, kept from the user's terminal.

torch.profiler (Kineto) and TensorFlow's profiler write lines from C++ straight to fd 2 when they
start and stop::

    with hidden_chatter(lambda line: line.startswith(b"USDT:")):
        profiler.start()
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def hidden_chatter(is_chatter: Callable[[bytes], bool]) -> Iterator[None]:
    """Hold fd 2 while a profiler starts or stops, then pass on every line but its chatter.

    Profilers write from C++ straight to file descriptor 2; anything else written meanwhile (by
    any thread) is shown once the moment has passed.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().splitlines(keepends=True) if not is_chatter(line)]
            if kept:
                os.write(2, b"".join(kept))
