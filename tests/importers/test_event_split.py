"""A piece of events cut into one string per event from its bytes (dlprof.importers.event_split),
and the import of a one-line trace without a Python object or a re-serialisation per event."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from dlprof.importers import kineto_events
from dlprof.importers.chunked_json import MIN_CHUNK_BYTES, Layout, chunk_bytes_for
from dlprof.importers.event_split import event_strings, structural_strings
from dlprof.importers.kineto_events import EventParser
from dlprof.importers.trace_file import import_traces

H200_TRACE = Path(__file__).resolve().parents[1] / "data" / "h200" / "gpt2-torch-profiler.json.gz"


def op(name: str, ts: float, **args: object) -> dict[str, object]:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 1.0, "args": args}


def one_line(events: list[object]) -> bytes:
    """Events as torch's export_chrome_trace writes them: ", " between them, on one line."""
    return ", ".join(json.dumps(e) for e in events).encode()


def test_one_line_events_are_cut_into_their_own_bytes() -> None:
    events = [op("aten::linear", 1.0, **{"Input Dims": [[8, 512, 768], [3072, 768]]}), op("aten::t", 2.0)]
    strings = event_strings(one_line(events), Layout.INLINE, b"")
    assert strings is not None and len(strings) == 2
    # Each string is the event's text as it was read (the comma after it blanked), not orjson's.
    assert strings[0].as_py().rstrip(" ") == json.dumps(events[0])
    assert '"Input Dims": [[8, 512, 768], [3072, 768]]' in strings[0].as_py()
    assert [json.loads(s) for s in strings.to_pylist()] == events


@pytest.mark.parametrize("name", ['a}, {"b', 'say \\"}, {\\"', "ends in a backslash \\", 'quote " and }, {'])
def test_a_name_holding_the_separator_is_cut_by_structure(name: str) -> None:
    events = [op(name, 1.0), op("aten::mm", 2.0, note="}, {"), op("aten::add", 3.0)]
    piece = one_line(events)
    table = EventParser()(piece, Layout.INLINE)
    assert table is not None
    assert table.column("name").to_pylist() == [name, "aten::mm", "aten::add"]
    strings = structural_strings(piece)
    assert strings is not None and [json.loads(s) for s in strings.to_pylist()] == events


@pytest.mark.parametrize("piece", [
    b'{"a": 1}, 5, {"b": 2}',         # a bare value between events
    b'{"a": 1}, {"b": "unterminated',  # ends inside a string
    b'{"a": 1}, {"b": [1, 2}',         # ends inside an event
    b'{"a": 1}}, {"b": 2}',            # a bracket closes what was not opened
    b'{"a": 1}, {"b": 2} x',           # something after the last event
], ids=["bare value", "open string", "open event", "extra bracket", "trailing text"])
def test_a_piece_that_is_not_whole_events_is_not_cut_by_structure(piece: bytes) -> None:
    assert structural_strings(piece) is None


def test_a_bare_value_between_events_is_still_counted_as_damage() -> None:
    table = EventParser()(b'{"ph": "X", "name": "a", "ts": 1, "dur": 1}, 5, {"ph": "X", "name": "b", "ts": 2, "dur": 1}',
                          Layout.INLINE)
    assert table is not None
    assert table.column("damage").to_pylist() == [None, "not_an_object", None]


def test_a_one_line_trace_imports_without_writing_an_event_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Before, every event of a one-line trace (the H200's, as torch 2.11 wrote it) was parsed
    # into Python objects and written back with orjson.dumps, one call per event.
    def refuse(events: object) -> bytes:
        raise AssertionError("an event was parsed and written back")

    monkeypatch.setattr(kineto_events, "_dumped", refuse)
    manifest = import_traces([H200_TRACE], tmp_path / "run")
    assert manifest.counts["slices"] > 40_000 and not manifest.dropped


def test_pieces_are_a_quarter_of_the_json_from_2_to_16_mb(tmp_path: Path) -> None:
    small = tmp_path / "small.json"
    small.write_bytes(b" " * (1 << 20))
    assert chunk_bytes_for(small) == MIN_CHUNK_BYTES
    medium = tmp_path / "medium.json.gz"
    with gzip.open(medium, "wb") as out:  # 24 MB of JSON in a few KB: the trailer says so
        out.write(b" " * (24 << 20))
    assert medium.stat().st_size < (1 << 20) and chunk_bytes_for(medium) == 6 << 20
    large = tmp_path / "large.json"
    with large.open("wb") as out:
        out.truncate(200 << 20)
    assert chunk_bytes_for(large) == 16 << 20
