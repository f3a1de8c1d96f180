"""Events whose JSON is broken: repaired where the damage is known, else dropped one by one.

torch 2.13 writes a ``record_function`` name holding ``"`` unescaped (``"name": "a"b",``), which
makes the whole cycle's JSON invalid; a trace cut or edited by hand can break one event the same
way. Once a piece of events does not parse, :func:`salvage` takes its events one at a time (the
file's layout says where each ends, see :mod:`dlprof.importers.chunked_json`)::

    kept = salvage([b'{"name": "a"b", "ph": "X"}', b'{"ph": "X", ...}'], final=False)
    kept.events     # each event's JSON, repaired or as it was
    kept.dropped    # 0: the quote was escaped

In Kineto's own layout every field has its line, so a string field whose value holds bare
quotes is mended by escaping them (:func:`repair_fields`); any other event that does not parse
is dropped and counted (``invalid_json``). Nothing is decided where the piece may only have
been cut short: an unreadable last event of a piece that is not the file's last waits for more
of the file, and a piece mostly unreadable is not salvaged until the file's end (its layout was
guessed wrong; reading on finds its true boundaries).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import orjson

_SPACE = b" \t\r\n,"
# One field on its own line whose value is a string: the key and the opening quote, the value,
# and the closing quote with the comma after it. The value is taken up to the line's last quote.
_STRING_FIELD = re.compile(rb'^([ \t]*"(?:[^"\\\n]|\\.)*"[ \t]*:[ \t]*")(.*)("[ \t\r]*,?[ \t\r]*)$', re.MULTILINE)
_BARE_QUOTE = re.compile(rb'(?<!\\)"')


@dataclass
class Salvaged:
    """What a piece's events came to, one by one."""

    events: list[bytes] = field(default_factory=list)  # JSON text of each event kept
    dropped: int = 0  # events that could not be read, nor repaired
    repaired: int = 0  # events kept once their bare quotes were escaped


def salvage(events: list[bytes], final: bool) -> Salvaged | None:
    """Keep what can be read of events that do not parse together.

    Args:
        events: the piece's events as the layout cuts them (whitespace and commas around each
            are ignored).
        final: the piece ends where the events array does, so its last event is whole.

    Returns:
        The events kept and the counts, or None when the piece may have been cut wrong (its
        last event is unreadable and more of the file follows, or no more events read than not,
        while more follows).
    """
    result = Salvaged()
    texts = [text for text in (event.strip(_SPACE) for event in events) if text]
    for number, text in enumerate(texts):
        if _parses(text):
            result.events.append(text)
            continue
        repaired = repair_fields(text)
        if repaired is not None:
            result.events.append(repaired)
            result.repaired += 1
            continue
        if number == len(texts) - 1 and not final:
            return None  # perhaps only cut short: read on
        result.dropped += 1
    if result.dropped >= len(result.events) and not final:
        return None  # mostly unreadable: cut at the wrong places, most likely
    return result


def repair_fields(text: bytes) -> bytes | None:
    """An event whose string fields (one a line, as Kineto writes them) hold bare quotes, with
    those quotes escaped; None when that does not make it parse."""
    if b"\n" not in text:
        return None  # one line: where a value ends cannot be told from the layout
    mended = _STRING_FIELD.sub(lambda m: m[1] + _BARE_QUOTE.sub(rb'\\"', m[2]) + m[3], text)
    return mended if mended != text and _parses(mended) else None


def _parses(text: bytes) -> bool:
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return True
