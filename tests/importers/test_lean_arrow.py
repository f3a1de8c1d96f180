"""Arrow set up for ``dlprof import`` (dlprof.importers.lean_arrow), in fresh processes: pyarrow's
pandas check skipped without breaking pandas for whoever asks for it, an allocator that hands
memory back."""

from __future__ import annotations

import subprocess
import sys


def run_python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_arrays_from_python_values_load_no_pandas_and_pandas_still_works_when_asked_for() -> None:
    out = run_python(
        "import sys\n"
        "from dlprof.importers.lean_arrow import skip_pandas_check\n"
        "skip_pandas_check()\n"
        "import pyarrow as pa, pyarrow.compute as pc\n"
        "table = pa.table({'a': pa.array([1, 2]), 'b': pc.add(pa.array([1, 2]), 1)})\n"
        "print('pandas' in sys.modules)\n"
        "frame = table.to_pandas()\n"
        "print(type(frame).__name__, list(frame['b']))\n")
    # Without the skip, the first pa.array imports pandas (pyarrow's lazy check), so this
    # would print True first.
    assert out.splitlines() == ["False", "DataFrame [2, 3]"]


def test_the_allocator_is_one_that_hands_memory_back() -> None:
    out = run_python(
        "import pyarrow as pa\n"
        "from dlprof.importers.lean_arrow import hand_back_freed_memory\n"
        "hand_back_freed_memory()\n"
        "print(pa.default_memory_pool().backend_name)\n")
    assert out in ("jemalloc", "system")
