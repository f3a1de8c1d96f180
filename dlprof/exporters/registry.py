"""Every exporter, found by format name or by file extension.

Kept apart from the exporters so that a command can list the formats without an exporter
importing the others. Every module of this package (but ``base`` and this one) holds one exporter
class; the maps are built from each class's own ``format_name`` and ``file_extension``, so adding
a format is adding its module::

    exporter_for_path(Path("run.perfetto-trace"))  # -> PerfettoExporter
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import dlprof.exporters
from dlprof.exporters.base import Exporter


def _discover() -> tuple[type[Exporter], ...]:
    found: list[type[Exporter]] = []
    for info in sorted(pkgutil.iter_modules(dlprof.exporters.__path__), key=lambda m: m.name):
        if info.name in ("base", "registry"):
            continue
        module = importlib.import_module(f"dlprof.exporters.{info.name}")
        found.extend(
            value
            for value in vars(module).values()
            if isinstance(value, type) and issubclass(value, Exporter) and value is not Exporter
            and value.__module__ == module.__name__
        )
    return tuple(found)


EXPORTERS: tuple[type[Exporter], ...] = _discover()

BY_FORMAT: dict[str, type[Exporter]] = {cls.format_name: cls for cls in EXPORTERS}
BY_EXTENSION: dict[str, type[Exporter]] = {cls.file_extension: cls for cls in EXPORTERS}
FORMAT_NAMES: tuple[str, ...] = tuple(BY_FORMAT)


class UnknownFormatError(ValueError):
    """No exporter writes the format asked for."""


def exporter_for_format(name: str) -> type[Exporter]:
    """The exporter of a format name (``chrome``, ``perfetto``).

    Raises:
        UnknownFormatError: no exporter has that name.
    """
    try:
        return BY_FORMAT[name.lower()]
    except KeyError:
        raise UnknownFormatError(
            f"unknown format {name!r}; choose one of: {', '.join(FORMAT_NAMES)}"
        ) from None


def exporter_for_path(path: Path) -> type[Exporter]:
    """The exporter whose file extension ends ``path``'s name.

    Raises:
        UnknownFormatError: no exporter writes files named like that.
    """
    name = path.name.lower()
    # Longest extension first, so that ".perfetto-trace" is not taken for a shorter one.
    for extension in sorted(BY_EXTENSION, key=len, reverse=True):
        if name.endswith(extension):
            return BY_EXTENSION[extension]
    known = ", ".join(f"{ext} ({cls.format_name})" for ext, cls in BY_EXTENSION.items())
    raise UnknownFormatError(f"cannot tell the format of {path.name!r} from its extension; known: {known}")
