"""A small protocol-buffer encoder, for formats whose ``.proto`` no installed package compiles.

pprof's ``profile.proto`` is a handful of messages of integers, strings and packed integer lists;
writing its wire format by hand needs no code generator, no ``protoc`` and no generated module to
keep in step with the protobuf runtime. Only what such messages use is here: varints (field
types ``int64``, ``uint64``, ``bool``), length-delimited fields (strings, bytes, embedded
messages) and packed repeated varints. Fields are written in the order they are added::

    line = Message().uint(1, function_id)
    location = Message().uint(1, location_id).message(4, line)
    location.to_bytes()

A singular scalar equal to its default (0, False) is left out, as proto3 serialisers do; strings
and messages are always written, because they are most often elements of a repeated field, where
an empty element still counts.
"""

from __future__ import annotations

from collections.abc import Iterable

_VARINT = 0
_LENGTH_DELIMITED = 2
_UINT64_LIMIT = 1 << 64
_INT64_MIN = -(1 << 63)


def varint(value: int) -> bytes:
    """The base-128 varint of an integer, as protobuf writes ``int64`` and ``uint64`` values.

    Args:
        value: from ``-2**63`` to ``2**64 - 1``; a negative value is written as its 64-bit two's
            complement (ten bytes), as protobuf writes a negative ``int64``.

    Returns:
        Seven bits per byte, least significant first, the high bit set on all but the last.

    Raises:
        ValueError: the value does not fit in 64 bits.
    """
    if not _INT64_MIN <= value < _UINT64_LIMIT:
        raise ValueError(f"{value} does not fit in 64 bits")
    if value < 0:
        value += _UINT64_LIMIT
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _tag(field: int, wire_type: int) -> bytes:
    if field < 1:
        raise ValueError(f"field numbers start at 1, not {field}")
    return varint((field << 3) | wire_type)


class Message:
    """One message's fields, encoded as they are added."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def uint(self, field: int, value: int) -> Message:
        """Add a varint field (``uint64``, ``int64``, ``bool``); left out when 0."""
        if value:
            self._parts += (_tag(field, _VARINT), varint(int(value)))
        return self

    def data(self, field: int, payload: bytes) -> Message:
        """Add a length-delimited field holding ``payload`` (``bytes``), empty or not."""
        self._parts += (_tag(field, _LENGTH_DELIMITED), varint(len(payload)), payload)
        return self

    def string(self, field: int, text: str) -> Message:
        """Add a string field (UTF-8), empty or not."""
        return self.data(field, text.encode("utf-8"))

    def message(self, field: int, message: Message) -> Message:
        """Add an embedded message."""
        return self.data(field, message.to_bytes())

    def packed(self, field: int, values: Iterable[int]) -> Message:
        """Add a packed repeated varint field; left out when there are no values."""
        data = b"".join(varint(int(v)) for v in values)
        if data:
            self.data(field, data)
        return self

    def to_bytes(self) -> bytes:
        """The message's wire encoding."""
        return b"".join(self._parts)
