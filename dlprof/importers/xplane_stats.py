"""Reading an XPlane's lines and stats: stat values by name, line ids as thread ids.

An event's stats are ``(stat metadata id, value)`` pairs, the value one of six protobuf fields
(a ``ref_value`` names another stat metadata whose name is the value); :class:`StatNames`
reads them by name for one plane.
"""

from __future__ import annotations

import math
import re
from typing import Any

# Lines xprof derives from others when it shows a profile (steps, modules, name scopes): copies.
DERIVED_LINES = frozenset({
    "Steps", "XLA Modules", "XLA Ops", "XLA TraceMe", "TensorFlow Name Scope", "TensorFlow Ops",
    "Framework Name Scope", "Framework Ops", "Source code", "Async XLA Ops",
})

_DIGITS = re.compile(r"[0-9]{1,19}")
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


class StatNames:
    """A plane's stat metadata by name, and typed reads of an event's stats."""

    def __init__(self, plane: Any) -> None:
        self.plane = plane
        self.ids = {m.name: m.id for m in plane.stat_metadata.values()}

    def name(self, stat_id: int) -> str:
        return str(self.plane.stat_metadata[stat_id].name)

    def has(self, event: Any, name: str) -> bool:
        wanted = self.ids.get(name)
        return wanted is not None and any(s.metadata_id == wanted for s in event.stats)

    def _stat(self, event: Any, name: str) -> Any:
        wanted = self.ids.get(name)
        if wanted is None:
            return None
        return next((s for s in event.stats if s.metadata_id == wanted), None)

    def value(self, event: Any, name: str) -> Any:
        """The value of the event's stat called ``name``; None when it has none."""
        stat = self._stat(event, name)
        return None if stat is None else scalar(stat, self.plane)

    def ref(self, event: Any, name: str) -> int:
        """The stat metadata id a ``ref_value`` stat points at; -1 when it has none."""
        stat = self._stat(event, name)
        return int(stat.ref_value) if stat is not None and stat.WhichOneof("value") == "ref_value" else -1

    def text(self, event: Any, name: str) -> str | None:
        value = self.value(event, name)
        return None if value is None else str(value)

    def all(self, event: Any) -> dict[str, Any]:
        return {self.name(s.metadata_id): scalar(s, self.plane) for s in event.stats}


def scalar(stat: Any, plane: Any) -> Any:
    """A stat's value as Python: a number, a string, or for bytes only their size."""
    which = stat.WhichOneof("value")
    if which == "ref_value":
        return plane.stat_metadata[stat.ref_value].name
    if which == "bytes_value":
        return f"<{len(stat.bytes_value)} bytes>"
    return getattr(stat, which) if which else None


def as_int64(value: Any) -> int | None:
    """A stat's value as an integer that fits int64: an integer, a whole double, or the ASCII
    digits of one; None for anything else (a string where a number belongs, 2**64 - 1), which
    then reads as absent.
    """
    if isinstance(value, str):
        value = int(value) if _DIGITS.fullmatch(value) else None
    elif isinstance(value, float):
        value = int(value) if math.isfinite(value) and value.is_integer() else None
    if isinstance(value, int) and not isinstance(value, bool) and _INT64_MIN <= value <= _INT64_MAX:
        return value
    return None


def fold_id(line_id: int) -> int:
    """A line id as a thread or stream id: kept when it fits 31 bits, else folded into them.

    TensorFlow names host lines by 64-bit hashes of their threads; the exporters (Perfetto's
    and Chrome's thread ids) take 32-bit ones. Folding keeps one thread one id across profiles.
    """
    if 0 <= line_id < 1 << 31:
        return line_id
    value = line_id & 0xFFFFFFFFFFFFFFFF
    return ((value >> 31) ^ value ^ (value >> 62)) & 0x7FFFFFFF
