"""The PAPI counting path: the reason it reports is PAPI's own, and a run goes on without it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import dlprof
from dlprof.collectors.counters import PapiCounters, known_counter, papi_status, papi_unusable


def papi_low():  # type: ignore[no-untyped-def]
    if importlib.util.find_spec("pypapi") is None:
        pytest.skip("python-papi is not installed (pip install 'dlprof[papi]')")
    from pypapi import papi_low as papi

    papi.library_init()
    return papi


def test_papi_names_are_known_counters() -> None:
    assert known_counter("PAPI_TOT_INS") and known_counter("task-clock")
    assert not known_counter("PAPI_") and not known_counter("bogus")


def test_the_reason_is_what_papi_reports() -> None:
    papi = papi_low()
    components = [papi.get_component_info(i) for i in range(papi.num_components())]
    status = papi_status()
    if any(not c.disabled for c in components):
        assert status.available and papi_unusable() == ""
        return
    assert not status.available
    for component in components:
        assert f"{component.name}: {component.disabled_reason}" in status.reason


def test_papi_counts_or_says_why_and_the_run_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    papi_low()
    probe = PapiCounters(("PAPI_TOT_INS",))
    probe.close()
    with dlprof.profile(out=tmp_path / "run", collectors=("host",),
                        counters=["PAPI_TOT_INS", "task-clock"]) as prof:
        with dlprof.region("work"):
            sum(range(100_000))
        prof.step()
    run = dlprof.load(tmp_path / "run")
    metrics = set(run.metrics["metric"].astype(str))
    if probe.failed:
        why = probe.failed["PAPI_TOT_INS"]
        assert f"dlprof: counter PAPI_TOT_INS: not counted: {why}" in capsys.readouterr().err
        assert "papi:PAPI_TOT_INS" not in metrics
    else:
        instructions = run.metrics[run.metrics["metric"].astype(str) == "papi:PAPI_TOT_INS"]
        assert (instructions["value"] > 0).all() and len(instructions) >= 2
