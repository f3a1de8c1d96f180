"""Derived metrics: formulas over a run's counters, per slice and per group, as ParaProf's.

A formula is arithmetic over names: ``inst_executed / active_cycles``. A name is a counter of
the run, with or without its source prefix (``cupti:smsp__inst_executed.sum``,
``smsp__inst_executed.sum``), a legacy CUPTI name resolved through
:data:`dlprof.analysis.cupti_names.LEGACY_TO_PERFWORKS` (``inst_executed``; a counter that counts
the same on another chip stands in, :mod:`dlprof.hardware.pm_metrics`), a built-in metric
(``flop_count``), or one of :class:`Special`'s names (``time``, ``flops``, ``max_warps_per_sm``).
A name with characters other than letters, digits, ``_`` and ``.`` goes in backticks:
```` `perf:task-clock` / time ````. Only numbers, names, ``+ - * / **`` and parentheses are
allowed; formulas are parsed with :mod:`ast` and never run as Python::

    table = derived_metrics(run, [*BUILTINS, parse_metric_option("gips=inst_executed/time/1e9")])
    table.values          # one row per slice name, one column per metric that has values
    table.unavailable     # metric -> why it has none in this run

Per group, the counters are summed over the group's slices first and the formula is applied to
the sums (ParaProf's way): the IPC of a kernel called twice is all its instructions over all its
cycles, not the mean of two ratios. A slice lacking one of a formula's inputs has no value for
it (per slice), and is left out of its group's sums; a division by zero also gives no value.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from dlprof.analysis.cupti_names import describe_names, perfworks_name, perfworks_names
from dlprof.keys import PROFILER_RANGE
from dlprof.store.reader import Run

# Kinds whose durations are not the work's: Kineto's CUPTI range profiler writes one placeholder
# length for every range, so ``time`` is unknown for them (their counts are still exact).
PLACEHOLDER_DURATION_KINDS = frozenset({PROFILER_RANGE})

_MAX_FORMULA = 2000  # characters; a formula is a line, not a program


class FormulaError(ValueError):
    """A formula or a --metric option that cannot be used; the message is one line."""


class Special(StrEnum):
    """Names that are not counters: properties of the slice or of its device."""

    TIME = "time"  # the slice's duration in seconds (summed over a group)
    FLOPS = "flops"  # the slice's flops column (torch's or the trace's own figure)
    MAX_WARPS_PER_SM = "max_warps_per_sm"  # maxThreadsPerMultiprocessor / warpSize of its GPU


_SPECIAL_NAMES = frozenset(special.value for special in Special)
# Columns of the result tables, which a metric of the user's may not be named.
_RESERVED = frozenset({"id", "name", "kind", "calls"})
# Specials that are constants of a device: a group takes their mean, never their sum.
_DEVICE_CONSTANTS = frozenset({Special.MAX_WARPS_PER_SM.value})

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_SYMBOLS = {
    ast.FloorDiv: "//", ast.Mod: "%", ast.MatMult: "@", ast.LShift: "<<", ast.RShift: ">>",
    ast.BitOr: "|", ast.BitXor: "^", ast.BitAnd: "&", ast.Invert: "~", ast.Not: "not",
}
_NOT_ALLOWED = {
    ast.Call: "calls", ast.Attribute: "attributes", ast.Subscript: "indexing",
    ast.Compare: "comparisons", ast.BoolOp: "and/or", ast.IfExp: "if/else",
}
# Numbers first, so that the exponent of 1.5e3 is not taken for a name.
_TOKEN = re.compile(
    r"(?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)"
    r"|`(?P<quoted>[^`]*)`"
    r"|(?P<name>(?:[A-Za-z_]\w*:)?[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)"
)

Values = np.ndarray[Any, np.dtype[np.float64]]


@dataclass(frozen=True, eq=False)
class Formula:
    """A parsed formula: its text, its checked syntax tree and the names it uses."""

    text: str
    tree: ast.expr
    names: tuple[str, ...]  # as written, in order of first use
    _placeholders: dict[str, str] = field(repr=False)  # identifier in the tree -> name

    @classmethod
    def parse(cls, text: str) -> Formula:
        """Check and parse a formula.

        Raises:
            FormulaError: anything but numbers, names, ``+ - * / **`` and parentheses.
        """
        if len(text) > _MAX_FORMULA:
            raise FormulaError(f"formula longer than {_MAX_FORMULA} characters")
        placeholders: dict[str, str] = {}

        def rename(match: re.Match[str]) -> str:
            name = match.group("name") if match.group("quoted") is None else match.group("quoted")
            if name is None:
                return match.group(0)
            name = name.strip()
            if not name:
                raise FormulaError(f"{text!r}: empty name in backticks")
            # Every name becomes a fresh identifier, so no Python name or keyword survives.
            key = next((k for k, v in placeholders.items() if v == name), f"_n{len(placeholders)}")
            placeholders[key] = name
            return f" {key} "

        source = _TOKEN.sub(rename, text).strip()
        try:
            tree = ast.parse(source, mode="eval").body
        except SyntaxError as error:
            raise FormulaError(f"{text!r}: not a formula ({error.msg})") from None
        except (ValueError, RecursionError, MemoryError):
            raise FormulaError(f"{text!r}: not a formula") from None
        _check(tree, text)
        return cls(text, tree, tuple(placeholders.values()), placeholders)

    def evaluate(self, lookup: Callable[[str], Values], size: int) -> Values:
        """The formula's value for ``size`` rows, each name's values from ``lookup``.

        Division by zero, overflow and undefined powers give NaN, never an error.
        """
        with np.errstate(all="ignore"):
            result = self._value(self.tree, lookup)
            values = np.broadcast_to(np.asarray(result, dtype=np.float64), (size,)).copy()
        values[~np.isfinite(values)] = np.nan
        return values

    def _value(self, node: ast.expr, lookup: Callable[[str], Values]) -> Any:
        if isinstance(node, ast.BinOp):
            # As numpy floats: a Python float's ** raises on overflow instead of giving inf.
            left = np.asarray(self._value(node.left, lookup), np.float64)
            right = np.asarray(self._value(node.right, lookup), np.float64)
            return _BINARY[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp):
            return _UNARY[type(node.op)](self._value(node.operand, lookup))
        if isinstance(node, ast.Name):
            return lookup(self._placeholders[node.id])
        assert isinstance(node, ast.Constant) and isinstance(node.value, (int, float))  # _check
        return float(node.value)


def _check(node: ast.expr, text: str) -> None:
    """Reject anything but arithmetic on numbers and names."""
    if isinstance(node, (ast.BinOp, ast.UnaryOp)):
        if type(node.op) not in _BINARY and type(node.op) not in _UNARY:
            symbol = _SYMBOLS.get(type(node.op), type(node.op).__name__)
            raise FormulaError(f"{text!r}: operator {symbol} not allowed; only + - * / **")
        for child in (node.left, node.right) if isinstance(node, ast.BinOp) else (node.operand,):
            _check(child, text)
    elif isinstance(node, ast.Constant):
        if type(node.value) not in (int, float):
            what = "strings" if isinstance(node.value, str) else f"{type(node.value).__name__} values"
            raise FormulaError(f"{text!r}: {what} not allowed; only numbers and metric names")
    elif not isinstance(node, ast.Name):
        what = _NOT_ALLOWED.get(type(node), type(node).__name__)
        raise FormulaError(f"{text!r}: {what} not allowed; use numbers, metric names, "
                           "+ - * / ** and parentheses")


@dataclass(frozen=True)
class DerivedMetric:
    """A named formula, with what it means and in which unit."""

    name: str
    formula: str
    description: str = ""
    unit: str = ""

    @cached_property
    def parsed(self) -> Formula:
        return Formula.parse(self.formula)


_FLOP_TERMS = " + ".join(
    f"flop_count_{p}_add + flop_count_{p}_mul + 2 * flop_count_{p}_fma" for p in ("dp", "sp", "hp")
)

BUILTINS: tuple[DerivedMetric, ...] = (
    DerivedMetric("ipc", "inst_executed / active_cycles",
                  "instructions executed per active SM cycle (nvprof's ipc)", "inst/cycle"),
    DerivedMetric("warps_per_inst", "active_warps / inst_executed",
                  "active warps per instruction executed: high when warps wait rather than issue "
                  "(latency, stalls); TAU's CUDA study ranks kernels by it x time", "warps/inst"),
    DerivedMetric("gld_per_inst", "gld_request / inst_executed",
                  "global-memory load instructions per instruction executed", "loads/inst"),
    DerivedMetric("achieved_occupancy", "100 * active_warps / active_cycles / max_warps_per_sm",
                  "mean active warps per active cycle, as a share of the SM's maximum "
                  "(maxThreadsPerMultiprocessor / warpSize from the device properties)", "%"),
    DerivedMetric("flop_count", _FLOP_TERMS,
                  "floating-point operations of double, single and half precision, from SASS "
                  "instruction counts (an FMA counts two)", "FLOP"),
    DerivedMetric("flop_rate", "flop_count / time",
                  "FLOP/s over the slice's duration; none for cuda_profiler_range slices, whose "
                  "durations are placeholders", "FLOP/s"),
    DerivedMetric("arithmetic_intensity", "flop_count / dram__bytes.sum",
                  "FLOPs per byte of DRAM traffic (a roofline's x axis)", "FLOP/byte"),
)
BUILTIN_BY_NAME = {metric.name: metric for metric in BUILTINS}


def parse_metric_option(text: str) -> DerivedMetric:
    """A ``--metric`` option: ``NAME=EXPR`` defines a metric, a bare ``NAME`` picks a built-in.

    Raises:
        FormulaError: a bad name, a name taken, an unknown built-in, or a bad formula.
    """
    name, equals, formula = (part.strip() for part in text.partition("="))
    if not equals:
        if name not in BUILTIN_BY_NAME:
            raise FormulaError(f"--metric {name}: no such built-in (they are: "
                               f"{', '.join(BUILTIN_BY_NAME)}); define one with NAME=EXPR")
        return BUILTIN_BY_NAME[name]
    if not name.isidentifier():
        raise FormulaError(f"--metric {text!r}: NAME must be a word (letters, digits, _)")
    if name in BUILTIN_BY_NAME or name in _SPECIAL_NAMES or name in _RESERVED:
        raise FormulaError(f"--metric {name}: the name is taken; choose another")
    try:
        Formula.parse(formula)  # now, so that a bad formula fails before any work
    except FormulaError as error:
        raise FormulaError(f"--metric {name}: {error}") from None
    return DerivedMetric(name, formula, "user formula")


class _Names:
    """Where a formula's names come from in one run: which column holds each."""

    def __init__(self, metric_names: Iterable[str]) -> None:
        self.full = set(metric_names)
        self.by_bare: dict[str, list[str]] = {}
        for full in sorted(self.full):
            self.by_bare.setdefault(full.partition(":")[2] or full, []).append(full)

    def column(self, name: str) -> str | None:
        """The metric (full name) or special behind ``name``; None when the run has none."""
        if name in _SPECIAL_NAMES:
            return name
        if name in self.full:
            return name
        for candidate in perfworks_names(name):  # a chip may have sampled an equivalent counter
            found = self.by_bare.get(candidate, [])
            if len(found) > 1:
                raise FormulaError(f"{name!r} is ambiguous here: write one of {', '.join(found)}")
            if found:
                return found[0]
        return None

    def leaves(self, formula: Formula, seen: tuple[str, ...] = ()) -> tuple[set[str], list[str]]:
        """The columns a formula reads, through the built-ins it names, and the names not found."""
        columns: set[str] = set()
        missing: list[str] = []
        for name in formula.names:
            builtin = BUILTIN_BY_NAME.get(name)
            if builtin is not None and name not in seen:
                inner, lacking = self.leaves(builtin.parsed, (*seen, name))
                columns |= inner
                missing += [m for m in lacking if m not in missing]
                continue
            column = self.column(name)
            if column is None:
                missing.append(name)
            else:
                columns.add(column)
        return columns, missing

    def evaluate(self, formula: Formula, env: Callable[[str], Values], size: int) -> Values:
        """The formula over columns from ``env``, built-ins expanded in place."""

        def lookup(name: str) -> Values:
            builtin = BUILTIN_BY_NAME.get(name)
            if builtin is not None:
                return self.evaluate(builtin.parsed, env, size)
            column = self.column(name)
            assert column is not None  # leaves() found every name before evaluation
            return env(column)

        return formula.evaluate(lookup, size)


