"""Diffing two runs, checked against figures this file computes itself from the raw traces.

The control and test traces of one model (HTA's trace_diff) are imported into runs; the expected
calls, times, totals and regressions are summed here from the gzipped JSON with ``json``, never
through dlprof. Native torch runs of different lengths check the per-step path.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pandas as pd
import pytest

import dlprof
from dlprof.analysis.diff import (
    DIFF_COLUMNS,
    TOTAL_NAME,
    Change,
    choose_basis,
    diff,
    limit_names,
    regressed,
    work_steps,
)
from dlprof.keys import DiffBasis, Kind
from dlprof.store.reader import Run
from tests.conftest import profile_tiny_cnn
from tests.references import raw_trace

# Trace categories behind the kinds compared by default.
CATEGORY = {Kind.OP: "cpu_op", Kind.KERNEL: "kernel"}


def busy_ns(events: list[dict[str, object]], category: str, leave_out: frozenset[str]) -> int:
    """Time covered by a category's events, each thread's instants counted once (interval union)."""
    by_thread: dict[tuple[object, object], list[tuple[int, int]]] = defaultdict(list)
    for e in events:
        if e["cat"] == category and e["name"] not in leave_out:
            start = int(e["ts"]) * 1000  # type: ignore[call-overload]
            by_thread[(e["pid"], e["tid"])].append((start, start + int(e["dur"]) * 1000))  # type: ignore[call-overload]
    covered = 0
    for intervals in by_thread.values():
        end = None
        for start, stop in sorted(intervals):
            if end is None or start > end:
                covered += stop - start
                end = stop
            elif stop > end:
                covered += stop - end
                end = stop
    return covered


def names_of_kind(run: Run, kind: str) -> frozenset[str]:
    return frozenset(run.slices.loc[run.slices["kind"] == kind, "name"].astype(str))


@pytest.fixture(scope="module")
def loaded(trace_diff_runs: tuple[Path, Path]) -> tuple[Run, Run]:
    return dlprof.load(trace_diff_runs[0]), dlprof.load(trace_diff_runs[1])


@pytest.fixture(scope="module")
def per_step(loaded: tuple[Run, Run]) -> pd.DataFrame:
    return diff(*loaded, per=DiffBasis.STEP)


def expected_rows(kind: str, per: DiffBasis, leave_out: frozenset[str] = frozenset()) -> pd.DataFrame:
    """Calls and time per name in both traces, from the raw JSON, per step or per run."""
    rows = []
    control, test = raw_trace("control"), raw_trace("test")
    names = {n for raw in (control, test) for (c, n) in raw.calls if c == CATEGORY[kind]} - leave_out
    for name in names:
        row: dict[str, object] = {"name": name}
        for side, raw in (("a", control), ("b", test)):
            divisor = raw.steps if per is DiffBasis.STEP else 1
            row[f"calls_{side}"] = raw.calls.get((CATEGORY[kind], name), 0) / divisor
            row[f"time_{side}_ns"] = raw.time_ns.get((CATEGORY[kind], name), 0) / divisor
        rows.append(row)
    return pd.DataFrame(rows).set_index("name")


@pytest.mark.parametrize("kind", [Kind.OP, Kind.KERNEL])
def test_names_match_the_raw_traces_per_step(kind: str, per_step: pd.DataFrame, loaded: tuple[Run, Run]) -> None:
    comm = names_of_kind(loaded[0], Kind.COMM) | names_of_kind(loaded[1], Kind.COMM)
    want = expected_rows(kind, DiffBasis.STEP, leave_out=comm)
    got = per_step[(per_step["kind"] == kind) & (per_step["status"] != Change.TOTAL)].set_index("name")
    assert raw_trace("control").steps == raw_trace("test").steps == 6
    assert set(got.index) == set(want.index) and got.index.is_unique
    want = want.loc[got.index]
    assert got["calls_a"].tolist() == pytest.approx(want["calls_a"].tolist())
    assert got["calls_b"].tolist() == pytest.approx(want["calls_b"].tolist())
    # Per-step times are rounded to whole nanoseconds.
    assert (got["time_a_ns"] - want["time_a_ns"]).abs().max() <= 0.5
    assert (got["time_b_ns"] - want["time_b_ns"]).abs().max() <= 0.5
    expected_status = [
        Change.BOTH if a and b else Change.NEW if b else Change.VANISHED
        for a, b in zip(want["calls_a"], want["calls_b"], strict=True)
    ]
    assert got["status"].tolist() == expected_status
    assert (got["status"] == Change.NEW).any() and (got["status"] == Change.VANISHED).any()


def test_totals_count_each_instant_once(per_step: pd.DataFrame, loaded: tuple[Run, Run]) -> None:
    totals = per_step[per_step["status"] == Change.TOTAL].set_index("kind")
    assert list(totals.index) == [Kind.OP, Kind.KERNEL]
    assert set(totals["name"]) == {TOTAL_NAME}
    for side, run, trace in (("a", loaded[0], "control"), ("b", loaded[1], "test")):
        raw = raw_trace(trace)
        comm = names_of_kind(run, Kind.COMM)
        op_busy = busy_ns(raw.events, "cpu_op", comm)
        kernel_time = sum(t for (c, _), t in raw.time_ns.items() if c == "kernel")
        assert totals.loc[Kind.OP, f"time_{side}_ns"] == round(op_busy / raw.steps)
        # Nested ops: the total is far below the sum of every op's time.
        all_ops = sum(t for (c, n), t in raw.time_ns.items() if c == "cpu_op" and n not in comm)
        assert op_busy < all_ops / 2
        assert totals.loc[Kind.KERNEL, f"time_{side}_ns"] == round(kernel_time / raw.steps)
        kernel_rows = per_step[(per_step["kind"] == Kind.KERNEL) & (per_step["status"] != Change.TOTAL)]
        assert kernel_rows[f"share_{side}_pct"].sum() == pytest.approx(100.0, abs=1e-6)


def test_rows_by_absolute_change(per_step: pd.DataFrame) -> None:
    assert list(per_step.columns) == DIFF_COLUMNS
    assert set(per_step["per"]) == {DiffBasis.STEP}
    for _, section in per_step.groupby("kind", sort=False):
        assert section["status"].iloc[0] == Change.TOTAL
        change = section["delta_ns"].iloc[1:].abs().tolist()
        assert change == sorted(change, reverse=True)
    assert (per_step["delta_ns"] == per_step["time_b_ns"] - per_step["time_a_ns"]).all()
    both = per_step[per_step["status"] == Change.BOTH]
    assert both["delta_pct"].tolist() == pytest.approx((100 * both["delta_ns"] / both["time_a_ns"]).tolist())
    assert per_step.loc[per_step["status"] == Change.NEW, "delta_pct"].isna().all()


def test_whole_run_totals(loaded: tuple[Run, Run]) -> None:
    table = diff(*loaded, kinds=(Kind.KERNEL,), per=DiffBasis.RUN)
    rows = table[table["status"] != Change.TOTAL].set_index("name")
    want = expected_rows(Kind.KERNEL, DiffBasis.RUN).loc[rows.index]
    assert rows["time_a_ns"].tolist() == want["time_a_ns"].tolist()
    assert rows["time_b_ns"].tolist() == want["time_b_ns"].tolist()
    assert rows["calls_b"].tolist() == want["calls_b"].tolist()
    assert rows["calls_b"].dtype.kind == "i"  # whole counts stay whole
    average = rows[rows["calls_a"] > 0]
    assert (average["avg_a_ns"] == (average["time_a_ns"] / average["calls_a"]).round()).all()


def test_regression_rule(per_step: pd.DataFrame, loaded: tuple[Run, Run]) -> None:
    above_pct, floor_ns = 20.0, 1_000_000
    comm = names_of_kind(loaded[0], Kind.COMM) | names_of_kind(loaded[1], Kind.COMM)
    expected: set[tuple[str, str]] = set()
    for kind in (Kind.OP, Kind.KERNEL):
        want = expected_rows(kind, DiffBasis.STEP, leave_out=comm)
        grew = want["time_b_ns"] - want["time_a_ns"]
        hit = (want["time_b_ns"] > want["time_a_ns"] * 1.2) & (grew >= floor_ns)
        expected |= {(str(kind), name) for name in want.index[hit]}
    flagged = per_step[regressed(per_step, above_pct, floor_ns)]
    named = flagged[flagged["status"] != Change.TOTAL]
    assert set(zip(named["kind"], named["name"], strict=True)) == expected
    assert {Change.NEW, Change.BOTH} <= set(named["status"])  # new names count, changed ones too
    # Both totals grew by far more than 20%: they regress too.
    assert set(flagged.loc[flagged["status"] == Change.TOTAL, "kind"]) == {Kind.OP, Kind.KERNEL}
    assert not regressed(per_step, 0.0, float(per_step["delta_ns"].max()) + 1).any()
    assert not regressed(per_step[per_step["status"] == Change.VANISHED], 0.0, 0).any()


def test_limit_keeps_totals(per_step: pd.DataFrame) -> None:
    cut = limit_names(per_step, 3)
    assert list(cut["status"]).count(Change.TOTAL) == 2
    assert cut.groupby("kind").size().to_dict() == {Kind.OP: 4, Kind.KERNEL: 4}
    assert limit_names(per_step, 0) is per_step


def test_ranks_compare_one_against_another(gpu_run: Path, two_rank_run: Path) -> None:
    both, one = dlprof.load(two_rank_run), dlprof.load(gpu_run)
    assert choose_basis(both, one) is DiffBasis.RUN  # no steps in this trace
    with pytest.raises(ValueError, match="no steps"):
        choose_basis(both, one, requested=DiffBasis.STEP)
    same = diff(both, one, per=DiffBasis.RUN, ranks=(1, 0))
    assert (same["delta_ns"] == 0).all() and (same["status"].isin([Change.BOTH, Change.TOTAL])).all()
    summed = diff(both, one, per=DiffBasis.RUN)  # every rank of A: the same trace twice
    assert (summed["time_a_ns"] == 2 * summed["time_b_ns"]).all()
    assert (summed["calls_a"] == 2 * summed["calls_b"]).all()


@pytest.fixture(scope="module")
def short_cnn_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny CNN again, for 3 steps instead of 6."""
    return profile_tiny_cnn(tmp_path_factory.mktemp("runs") / "cnn3", steps=3)


