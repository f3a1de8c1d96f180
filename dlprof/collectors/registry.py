"""Collector names to classes, imported only when asked for, so torch is never loaded early."""

from __future__ import annotations

import importlib

from dlprof.collectors.base import Collector

# name -> module under dlprof.collectors that defines COLLECTOR
_MODULES = {
    "torch": "torch",
    "layers": "layers",
    "host": "host",
    "optimizer_steps": "optimizer_steps",
    "counters": "counters",
    "nvml": "nvml",
    "cupti": "cupti",
    "cupti_metrics": "pm_sampling",
    "dataloader": "dataloader",
    "rank_clock": "rank_clock",
    "tensorflow": "tensorflow",
}

NAMES = tuple(_MODULES)


class UnknownCollectorError(ValueError):
    pass


def collector_class(name: str) -> type[Collector]:
    """The collector class called ``name``."""
    module_name = _MODULES.get(name)
    if module_name is None:
        raise UnknownCollectorError(
            f"unknown collector {name!r}; choose from {', '.join(n for n in NAMES if n != 'optimizer_steps')}"
        )
    module = importlib.import_module(f"dlprof.collectors.{module_name}")
    collector: type[Collector] = module.COLLECTOR
    return collector
