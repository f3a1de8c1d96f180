"""Run a function once a module has been imported: now if it has been, else when the program does.

    watch = when_imported("tensorflow", start_profiling)
    ...
    watch.cancel()          # no longer wanted: the program never imported it

A collector of a framework the program may never use (TensorFlow in a PyTorch script) waits
this way instead of importing the framework itself: importing TensorFlow takes seconds and
starts its runtime. The watch is a finder at the front of ``sys.meta_path`` that answers only
for that one module: it wraps the module's loader so that the function runs right after the
module's own code (the whole package ``__init__``) has run, and then steps aside.

The import is the program's: the module's own code and the other finders run outside any
``try`` of the watch, so what they raise reaches the program as it would without dlprof. The
callback is dlprof's: what it raises goes to ``on_failure`` (by default one line on stderr),
never into the program's import statement.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from dlprof.text import printable

Callback = Callable[[ModuleType], None]
# Told what a callback raised, and the module it was waiting for.
OnFailure = Callable[[str, BaseException], None]


def say_failure(name: str, failure: BaseException) -> None:
    """The default for a callback that fails: one line on stderr."""
    print(f"dlprof: after the import of {name}: {printable(f'{type(failure).__name__}: {failure}')}",
          file=sys.stderr)


class ImportWatch(importlib.abc.MetaPathFinder):
    """Waits for one module's import to finish."""

    def __init__(self, name: str, callback: Callback, on_failure: OnFailure = say_failure) -> None:
        self.name = name
        self._callback: Callback | None = callback
        self._on_failure = on_failure
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
        except Exception:  # noqa: BLE001  the program's finders: the import system asks them again,
            return None    # and what they raise reaches the program from there, as without dlprof
        finally:
            self._searching = False
        if spec is None or spec.loader is None:
            return None
        spec.loader = _ThenCall(spec.loader, self._imported)
        return spec

    def _imported(self, module: ModuleType) -> None:
        callback = self._callback
        try:
            self.cancel()
            if callback is not None:
                callback(module)
        except Exception as failure:  # noqa: BLE001  dlprof's failure is never the program's import's
            self._on_failure(self.name, failure)


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


def when_imported(name: str, callback: Callback, on_failure: OnFailure = say_failure) -> ImportWatch:
    """Call ``callback(module)`` once ``name`` is imported (at once if it already is).

    Args:
        name: a top-level module name (``"tensorflow"``, ``"keras"``).
        callback: told the module; it runs inside the program's import statement.
        on_failure: told the module's name and what ``callback`` raised, instead of the program.

    Returns:
        The watch; :meth:`ImportWatch.cancel` stops waiting.
    """
    watch = ImportWatch(name, callback, on_failure)
    module = sys.modules.get(name)
    if module is not None:
        watch._imported(module)
    else:
        sys.meta_path.insert(0, watch)
    return watch
