"""Arrow set up for a process that only converts traces (``dlprof import``).

pyarrow asks once, lazily, whether pandas is installed: the first time an array is built from
Python values (``pa.array``, ``pa.scalar``, a compute function given a Python scalar) it imports
pandas to find out. That costs 0.3-0.5 s of CPU and about 45 MB in a process that never makes a
DataFrame. :func:`skip_pandas_check` makes that one check find no pandas; a call that needs
pandas itself (``Table.to_pandas``, ``Table.from_pandas``) still imports it when it is made.

Arrow's default allocator (mimalloc in the wheels) keeps what a piece of a trace freed for the
next, so a streamed import's memory stays at its largest piece's and more; jemalloc told to hand
freed pages back at once (the C library's allocator where Arrow has no jemalloc) does not, for
the same CPU time: the H200 trace's peak 311 to 290 MB, the 1M-event realistic trace's 586 to
542 MB (:func:`hand_back_freed_memory`)::

    skip_pandas_check()      # before the first Arrow array, in a command that needs no DataFrame
    hand_back_freed_memory()
"""

from __future__ import annotations

import sys
from importlib.machinery import ModuleSpec
from types import ModuleType


class _NoPandas:
    """A module finder under which ``import pandas`` fails, for the moment of pyarrow's check."""

    def find_spec(self, name: str, path: object = None, target: ModuleType | None = None) -> ModuleSpec | None:
        if name == "pandas":
            raise ImportError("pandas is not needed to convert traces")
        return None


def skip_pandas_check() -> None:
    """Settle pyarrow's check for pandas as "not installed", unless pandas is loaded already."""
    if "pandas" in sys.modules:
        return  # the process uses pandas: pyarrow's integration stays as it is
    import pyarrow as pa

    finder = _NoPandas()
    sys.meta_path.insert(0, finder)
    try:
        pa.array([0])  # the first array from Python values makes pyarrow check
    finally:
        sys.meta_path.remove(finder)


def hand_back_freed_memory() -> None:
    """Give Arrow an allocator that returns freed memory at once, for buffers allocated from now on."""
    import pyarrow as pa

    if "jemalloc" in pa.supported_memory_backends():
        pa.set_memory_pool(pa.jemalloc_memory_pool())
        pa.jemalloc_set_decay_ms(0)  # unused pages go back to the system now, not after 1 s
    else:
        pa.set_memory_pool(pa.system_memory_pool())
