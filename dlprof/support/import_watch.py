"""Run a function once a module has been imported: now if it has been, else when the program does.

    watch = when_imported("tensorflow", start_profiling)
    ...
    watch.cancel()          # no longer wanted: the program never imported it

A collector of a framework the program may never use (TensorFlow in a PyTorch script) waits
this way instead of importing the framework itself: importing TensorFlow takes seconds and
starts its runtime. The watch is a finder at the front of ``sys.meta_path`` that answers only
for that one module: it wraps the module's loader so that the function runs right after the
module's own code (the whole package ``__init__``) has run, and then steps aside.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

Callback = Callable[[ModuleType], None]


class ImportWatch(importlib.abc.MetaPathFinder):
    """Waits for one module's import to finish."""

    def __init__(self, name: str, callback: Callback) -> None:
        self.name = name
        self._callback: Callback | None = callback
        self._searching = False

    def cancel(self) -> None:
        """Stop waiting (the callback will not run)."""
        self._callback = None
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name or self._searching or self._callback is None:
            return None
        self._searching = True
        try:  # the other finders' answer (this one answers None meanwhile)
            spec = importlib.util.find_spec(fullname)
        finally:
            self._searching = False
        if spec is None or spec.loader is None:
            return None
        spec.loader = _ThenCall(spec.loader, self._imported)
        return spec

    def _imported(self, module: ModuleType) -> None:
        callback = self._callback
        self.cancel()
        if callback is not None:
            callback(module)


class _ThenCall(importlib.abc.Loader):
    """A module's own loader, followed by a call once the module's code has run."""

    def __init__(self, loader: Any, then: Callback) -> None:
        self._loader = loader
        self._then = then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        created: ModuleType | None = self._loader.create_module(spec)
        return created

    def exec_module(self, module: ModuleType) -> None:
        # Whoever asks the module for its loader (resources, pkgutil) gets the real one.
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        self._then(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


def when_imported(name: str, callback: Callback) -> ImportWatch:
    """Call ``callback(module)`` once ``name`` is imported (at once if it already is).

    Args:
        name: a top-level module name (``"tensorflow"``, ``"keras"``).
        callback: told the module; it runs inside the program's import statement.

    Returns:
        The watch; :meth:`ImportWatch.cancel` stops waiting.
    """
    watch = ImportWatch(name, callback)
    module = sys.modules.get(name)
    if module is not None:
        watch._imported(module)
    else:
        sys.meta_path.insert(0, watch)
    return watch