@pytest.mark.torch
def test_native_runs_of_different_lengths_compare_per_step(cnn_run: Path, short_cnn_run: Path) -> None:
    long_run, short_run = dlprof.load(cnn_run), dlprof.load(short_cnn_run)
    # The session also records the empty tail after the last step(): a step slice, not a step.
    assert (long_run.slices["kind"] == Kind.STEP).sum() == 7
    assert (work_steps(long_run), work_steps(short_run)) == (6, 3)
    assert choose_basis(long_run, short_run) is DiffBasis.STEP
    table = diff(long_run, short_run, kinds=(Kind.OP, Kind.MODULE))
    assert set(table["kind"]) == {Kind.OP, Kind.MODULE}
    for run, side, steps in ((long_run, "a", 6), (short_run, "b", 3)):
        ops = run.slices[run.slices["kind"] == Kind.OP]
        sums = ops.groupby("name")["dur_ns"].sum()
        counts = ops.groupby("name").size()
        rows = table[(table["kind"] == Kind.OP) & (table["status"] != Change.TOTAL)].set_index("name")
        assert rows[f"time_{side}_ns"].to_dict() == {n: round(t / steps) for n, t in sums.items()}
        assert rows[f"calls_{side}"].to_dict() == pytest.approx({n: c / steps for n, c in counts.items()})
    # The same model: the same ops, as often per step.
    assert set(table["status"]) == {Change.TOTAL, Change.BOTH}
    assert (table["calls_a"] == table["calls_b"]).all()


@pytest.mark.torch
def test_one_rank_against_another_per_step(two_rank_gloo_run: Path) -> None:
    run = dlprof.load(two_rank_gloo_run)
    steps = {rank: work_steps(run, rank) for rank in (0, 1)}
    assert all(steps.values()) and work_steps(run) == steps[0] + steps[1]
    table = diff(run, run, kinds=(Kind.OP, Kind.COMM), ranks=(0, 1))
    for side, rank in (("a", 0), ("b", 1)):
        slices = run.slices[run.slices["rank"] == rank]
        for kind in (Kind.OP, Kind.COMM):
            sums = slices[slices["kind"] == kind].groupby("name")["dur_ns"].sum()
            rows = table[(table["kind"] == kind) & (table["status"] != Change.TOTAL)].set_index("name")
            present = rows[rows[f"calls_{side}"] > 0]
            assert present[f"time_{side}_ns"].to_dict() == {n: round(t / steps[rank]) for n, t in sums.items()}
    assert (table.loc[table["kind"] == Kind.COMM, "status"] == Change.BOTH).any()  # collectives on both ranks
