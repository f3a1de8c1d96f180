"""``dlprof counters``: the counters per backend, and why a backend cannot count here."""

from __future__ import annotations

import importlib.util
import json

import pytest

from dlprof.cli.main import main
from dlprof.support.perf_event import available_events


def test_lists_task_clock_and_why_papi_is_unavailable(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["counters"]) == 0
    out = capsys.readouterr().out
    task_clock = next(line for line in out.splitlines() if line.strip().startswith("task-clock"))
    expected = "yes" if next(i for i in available_events() if i.name == "task-clock").available else "no"
    assert f" {expected} " in task_clock
    if importlib.util.find_spec("pypapi") is None:
        assert "PAPI: python-papi is not installed (pip install 'dlprof[papi]')" in out
    assert "CUPTI:" in out and "NVML:" in out
    from dlprof.collectors.rapl import RaplCollector

    rapl_ok, rapl_reason = RaplCollector.available()
    assert ("RAPL: samples CPU package energy" in out) if rapl_ok else (f"RAPL: {rapl_reason[6:40]}" in out)


def test_json_format(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["counters", "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    names = {c["name"]: c for c in document["counters"]}
    assert {"task-clock", "page-faults", "cycles"} <= set(names)
    assert set(names["task-clock"]) == {"name", "backend", "description", "unit", "available", "reason"}
    assert [b["name"] for b in document["backends"]] == ["perf_event", "PAPI", "CUPTI", "NVML", "RAPL"]
    assert all(b["available"] or b["reason"] for b in document["backends"])