def source_counters(metric: DerivedMetric) -> tuple[str, ...]:
    """The counters a metric reads, by Perfworks name, through the built-ins it names."""
    _, names = _Names(()).leaves(metric.parsed)
    return tuple(perfworks_name(n) for n in names if n not in _SPECIAL_NAMES)


class Grouping(StrEnum):
    """``dlprof metrics --group-by``: one row per slice name, or per slice."""

    NAME = "name"
    SLICE = "slice"


@dataclass(frozen=True, eq=False)
class DerivedTable:
    """Derived values, and why the metrics without any have none."""

    values: pd.DataFrame  # name, calls (or id, name, kind), then one column per metric
    unavailable: dict[str, str]  # metric name -> reason, in words
    metrics: tuple[DerivedMetric, ...]  # the metrics with a column in ``values``, in order
    missing: dict[str, tuple[str, ...]]  # metric name -> the names this run has no counter for


def derived_metrics(
    run: Run,
    metrics: Sequence[DerivedMetric],
    group_by: Grouping = Grouping.NAME,
    kinds: Sequence[str] = (),
) -> DerivedTable:
    """Evaluate formulas over a run's slices, per slice or per group of equal names.

    Args:
        run: the run.
        metrics: what to compute (:data:`BUILTINS`, or :func:`parse_metric_option`'s).
        group_by: one row per slice, or per name with counters summed before the formula.
        kinds: only slices of these kinds; by default every slice that has counter values (every
            slice when the run has none).

    Returns:
        The values, sorted by the first metric, largest first; rows without any value are left
        out. A metric whose names the run lacks, or that has no value anywhere, is in
        ``unavailable`` with the reason.

    Raises:
        FormulaError: a name that could mean two counters of the run.
    """
    names = _Names(str(m) for m, in run.query("SELECT DISTINCT metric FROM metrics WHERE metric IS NOT NULL"))
    unavailable: dict[str, str] = {}
    lacking: dict[str, tuple[str, ...]] = {}
    planned: list[tuple[DerivedMetric, set[str]]] = []
    for metric in metrics:
        columns, missing = names.leaves(metric.parsed)
        if missing:
            unavailable[metric.name] = f"this run has no counter {describe_names(missing)}"
            lacking[metric.name] = tuple(missing)
        else:
            planned.append((metric, columns))
    inputs = _Inputs(run, kinds, set().union(*(c for _, c in planned)))
    table = inputs.per_slice() if group_by is Grouping.SLICE else inputs.group_sizes()
    computed: list[DerivedMetric] = []
    for metric, columns in planned:
        if group_by is Grouping.SLICE:
            values = names.evaluate(metric.parsed, lambda c: table[inputs.alias[c]].to_numpy(np.float64), len(table))
        else:
            values = _group_values(inputs, table["name"], metric, columns, names)
        if np.isnan(values).all():
            unavailable[metric.name] = inputs.why_none(columns)
            continue
        table[metric.name] = values
        computed.append(metric)
    table = table[[c for c in table.columns if c not in inputs.alias.values()]]
    measured = [m.name for m in computed]
    table = table[table[measured].notna().any(axis=1)] if measured else table.iloc[0:0]
    if measured:
        table = table.sort_values([measured[0], "name"], ascending=[False, True], na_position="last")
    return DerivedTable(table.reset_index(drop=True), unavailable, tuple(computed), lacking)


