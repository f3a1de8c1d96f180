"""A small query result as plain Python values: what commands print without loading pandas.

    result = run.engine.rows("SELECT name, count(*) AS calls FROM slices GROUP BY name")
    result.columns            # ("name", "calls")
    result.column("calls")    # [12, 3, ...]
    result.to_pandas()        # for the Python API, which returns DataFrames

An analysis's result is small (a table a person reads); everything large stays in the engine.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class Rows:
    """Named columns of Python values (None for missing), row by row."""

    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self.rows)

    def column(self, name: str) -> list[Any]:
        """One column's values, top to bottom."""
        index = self.columns.index(name)
        return [row[index] for row in self.rows]

    def records(self) -> list[dict[str, Any]]:
        """Each row as a dict of column to value."""
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]

    @classmethod
    def from_columns(cls, columns: Mapping[str, Sequence[Any]]) -> Rows:
        """Rows from equally long columns."""
        names = tuple(columns)
        return cls(names, list(zip(*(columns[n] for n in names), strict=True)) if names else [])

    def select(self, names: Sequence[str]) -> Rows:
        """These columns only, in this order."""
        indices = [self.columns.index(n) for n in names]
        return Rows(tuple(names), [tuple(row[i] for i in indices) for row in self.rows])

    def head(self, limit: int | None) -> Rows:
        """The first ``limit`` rows (all when None or 0)."""
        return self if not limit else Rows(self.columns, self.rows[:limit])

    def to_pandas(self, dtypes: Mapping[str, Any] | None = None) -> pd.DataFrame:
        """A DataFrame of these rows; ``dtypes`` fixes the type of columns that may hold None."""
        import pandas as pd

        frame = pd.DataFrame({name: self.column(name) for name in self.columns}, columns=list(self.columns))
        for name, dtype in (dtypes or {}).items():
            if name in frame:
                frame[name] = frame[name].astype(dtype)
        return frame
