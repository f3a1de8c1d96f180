"""The program's own torch.profiler, noticed as it starts while dlprof's records.

One process records one torch.profiler (Kineto) at a time. A second one that starts while
dlprof's records takes Kineto's state over: the program's profiler works, and dlprof's next stop
reads a trace that is gone (a segmentation fault in Kineto's ``ActivityTraceWrapper::save``). So
while the torch collector runs, every preparation of a profiler that is not dlprof's own
(``torch.autograd.profiler._prepare_profiler``, which ``torch.profiler.profile`` and
``torch.autograd.profiler.profile`` call first) is told to the collector before it happens; the
collector ends its recording there and records no more, and the program's profiler starts as it
would have without dlprof::

    watch = ProgramProfilers(on_program_profiler=collector.give_way, on_failure=collector.hook_failed)
    watch.install()
    with watch.own():
        kineto.prepare_trace()      # dlprof's own: not told
    watch.uninstall()

What the collector does there is dlprof's: a failure of it goes to ``on_failure``, and the
program's profiler starts all the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class ProgramProfilers:
    """Tells the collector when the program prepares a torch.profiler of its own."""

    def __init__(self, on_program_profiler: Callable[[], None],
                 on_failure: Callable[[str, BaseException], None]) -> None:
        import torch.autograd.profiler as autograd_profiler

        self._module: Any = autograd_profiler
        self._on_program_profiler = on_program_profiler
        self._on_failure = on_failure
        self._original: Any = None
        self._wrapper: Any = None
        self._own = 0  # dlprof's own calls under way
        self._watching = False

    def install(self) -> None:
        # torch.autograd.profiler.profile._prepare_trace finds _prepare_profiler among its
        # module's globals at each call: replacing it there is seen by every profiler.
        original = self._module._prepare_profiler
        watch = self

        def prepare(*args: Any, **kwargs: Any) -> Any:
            if watch._watching and not watch._own:
                try:
                    watch._on_program_profiler()
                except Exception as failure:  # noqa: BLE001  dlprof's failure is never the program's
                    watch._on_failure("giving way to the program's torch.profiler", failure)
            return original(*args, **kwargs)  # the program's profiler: what it raises is its own

        self._original, self._wrapper = original, prepare
        self._module._prepare_profiler = prepare
        self._watching = True

    def uninstall(self) -> None:
        # A later session may have wrapped this wrapper: it then stays, passing calls through.
        self._watching = False
        if self._wrapper is not None and self._module._prepare_profiler is self._wrapper:
            self._module._prepare_profiler = self._original
        self._original = self._wrapper = None

    @contextmanager
    def own(self) -> Iterator[None]:
        """dlprof's own profiler calls, within the block."""
        self._own += 1
        try:
            yield
        finally:
            self._own -= 1
