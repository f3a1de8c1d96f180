"""What dlprof needs of torch.compile's Dynamo: its own code kept out of Dynamo's frame
evaluation, and how many graphs the program compiled.

While a compiled function runs, Dynamo evaluates every Python frame its thread starts: a frame
of a file it does not skip (dlprof's are not torch's) is compiled. dlprof's hooks run inside
compiled code in two ways. Traced, they are inlined into the caller's graph, and do nothing
there (they test ``torch.compiler.is_compiling()`` first). Called from a frame Dynamo runs
uncompiled (``module.compile()`` of a torch.nn container: Dynamo skips torch.nn's frames), they
would be compiled as frames of their own: a frame in Dynamo's counters that the program does not
have, and the hook replaced by its traced, empty version. So their code, and everything they
call, is marked to run as written (a "skip" exec strategy, for the frame and its callees), which
changes nothing Dynamo traces::

    watch = keep_out_of_dynamo([LayersCollector._pre_forward.__code__])
    ...
    watch.cancel()      # at stop, if the program never imported torch._dynamo

The marks are set when the program imports ``torch._dynamo`` (at once if it has): a program that
never compiles never loads Dynamo for dlprof's sake.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from types import CodeType, ModuleType
from typing import Any

from dlprof.support.import_watch import ImportWatch, when_imported


def keep_out_of_dynamo(codes: Iterable[CodeType]) -> ImportWatch:
    """Have Dynamo run these code objects' frames, and what they call, as written.

    Args:
        codes: the code objects (``function.__code__``; :func:`nested_codes` for closures).

    Returns:
        The watch for ``torch._dynamo``'s import (done already if it was imported: the marks are
        set); cancel it when the code is no longer used.
    """
    wanted = tuple(codes)

    def mark(module: ModuleType) -> None:
        _mark(wanted)

    return when_imported("torch._dynamo", mark)


def nested_codes(function: Callable[..., Any]) -> list[CodeType]:
    """The code objects of the functions defined inside ``function`` (its closures), not its own."""
    found: list[CodeType] = []
    pending = [function.__code__]
    while pending:
        code = pending.pop()
        inner = [const for const in code.co_consts if isinstance(const, CodeType)]
        found.extend(inner)
        pending.extend(inner)
    return found


def _mark(codes: tuple[CodeType, ...]) -> None:
    try:
        from torch._C._dynamo.eval_frame import _FrameAction as FrameAction
        from torch._C._dynamo.eval_frame import _FrameExecStrategy as FrameExecStrategy
        from torch._C._dynamo.eval_frame import set_code_exec_strategy
    except ImportError:  # a torch without exec strategies: Dynamo may compile these frames
        return
    for code in codes:
        set_code_exec_strategy(code, FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP))


def compiled_graphs() -> int:
    """How many graphs torch.compile has compiled in this process (0 if Dynamo was never loaded:
    it is not loaded for the asking)."""
    dynamo_utils = sys.modules.get("torch._dynamo.utils")
    return int(dynamo_utils.counters["stats"]["unique_graphs"]) if dynamo_utils is not None else 0
