"""MLPerf log lines read from what a program writes: the tee passes everything through, and sees
lines however they were cut into writes."""

from __future__ import annotations

import io
import json
import logging
import sys

from dlprof.support.mllog import LineTee, MllogEvent, parse_line, tee_mllog


def mllog_line(**fields: object) -> str:
    return ":::MLLOG " + json.dumps({"namespace": "", "time_ms": 1_600_000_000_123, "event_type": "POINT_IN_TIME",
                                     "key": "eval_accuracy", "value": 0.75, "metadata": {"epoch_num": 3}, **fields})


def test_a_line_gives_its_key_value_time_and_metadata() -> None:
    event = parse_line(mllog_line(metadata={"epoch_num": 3, "samples_count": 1024}))
    assert event == MllogEvent("eval_accuracy", 0.75, 1_600_000_000_123_000_000, False, 3.0, 1024)
    mark = parse_line(mllog_line(key="run_start", value=None, event_type="INTERVAL_START", metadata={}))
    assert mark is not None and mark.interval and mark.value is None


def test_other_and_damaged_lines_give_nothing() -> None:
    assert parse_line("epoch 3: accuracy 0.75") is None
    assert parse_line(":::MLLOG {not json") is None
    assert parse_line(":::MLLOG [1, 2]") is None
    assert parse_line(mllog_line(time_ms="soon")) is None
    text = parse_line(mllog_line(key="submission_benchmark", value="resnet"))
    assert text is not None and text.value is None  # a setting given as text keeps its time only
    assert parse_line(mllog_line(value=True)).value is None  # type: ignore[union-attr]


def test_the_tee_writes_through_unchanged_and_joins_lines_cut_into_pieces() -> None:
    out, seen = io.StringIO(), []
    tee = LineTee(out, seen.append)
    pieces = ["start\n", ":::MLLOG", " ", '{"key": "a"}', "\nplain\n:::MLLOG {", '"key": "b"}\n', ":::MLLOG last"]
    for piece in pieces:
        tee.write(piece)
    tee.end()
    assert out.getvalue() == "".join(pieces)
    assert seen == [':::MLLOG {"key": "a"}', ':::MLLOG {"key": "b"}', ":::MLLOG last"]


def test_tee_mllog_sees_print_and_mlperf_style_logging_then_restores_the_streams() -> None:
    saved = sys.stdout, sys.stderr
    events: list[MllogEvent] = []
    with tee_mllog(events.append):
        print(mllog_line(value=0.5))
        # mlperf_logging's default logger: a StreamHandler on sys.stdout, made once the program runs.
        logger = logging.getLogger("mllog_like")
        logger.propagate = False
        handler = logging.StreamHandler(sys.stderr)
        logger.addHandler(handler)
        logger.warning(mllog_line(value=0.6))
        logger.removeHandler(handler)
        assert sys.stdout.isatty() == saved[0].isatty()
    assert (sys.stdout, sys.stderr) == saved
    assert [e.value for e in events] == [0.5, 0.6]


def test_numbers_past_what_the_series_table_holds_read_as_absent() -> None:
    """Python's JSON reads 1e400 as infinity: before, int() of it raised OverflowError inside the
    program's print() of the line."""
    assert parse_line(mllog_line(time_ms=1e400)) is None
    assert parse_line(mllog_line(time_ms=2**63)) is None, "epoch ns past int64"
    for samples in (1e400, 2**63, float("nan")):
        event = parse_line(mllog_line(metadata={"epoch_num": 1, "samples_count": samples}))
        assert event is not None and event.samples is None and event.epoch == 1.0
    event = parse_line(":::MLLOG " + '{"key": "eval_accuracy", "time_ms": 1, "value": NaN, "metadata": {"epoch_num": 1e400}}')
    assert event is not None and event.value is None and event.epoch is None


def test_a_reader_that_fails_stops_reading_and_every_write_goes_through() -> None:
    out, failures = io.StringIO(), []

    def record(line: str) -> None:
        raise RuntimeError("the series buffer is closed")

    tee = LineTee(out, record, failures.append)
    written = [":::MLLOG {}\n", ":::MLLOG {}\n", "the rest\n"]
    for text in written:
        assert tee.write(text) == len(text)
    tee.end()
    assert out.getvalue() == "".join(written)
    assert [str(failure) for failure in failures] == ["the series buffer is closed"], "told once"


def test_a_write_that_fails_fails_as_without_the_tee() -> None:
    closed = io.StringIO()
    closed.close()
    try:
        LineTee(closed, lambda line: None).write("text\n")
    except ValueError as error:
        assert str(error) == "I/O operation on closed file"
    else:
        raise AssertionError("the closed stream's own error was not raised")
