"""DuckDB's engine: what it says when a query outgrows its memory cap."""

from __future__ import annotations

import re

import pytest

from dlprof.engine.base import EngineError
from dlprof.engine.duck import MEMORY_VARIABLE, DuckDBEngine, larger_memory

# A list aggregate cannot spill to disk: 10 million integers outgrow a 16MB cap at once.
UNSPILLABLE = "SELECT length(list(i)) FROM range(10000000) t(i)"


def test_a_query_past_the_cap_suggests_a_larger_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MEMORY_VARIABLE, "16MB")
    engine = DuckDBEngine({})
    with pytest.raises(EngineError, match=f"its 16MB .* {MEMORY_VARIABLE}=64MB$"):
        engine.rows(UNSPILLABLE)
    engine.close()


@pytest.mark.parametrize("failed", ["256MB", "1GB", "1.5GB", "2GiB", "700MiB"])
def test_the_suggested_cap_is_one_duckdb_reads_and_larger(failed: str) -> None:
    suggested = larger_memory(failed)
    engine = DuckDBEngine({})
    engine.connection.execute(f"SET memory_limit = '{suggested}'")
    limit = engine.rows("SELECT current_setting('memory_limit')")
    engine.close()
    assert _bytes(str(next(iter(limit))[0])) > _bytes(failed)


def test_larger_memory_reads_duckdb_sizes() -> None:
    assert larger_memory("256MB") == "1GB"
    assert larger_memory("1GB") == "4GB"
    assert larger_memory("512 mb") == "2GB"
    assert larger_memory("80%") == "4GB"  # not a size: a fixed larger cap


def _bytes(size: str) -> float:
    """DuckDB's size text (``1.0 GiB``, ``256MB``) in bytes."""
    found = re.fullmatch(r"([\d.]+)\s*([KMGT]i?B)", size.strip())
    assert found, size
    scale = {"K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}[found.group(2)[0]]
    if "i" in found.group(2):
        scale = 2 ** (10 * "KMGT".index(found.group(2)[0]) + 10)
    return float(found.group(1)) * scale
