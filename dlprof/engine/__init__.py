"""Query engines for a run's tables: DuckDB embedded by default, Apache Spark when asked.

    run = dlprof.load("dlprof-runs/20261122-101500-train")           # engine from DLPROF_ENGINE
    run.engine.rows("SELECT name, sum(dur_ns) AS ns FROM slices GROUP BY name ORDER BY ns DESC LIMIT 5")
    dlprof.load(path, engine="spark").sql("SELECT count(*) FROM slices")

An analysis is SQL that both engines run (:mod:`dlprof.engine.dialect` spells what differs), so it
is written once. The engine is chosen by ``--engine`` on a command, else the ``DLPROF_ENGINE``
environment variable, else DuckDB. Neither engine is imported until a query needs it, so commands
that only read manifests (``dlprof ls``, ``dlprof info``) start at once.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from dlprof.keys import EngineKind, StoreTable

if TYPE_CHECKING:
    from dlprof.engine.base import Engine
    from dlprof.engine.sources import TableSource

ENGINE_VARIABLE = "DLPROF_ENGINE"

_chosen: EngineKind | None = None


def choose_engine(kind: EngineKind | str | None) -> None:
    """Make ``kind`` the engine of every run loaded after this in the process (``--engine``);
    None goes back to ``DLPROF_ENGINE`` or DuckDB."""
    global _chosen
    _chosen = None if kind is None else EngineKind(kind)


def default_engine() -> EngineKind:
    """The engine a run loaded now uses: ``--engine``, else ``DLPROF_ENGINE``, else DuckDB.

    Raises:
        ValueError: ``DLPROF_ENGINE`` names no engine.
    """
    if _chosen is not None:
        return _chosen
    named = os.environ.get(ENGINE_VARIABLE, "").strip().lower()
    if not named:
        return EngineKind.DUCKDB
    try:
        return EngineKind(named)
    except ValueError:
        choices = ", ".join(str(k) for k in EngineKind)
        raise ValueError(f"{ENGINE_VARIABLE}={named}: no such engine (choose {choices})") from None


def open_engine(kind: EngineKind, sources: Mapping[StoreTable, TableSource]) -> Engine:
    """An engine of ``kind`` with the given tables registered as views."""
    if kind is EngineKind.SPARK:
        from dlprof.engine.spark import SparkEngine

        return SparkEngine(sources)
    from dlprof.engine.duck import DuckDBEngine

    return DuckDBEngine(sources)
