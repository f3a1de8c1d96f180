"""``dlprof import`` of hand-made hostile traces (tests/data/hostile-traces/, one case a file).

Each case has its documented outcome (README, "Damaged traces"): a wrong file-level field refuses
the file with one line and exit 2, and leaves no run; a damaged event is dropped and counted per
reason in the manifest, the import's output and ``dlprof info``; values read leniently are kept;
an event whose JSON is broken costs that event alone (bare quotes in Kineto's field-per-line
names are mended); times implausibly far from the rest of the trace are dropped and counted.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

import dlprof
from dlprof.cli.main import main
from dlprof.keys import RunStatus, StoreTable
from dlprof.store.manifest import dropped_text

HOSTILE = Path(__file__).resolve().parents[1] / "data" / "hostile-traces"

# Refused: the words the one-line error must hold.
REFUSED = {
    "device-properties-number": "deviceProperties is 5, not a list of objects",
    "device-properties-not-objects": "deviceProperties is [1, 'gpu'], not a list of objects",
    "base-time-1e300": "baseTimeNanoseconds is 1e+300",
    "base-time-negative": "baseTimeNanoseconds is -5",
    "base-time-string": "baseTimeNanoseconds is '1700000000000000000'",
    "base-time-after-events-1e300": "baseTimeNanoseconds is 1e+300",
    "rank-2-to-the-62": "distributedInfo.rank is 4611686018427387904, not an integer from 0 to 65535",
    "rank-true": "distributedInfo.rank is True",
    "rank-negative": "distributedInfo.rank is -1",
    "distributed-info-list": "distributedInfo is [0], not an object",
    "world-size-zero": "distributedInfo.world_size is 0",
    "trace-events-number": "traceEvents is not an array",
    "every-event-without-phase": "nothing to import (its 2 events dropped as damaged: ph missing or not a string: 2)",
    "empty-event-list": "an empty trace (no events)",
    "trailing-data": "trailing data after the JSON document",
}
# Imported with the damaged events dropped: the counts per reason. Every file holds one sound op,
# aten::mm, which must be kept.
DROPPED = {
    "events-not-objects": {"not_an_object": 4},
    "name-number": {"name_missing_or_not_a_string": 1},
    "name-list": {"name_missing_or_not_a_string": 1},
    "name-null": {"name_missing_or_not_a_string": 1},
    "name-missing": {"name_missing_or_not_a_string": 1},
    "category-number": {"cat_not_a_string": 1},
    "category-list": {"cat_not_a_string": 1},
    "ts-string": {"ts_missing_or_not_a_number": 1},
    "ts-null": {"ts_missing_or_not_a_number": 1},
    "ts-missing": {"ts_missing_or_not_a_number": 1},
    "ts-true": {"ts_missing_or_not_a_number": 1},
    "ts-1e300": {"ts_out_of_range": 1},
    "ts-2-to-the-64": {"ts_out_of_range": 1},
    "dur-null": {"dur_missing_or_not_a_number": 1},
    "dur-missing": {"dur_missing_or_not_a_number": 1},
    "dur-string": {"dur_missing_or_not_a_number": 1},
    "dur-negative": {"dur_negative": 1},
    "dur-1e300": {"dur_out_of_range": 1},
    "dur-2-to-the-64": {"dur_out_of_range": 1},
    "args-number": {"args_not_an_object": 1},
    "args-list": {"args_not_an_object": 1},
    "phase-missing": {"ph_missing_or_not_a_string": 1},
    "phase-number": {"ph_missing_or_not_a_string": 1},
    "memory-event-without-ts": {"ts_missing_or_not_a_number": 1},
    "counter-event-without-ts": {"ts_missing_or_not_a_number": 1},
    "clock-marker-without-ts": {"ts_missing_or_not_a_number": 1},
    # "util": 1e400 and "label": "busy" left out; "memory": 12 kept
    "counter-values-not-finite": {"counter_value_not_a_finite_number": 2},
    # the JSON of one event broken: it alone is dropped, the rest read
    "event-not-json": {"invalid_json": 1},
    "name-invalid-utf8": {"invalid_json": 1},
}
# Among sound ops (every kept one aten::mm), ops whose start or end lies implausibly far from the
# others': what is dropped, and how many ops are kept.
FAR = {
    "ts-far-from-the-others": ({"ts_implausible": 1}, 3),  # "ts": 0.5 among times of 2023
    "durations-summing-past-int64": ({"dur_implausible": 8}, 3),  # eight of 3e18 ns each
}
# Imported whole once mended: the names as the program gave them.
MENDED = {"name-with-bare-quotes": ["aten::mm", 'say "hi" twice']}
# Imported whole: values read leniently (a null category is none; a pid past int64 or a tid that
# is a list numbered as a name is; arguments of the wrong type read as absent).
KEPT = ("category-null", "pid-2-to-the-64-and-tid-list", "arg-values-of-the-wrong-type", "shapes-huge-integer",
        "utf8-byte-order-mark")


def import_case(name: str, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``dlprof import -o OUT CASE``, in-process: exit status, stdout and stderr."""
    status = main(["import", "-o", str(out), str(HOSTILE / f"{name}.json")])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_every_case_has_its_outcome() -> None:
    cases = {path.stem for path in HOSTILE.glob("*.json")}
    assert cases == set(REFUSED) | set(DROPPED) | set(KEPT) | set(FAR) | set(MENDED)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_bad_file_level_fields_refuse_the_file(name: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = import_case(name, tmp_path / "run", capsys)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("dlprof: error: "), err
    assert f"{HOSTILE / name}.json: " in err and REFUSED[name] in err
    assert not (tmp_path / "run").exists(), "a refused import leaves no run behind"


@pytest.mark.parametrize("name", sorted(DROPPED))
def test_damaged_events_are_dropped_and_counted(name: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    expected = DROPPED[name]
    status, out, err = import_case(name, tmp_path / "run", capsys)
    assert status == 0 and err == ""
    shown = ", ".join(f"{reason.replace('_', ' ')}: {count}" for reason, count in expected.items())
    assert f"dropped as damaged: {shown}\n" in out
    run = dlprof.load(tmp_path / "run")
    assert run.status is RunStatus.COMPLETE
    assert run.manifest.dropped == expected
    assert list(run.slices["name"]) == ["aten::mm"], "the sound op is kept, the damaged ones are not"
    assert main(["info", str(tmp_path / "run")]) == 0
    assert shown in " ".join(capsys.readouterr().out.split())  # info wraps to the terminal


def test_a_counter_keeps_its_finite_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert import_case("counter-values-not-finite", tmp_path / "run", capsys)[0] == 0
    counters = dlprof.load(tmp_path / "run").counters
    assert list(zip(counters["track"], counters["value"], strict=True)) == [("gpu.memory", 12.0)]


@pytest.mark.parametrize("name", KEPT)
def test_values_read_leniently_keep_their_event(name: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = import_case(name, tmp_path / "run", capsys)
    assert status == 0 and "dropped" not in out
    run = dlprof.load(tmp_path / "run")
    assert run.manifest.dropped == {}
    slices = run.slices.set_index("name")
    assert sorted(slices.index) == ["aten::add", "aten::mm"]
    added = slices.loc["aten::add"]
    assert added.start_ns == 20_000 and added.dur_ns == 5_000


def test_wrong_arguments_read_as_absent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert import_case("arg-values-of-the-wrong-type", tmp_path / "run", capsys)[0] == 0
    added = dlprof.load(tmp_path / "run").slices.set_index("name").loc["aten::add"]
    assert all(pd.isna(added[column]) for column in ("flops", "correlation_id", "external_id"))


def test_flops_past_int64_from_huge_shapes_read_as_absent(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert import_case("shapes-huge-integer", tmp_path / "run", capsys)[0] == 0
    added = dlprof.load(tmp_path / "run").slices.set_index("name").loc["aten::add"]
    assert pd.isna(added["flops"]) and "1000000000000000000000000000000" in added["input_shapes"]


@pytest.mark.parametrize("name", sorted(FAR))
def test_times_far_from_the_others_are_dropped_and_counted(name: str, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    expected, kept = FAR[name]
    status, out, err = import_case(name, tmp_path / "run", capsys)
    assert status == 0 and err == "" and f"dropped as damaged: {dropped_text(expected)}" in out
    run = dlprof.load(tmp_path / "run")
    assert run.manifest.dropped == expected
    assert list(run.slices["name"]) == ["aten::mm"] * kept
    assert run.manifest.start_ns // 10**9 == 1_700_000_000, "the run starts with its ops, not in 1970"
    assert main(["top", str(tmp_path / "run")]) == 0, "the sums of what is kept fit"


def test_a_name_with_bare_quotes_is_mended_not_lost(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = import_case("name-with-bare-quotes", tmp_path / "run", capsys)
    assert status == 0 and err == "" and "dropped" not in out
    run = dlprof.load(tmp_path / "run")
    assert sorted(run.slices["name"]) == MENDED["name-with-bare-quotes"]
    assert run.manifest.dropped == {}


@pytest.mark.parametrize("make, words", [
    (lambda path: path.mkdir(), "a directory, not a trace file"),
    (lambda path: os.mkfifo(path), "a FIFO (named pipe), not a trace file"),
])
def test_what_is_not_a_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     make: Callable[[Path], None], words: str) -> None:
    path = tmp_path / "trace.json"
    make(path)
    assert main(["import", "-o", str(tmp_path / "run"), str(path)]) == 2
    assert capsys.readouterr().err == f"dlprof: error: {path}: {words}\n"
    assert main(["import", "-o", str(tmp_path / "run"), "/dev/zero"]) == 2
    assert capsys.readouterr().err == "dlprof: error: /dev/zero: a character device, not a trace file\n"


def test_a_file_that_fails_after_another_was_written_leaves_no_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good, bad = HOSTILE / "name-number.json", HOSTILE / "every-event-without-phase.json"
    assert main(["import", "-o", str(tmp_path / "run"), str(good), str(bad)]) == 2
    assert "nothing to import" in capsys.readouterr().err
    assert not (tmp_path / "run").exists(), "rank 0's rows were written, then removed with the run"
    (tmp_path / "empty").mkdir()
    assert main(["import", "-o", str(tmp_path / "empty"), str(good), str(bad)]) == 2
    assert list((tmp_path / "empty").iterdir()) == [], "a directory that was empty is left empty"


def test_damage_counts_add_up_over_ranks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = [str(HOSTILE / f"{name}.json") for name in ("ts-null", "ts-missing", "dur-negative")]
    assert main(["import", "-o", str(tmp_path / "run"), *files]) == 0
    assert "dropped as damaged: ts missing or not a number: 2, dur negative: 1" in capsys.readouterr().out
    manifest = json.loads((tmp_path / "run" / "run.json").read_text())
    assert manifest["dropped"] == {"ts_missing_or_not_a_number": 2, "dur_negative": 1}
    assert sorted(path.name for path in (tmp_path / "run" / "slices").iterdir()) == ["rank=0", "rank=1", "rank=2"]


def test_a_collector_cycle_reports_what_it_dropped(tmp_path: Path) -> None:
    """The torch collector converts its cycles through the same checks; what they drop reaches
    the collector's result (and from there the run's notes), not only dlprof import's."""
    import shutil

    from dlprof.importers.kineto_cycle import CycleJob, convert_cycle

    trace = tmp_path / "cycle-00000.json"
    shutil.copy(HOSTILE / "dur-negative.json", trace)
    rows, result = convert_cycle(CycleJob(trace=trace, rank=0, cycle=0, pid=1, marker_window_ns=None))
    assert result["dropped"] == DROPPED["dur-negative"]
    assert sum(table.num_rows for table in rows[StoreTable.SLICES]) == result["slices"] == 1


@pytest.mark.parametrize("name", sorted(FAR))
def test_a_collector_cycle_drops_times_far_from_the_others(name: str, tmp_path: Path) -> None:
    """A live cycle is judged as an imported trace is: before, its event at "ts": 0.5 made the run
    start in 1970 and its eight durations of 3e18 ns were kept, past int64 once added up."""
    import shutil

    from dlprof.importers.kineto_cycle import CycleJob, convert_cycle

    expected, kept = FAR[name]
    trace = tmp_path / "cycle-00000.json"
    shutil.copy(HOSTILE / f"{name}.json", trace)
    rows, result = convert_cycle(CycleJob(trace=trace, rank=0, cycle=0, pid=1, marker_window_ns=None))
    assert result["dropped"] == expected
    (slices,) = rows[StoreTable.SLICES]
    assert slices.column("name").to_pylist() == ["aten::mm"] * kept == ["aten::mm"] * result["slices"]
    assert min(slices.column("start_ns").to_pylist()) // 10**9 == 1_700_000_000
