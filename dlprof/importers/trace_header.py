"""A Chrome trace's file-level fields, checked: a wrong one refuses the file.

The keys beside ``traceEvents`` say what the whole file is: the devices it ran on, the time base
every event is relative to, the rank of a distributed job. A wrong value there would make every
event wrong (times past int64, a partition named ``rank=True``), so it is refused with one line
rather than dropped like a damaged event (:mod:`dlprof.importers.kineto_events`)::

    check_header({"baseTimeNanoseconds": 1e300})   # HeaderError: baseTimeNanoseconds is 1e+300, ...
    base = base_time_ns(header)                      # 0 when the trace states none
"""

from __future__ import annotations

from typing import Any

from dlprof.importers.damage import MAX_TIME_NS
from dlprof.store.ids import MAX_RANK


class HeaderError(ValueError):
    """A file-level field of the wrong type or out of range; the message is one line."""


def check_header(header: dict[str, Any]) -> None:
    """Check every file-level field the import reads.

    Raises:
        HeaderError: one of them is of the wrong type or out of range.
    """
    device_list(header)
    base_time_ns(header)
    stated_rank(header)
    world_size(header)


def device_list(header: dict[str, Any]) -> list[dict[str, Any]]:
    """``deviceProperties``: the devices the trace describes (none when it states none).

    Raises:
        HeaderError: it is not a list of objects.
    """
    devices = header.get("deviceProperties")
    if devices is None:
        return []
    if not isinstance(devices, list) or not all(isinstance(device, dict) for device in devices):
        raise HeaderError(f"deviceProperties is {_shown(devices)}, not a list of objects")
    return devices


def base_time_ns(header: dict[str, Any]) -> int:
    """``baseTimeNanoseconds``: epoch ns every event time is relative to (0 when not stated).

    Raises:
        HeaderError: not a whole number from 0 to :data:`MAX_TIME_NS`.
    """
    return checked_base_time(header.get("baseTimeNanoseconds", 0))


def checked_base_time(value: Any) -> int:
    """A time base as the trace wrote it (in its header or after its events), checked.

    Raises:
        HeaderError: not a whole number from 0 to :data:`MAX_TIME_NS`.
    """
    if _is_number(value) and 0 <= value <= MAX_TIME_NS and float(value).is_integer():
        return int(value)
    raise HeaderError(f"baseTimeNanoseconds is {_shown(value)}, not a whole number of ns "
                      f"from 0 to {MAX_TIME_NS:.0e}")


def stated_rank(header: dict[str, Any]) -> int | None:
    """``distributedInfo.rank``: the rank the file states, or None where it states none.

    Raises:
        HeaderError: distributedInfo is not an object, or the rank is not an integer from 0 to
            :data:`~dlprof.store.ids.MAX_RANK` (true and false are not ranks).
    """
    rank = _distributed(header).get("rank")
    if rank is None:
        return None
    if not _is_int(rank) or not 0 <= rank <= MAX_RANK:
        raise HeaderError(f"distributedInfo.rank is {_shown(rank)}, not an integer from 0 to {MAX_RANK}")
    return int(rank)


def world_size(header: dict[str, Any]) -> int | None:
    """``distributedInfo.world_size``, or None where the file states none.

    Raises:
        HeaderError: not an integer from 1 to ``MAX_RANK + 1``.
    """
    size = _distributed(header).get("world_size")
    if size is None:
        return None
    if not _is_int(size) or not 1 <= size <= MAX_RANK + 1:
        raise HeaderError(f"distributedInfo.world_size is {_shown(size)}, not an integer from 1 to {MAX_RANK + 1}")
    return int(size)


def _distributed(header: dict[str, Any]) -> dict[str, Any]:
    info = header.get("distributedInfo")
    if info is None:
        return {}
    if not isinstance(info, dict):
        raise HeaderError(f"distributedInfo is {_shown(info)}, not an object")
    return info


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _shown(value: Any) -> str:
    """A value as the message shows it: short, on one line."""
    text = repr(value).replace("\n", " ")
    return text if len(text) <= 40 else text[:37] + "..."
