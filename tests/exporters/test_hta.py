"""The Chrome export read by the real Holistic Trace Analysis: every rank found, every kernel kept."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import dlprof
from dlprof.exporters.chrome import ChromeExporter
from tests.builders import simple_add_trace
from tests.peers.hta import hta_figures, hta_python

__all__ = ["hta_python"]  # the fixture, used by name

pytestmark = pytest.mark.slow


def test_hta_reads_each_rank_of_an_export_as_the_original(two_rank_run: Path, hta_python: Path,
                                                         tmp_path: Path) -> None:
    original = tmp_path / "original"
    original.mkdir()
    shutil.copy(simple_add_trace(), original)
    (expected,) = hta_figures(hta_python, original).values()
    assert expected["kernels"] > 0

    exported = tmp_path / "exported"
    paths = ChromeExporter().export(dlprof.load(two_rank_run), exported / "job.json")
    assert len(paths) == 2
    found = hta_figures(hta_python, exported)
    assert sorted(found) == [0, 1], "HTA finds each rank in its own file"
    for rank in (0, 1):
        assert found[rank] == expected, f"rank {rank}"
