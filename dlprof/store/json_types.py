"""Checking parsed JSON against a dataclass's field types, so a damaged file fails in one line.

A manifest is JSON that anyone can edit; building a dataclass from it without a check turns a
wrong type into an ``AttributeError`` far from the file. :func:`check_fields` says instead which
field holds what::

    check_fields({"name": "x", "start_ns": "soon"}, Manifest)
    # JsonTypeError: field 'start_ns' should be an integer, not a string

Only what the dataclasses use is understood: ``int``, ``float``, ``str``, ``bool``, ``None``,
``Any``, enums of strings, ``X | None``, ``list[X]``, ``tuple[X, ...]`` and ``tuple[X, Y]`` (as
JSON lists), ``dict[str, X]``, and nested dataclasses (as objects). Keys the dataclass does not
know are not checked: a newer writer may have added them.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from functools import cache
from typing import Any

_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
          list: "a list", dict: "an object", type(None): "null"}


class JsonTypeError(ValueError):
    """A JSON value does not have the type its field needs; the message names the field."""


def check_fields(data: object, cls: type, where: str = "") -> None:
    """Check that ``data`` is an object whose known keys hold values of ``cls``'s field types.

    Args:
        data: parsed JSON.
        cls: a dataclass.
        where: the path of ``data`` inside the document ("" at its top), for the message.

    Raises:
        JsonTypeError: ``data`` is not an object, lacks a field without a default, or a field
            holds a value of another type.
    """
    whole = f"field '{where}'" if where else "the file"
    if not isinstance(data, dict):
        raise JsonTypeError(f"{whole} should be an object, not {_word(data)}")
    hints = _hints(cls)
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in data and _required(f)]
    if missing:
        names = ", ".join(repr(name) for name in missing)
        raise JsonTypeError(f"{whole} has no {names}")
    for name, hint in hints.items():
        if name in data:
            _check(data[name], hint, f"{where}.{name}" if where else name)


@cache
def _hints(cls: type) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {name: hint for name, hint in typing.get_type_hints(cls).items() if name in names}


def _required(field: dataclasses.Field[Any]) -> bool:
    return field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING


def _check(value: object, hint: Any, where: str) -> None:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:  # X | None holding a value: X's own message says what is wrong
            _check(value, options[0], where)
            return
        for option in options:
            try:
                _check(value, option, where)
            except JsonTypeError:
                continue
            return
        raise JsonTypeError(f"field '{where}' should be {' or '.join(_expected(a) for a in args)}, "
                            f"not {_word(value)}")
    if dataclasses.is_dataclass(hint):
        check_fields(value, hint, where)  # type: ignore[arg-type]
        return
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        if value not in {member.value for member in hint}:
            choices = ", ".join(str(member.value) for member in hint)
            raise JsonTypeError(f"field '{where}' is {value!r}, not one of: {choices}")
        return
    expected = origin or hint
    if not _is_instance(value, expected):
        raise JsonTypeError(f"field '{where}' should be {_expected(hint)}, not {_word(value)}")
    if expected is list or (expected is tuple and args[-1:] == (Ellipsis,)):
        for index, item in enumerate(typing.cast(list[object], value)):
            _check(item, args[0], f"{where}[{index}]")
    elif expected is tuple:
        if len(typing.cast(list[object], value)) != len(args):
            raise JsonTypeError(f"field '{where}' should hold {len(args)} values")
        for index, (item, item_hint) in enumerate(zip(typing.cast(list[object], value), args, strict=True)):
            _check(item, item_hint, f"{where}[{index}]")
    elif expected is dict and args:
        for key, item in typing.cast(dict[str, object], value).items():
            _check(item, args[1], f"{where}.{key}")


def _is_instance(value: object, expected: Any) -> bool:
    if expected is tuple:
        return isinstance(value, (list, tuple))
    if isinstance(value, bool):  # JSON's true is no integer, though Python's is
        return expected is bool
    if expected is float:
        return isinstance(value, (int, float))
    return isinstance(value, expected)


def _expected(hint: Any) -> str:
    origin = typing.get_origin(hint) or hint
    if origin is tuple:
        return "a list"
    if dataclasses.is_dataclass(origin):
        return "an object"
    return _WORDS.get(origin, getattr(origin, "__name__", str(origin)))


def _word(value: object) -> str:
    return _WORDS.get(type(value), type(value).__name__)
