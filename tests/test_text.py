"""Text from data made safe to print: control characters and bidirectional controls shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlprof.text import printable
from dlprof.viewers import screen


@pytest.mark.parametrize("control", ["\u202e", "\u202d", "\u2066", "\u2067", "\u2068", "\u2069", "\u200e",
                                     "\u200f", "\u061c", "\u202a", "\u2028", "\u2029"])
def test_bidirectional_controls_and_separators_are_shown_not_obeyed(control: str) -> None:
    shown = printable(f"evil{control}gnp.py")
    assert shown == "evil\ufffdgnp.py"


def test_control_characters_keep_their_pictures_and_paths_are_taken() -> None:
    assert printable("\x1b]0;title\x07") == "\u241b]0;title\u2407"
    assert printable(Path("/tmp/\x1b[2Jrun")) == "/tmp/\u241b[2Jrun"
    assert printable("caf\u00e9 \u6f22\u5b57") == "caf\u00e9 \u6f22\u5b57", "ordinary text is left alone"


def test_the_viewers_print_through_the_same_sanitiser() -> None:
    assert screen.printable is printable