class _Inputs:
    """The selected slices and, per slice, each input a formula reads, as one query: counters
    summed per slice, the slice's duration in seconds, its flops, its GPU's warps per SM."""

    def __init__(self, run: Run, kinds: Sequence[str], columns: set[str]) -> None:
        self.run = run
        d = run.engine.dialect
        # Inputs are named in0, in1... in the query: a counter's name is no SQL identifier.
        self.alias = {column: f"in{i}" for i, column in enumerate(sorted(columns | set(Special)))}
        if kinds:
            selected = f"s.kind IN {d.literals(tuple(kinds))}"
        elif run.query("SELECT 1 FROM metrics LIMIT 1").rows:
            selected = "s.id IN (SELECT slice_id FROM metrics WHERE slice_id IS NOT NULL)"
        else:  # no counters: formulas over time and flops may still apply to any slice
            selected = "TRUE"
        counters = sorted(columns - set(Special))
        sums = "".join(f", sum(CASE WHEN metric = {d.literal(c)} THEN value END) AS {self.alias[c]}"
                       for c in counters)
        wanted = f"WHERE metric IN {d.literals(tuple(counters))}" if counters else "WHERE FALSE"
        placeholders = d.literals(tuple(PLACEHOLDER_DURATION_KINDS))
        warps = _max_warps_per_sm(run.manifest.devices)
        per_device = " ".join(f"WHEN {d.literal(k)} THEN {v!r}" for k, v in sorted(warps.items()))
        inputs = "".join(f", m.{self.alias[c]}" for c in counters)
        self.sql = (
            f"WITH counted AS (SELECT rank, slice_id{sums} FROM metrics {wanted} GROUP BY rank, slice_id) "
            f"SELECT s.id, s.name, s.kind{inputs}, "
            f"CASE WHEN s.kind IN {placeholders} THEN NULL ELSE s.dur_ns / 1e9 END AS {self.alias[Special.TIME]}, "
            f"CAST(s.flops AS DOUBLE) AS {self.alias[Special.FLOPS]}, "
            f"{f'CASE s.device {per_device} END' if per_device else 'CAST(NULL AS DOUBLE)'} "
            f"AS {self.alias[Special.MAX_WARPS_PER_SM]}, s.rank, s.pid, s.device, s.tid, s.start_ns, s.dur_ns, s.depth "
            f"FROM slices s LEFT JOIN counted m ON m.rank = s.rank AND m.slice_id = s.id WHERE {selected}"
        )

    def per_slice(self) -> pd.DataFrame:
        """One row per selected slice: ``id``, ``name``, ``kind`` and the inputs, in track order."""
        columns = ", ".join(["id", "name", "kind", *self.alias.values()])
        frame = self.run.sql(f"SELECT {columns} FROM ({self.sql}) AS inputs "
                             "ORDER BY rank, pid, device, tid, start_ns, dur_ns DESC, depth, id")
        return frame.astype({a: "float64" for a in self.alias.values()})

    def group_sizes(self) -> pd.DataFrame:
        """One row per name of the selected slices: ``name``, ``calls``."""
        return self.run.sql(f"SELECT name, count(*) AS calls FROM ({self.sql}) AS inputs GROUP BY name")

    def group_sums(self, columns: set[str]) -> pd.DataFrame:
        """Per name, each input summed over the slices that have all of ``columns`` (the mean for
        a device constant), indexed by name."""
        complete = " AND ".join(f"{self.alias[c]} IS NOT NULL" for c in sorted(columns)) or "TRUE"
        sums = ", ".join(
            f"{'avg' if c in _DEVICE_CONSTANTS else 'sum'}({self.alias[c]}) AS {self.alias[c]}" for c in sorted(columns)
        )
        summed = self.run.sql(f"SELECT name, {sums} FROM ({self.sql}) AS inputs WHERE {complete} GROUP BY name")
        return summed.set_index("name").astype("float64")

    def why_none(self, columns: set[str]) -> str:
        """Why a metric whose names the run has still has no value on the selected slices."""
        placeholders = self.run.engine.dialect.literals(tuple(PLACEHOLDER_DURATION_KINDS))
        total, timed, placeholder, warps = self.run.query(
            f"SELECT count(*), count({self.alias[Special.TIME]}), count(*) FILTER (WHERE kind IN {placeholders}), "
            f"count({self.alias[Special.MAX_WARPS_PER_SM]}) FROM ({self.sql}) AS inputs").rows[0]
        if not total:
            return "no slices selected"
        if Special.TIME in columns and not timed and placeholder == total:
            return f"time is unknown: {PROFILER_RANGE} durations are placeholders"
        if Special.MAX_WARPS_PER_SM in columns and not warps:
            return "max_warps_per_sm is unknown: the run has no device properties for these slices"
        return f"no selected slice has all of {', '.join(sorted(columns))} with a non-zero divisor"


def _max_warps_per_sm(devices: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Device name (``cuda:N``) -> most resident warps per SM, from Kineto's deviceProperties."""
    found = {}
    for position, device in enumerate(devices):
        threads, warp = device.get("maxThreadsPerMultiprocessor"), device.get("warpSize")
        if threads and warp:
            found[f"cuda:{device.get('id', position)}"] = float(threads) / float(warp)
    return found


def _group_values(
    inputs: _Inputs, groups: pd.Series, metric: DerivedMetric, columns: set[str], names: _Names
) -> Values:
    """One value per group: each input summed over the group's complete slices, then the formula."""
    summed = inputs.group_sums(columns)

    def env(column: str) -> Values:
        return np.asarray(groups.map(summed[inputs.alias[column]]).to_numpy(np.float64, na_value=np.nan))

    return names.evaluate(metric.parsed, env, len(groups))
