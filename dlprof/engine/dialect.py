"""What DuckDB's and Spark's SQL spell differently, and nothing else.

Analyses are written once as SQL that both engines run; where the two disagree (string
literals, quantiles, the last non-null value in a window, regular expressions) the query asks the
engine's dialect::

    d = run.engine.dialect
    f"SELECT {d.quantile('dur_ns', 0.95)} FROM slices WHERE name = {d.literal(name)}"

Everything else (CTEs, window functions, FILTER clauses, GREATEST/LEAST, CASE, the type names
BIGINT, INT, SMALLINT, STRING, FLOAT, DOUBLE) is the common subset both parse alike.
"""

from __future__ import annotations

import math


class Dialect:
    """DuckDB's spelling; :class:`SparkDialect` overrides what Spark spells otherwise."""

    name = "duckdb"

    def literal(self, value: str | int | float | bool | None) -> str:
        """A value as a SQL literal (strings escaped, so a name never becomes SQL)."""
        if value is None:
            return "NULL"
        if isinstance(value, bool):
            return "TRUE" if value else "FALSE"
        if isinstance(value, int):
            return str(value)
        if isinstance(value, float):
            if not math.isfinite(value):
                raise ValueError(f"{value}: not a finite number")
            return repr(value)
        return self._string(value)

    def _string(self, value: str) -> str:
        return "'" + value.replace("'", "''") + "'"

    def literals(self, values: list[str] | tuple[str, ...] | frozenset[str]) -> str:
        """Values as a parenthesised list for ``IN``; sorted, so a query's text is stable."""
        return "(" + ", ".join(self.literal(v) for v in sorted(values)) + ")"

    def quantile(self, expr: str, fraction: float) -> str:
        """The interpolated quantile of an aggregate, as numpy's and pandas' default."""
        return f"quantile_cont({expr}, {fraction!r})"

    def last_non_null(self, expr: str) -> str:
        """A window aggregate: the last non-null value of ``expr`` in the frame."""
        return f"last_value({expr} IGNORE NULLS)"

    def matches(self, expr: str, pattern: str) -> str:
        """Whether a regular expression matches somewhere in ``expr`` (anchor it with ``^``)."""
        return f"regexp_matches({expr}, {self.literal(pattern)})"

    def int_div(self, numerator: str, denominator: str) -> str:
        """Integer division of non-negative integers."""
        return f"({numerator}) // ({denominator})"


class SparkDialect(Dialect):
    """Spark SQL's spelling of the same."""

    name = "spark"

    def _string(self, value: str) -> str:
        # Spark reads backslash escapes in literals, and '' is not a quote there.
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"

    def quantile(self, expr: str, fraction: float) -> str:
        return f"percentile({expr}, {fraction!r})"

    def last_non_null(self, expr: str) -> str:
        return f"last_value({expr}, true)"

    def matches(self, expr: str, pattern: str) -> str:
        return f"({expr} RLIKE {self.literal(pattern)})"

    def int_div(self, numerator: str, denominator: str) -> str:
        return f"(({numerator}) DIV ({denominator}))"
