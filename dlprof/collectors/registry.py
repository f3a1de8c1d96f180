"""Every collector, found by name; what each is comes from its class's own attributes.

Every module of this package but ``base`` and this one holds one collector, named as its
module (``dlprof/collectors/cupti_metrics.py`` is the ``cupti_metrics`` collector) and exported
as ``COLLECTOR``. Names are listed without importing anything; a collector's module is imported
when it is asked for, and none of them imports its framework when it loads, so torch and
TensorFlow are never loaded early::

    collector_class("torch").framework     # "torch": starts once the program imports torch
    default_collectors()                   # ("torch", "layers", ...) in start order
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable

import dlprof.collectors
from dlprof.collectors.base import Collector

_NOT_COLLECTORS = frozenset({"base", "registry"})

# Every collector's name, from the package's modules (nothing imported).
NAMES: tuple[str, ...] = tuple(sorted(
    info.name for info in pkgutil.iter_modules(dlprof.collectors.__path__)
    if info.name not in _NOT_COLLECTORS
))


class UnknownCollectorError(ValueError):
    pass


def collector_class(name: str) -> type[Collector]:
    """The collector class called ``name``."""
    if name not in NAMES:
        raise UnknownCollectorError(f"unknown collector {name!r}; choose from {', '.join(selectable())}")
    module = importlib.import_module(f"dlprof.collectors.{name}")
    collector: type[Collector] = module.COLLECTOR
    return collector


def selectable() -> tuple[str, ...]:
    """The collectors a user may name; the others the session or `dlprof run` add themselves."""
    return tuple(name for name in NAMES if not collector_class(name).internal)


def default_collectors() -> tuple[str, ...]:
    """The set used when none is named, in start order."""
    return in_start_order(name for name in NAMES if collector_class(name).default)


def in_start_order(names: Iterable[str]) -> tuple[str, ...]:
    """Names ordered as their collectors start (``start_order``, then as given); they stop in
    reverse."""
    listed = list(dict.fromkeys(names))
    return tuple(sorted(listed, key=lambda name: (collector_class(name).start_order, listed.index(name))))


def cupti_owner(names: Iterable[str]) -> str | None:
    """Which of these collectors subscribes to CUPTI, which takes one subscriber per process:
    the first available one by ``cupti_priority`` (Kineto, through the torch collector, before
    the cupti collector); None when none of them can run here."""
    subscribers = [collector_class(name) for name in names if collector_class(name).cupti_priority is not None]
    for cls in sorted(subscribers, key=lambda cls: cls.cupti_priority or 0):
        if cls.available()[0]:
            return cls.name
    return None
