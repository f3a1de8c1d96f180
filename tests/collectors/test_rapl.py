"""The rapl collector: the power PMU's description read as the kernel lays it out in sysfs, the
kernel's own refusals, and package energy per step from samples written through the collector's
translation. (No RAPL here, a virtual machine: the counters were not read on hardware.)"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import dlprof
from dlprof.analysis.energy import PowerSource, step_energy
from dlprof.analysis.steps import step_report
from dlprof.collectors.rapl import RaplCollector, energy_table, package_device
from dlprof.keys import StoreTable
from dlprof.store.writer import RankWriter
from dlprof.support.perf_event import EventSpec
from dlprof.support.rapl import EnergyEvent, PackageEnergy, RaplUnavailable, energy_event

JOULES_PER_COUNT = 2.3283064365386962890625e-10  # 1/2^32 J, a common RAPL energy unit


def power_pmu(root: Path, cpumask: str = "0", terms: str = "event=0x02") -> Path:
    """A power PMU's sysfs directory as the kernel writes it."""
    (root / "events").mkdir(parents=True)
    (root / "format").mkdir()
    (root / "type").write_text("13\n")
    (root / "cpumask").write_text(cpumask + "\n")
    (root / "events" / "energy-pkg").write_text(terms + "\n")
    (root / "events" / "energy-pkg.scale").write_text(f"{JOULES_PER_COUNT!r}\n")
    (root / "events" / "energy-pkg.unit").write_text("Joules\n")
    (root / "format" / "event").write_text("config:0-7\n")
    (root / "format" / "umask").write_text("config:8-15\n")
    return root


def test_the_event_is_read_from_the_pmus_description(tmp_path: Path) -> None:
    event = energy_event(power_pmu(tmp_path / "power"))
    assert event.spec.type == 13 and event.spec.config == 0x02
    assert event.joules_per_count == JOULES_PER_COUNT and event.cpus == (0,)
    two = energy_event(power_pmu(tmp_path / "two", cpumask="0,18", terms="event=0x02,umask=0x1"))
    assert two.spec.config == 0x102 and two.cpus == (0, 18)
    assert energy_event(power_pmu(tmp_path / "range", cpumask="0-1,8")).cpus == (0, 1, 8)


def test_no_pmu_is_one_line_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(RaplUnavailable, match="no power PMU"):
        energy_event(tmp_path / "missing")
    broken = power_pmu(tmp_path / "broken")
    (broken / "events" / "energy-pkg").write_text("event=0x02,config1_thing=1\n")
    (broken / "format" / "config1_thing").write_text("config1:0-3\n")
    with pytest.raises(RaplUnavailable, match="config1"):
        energy_event(broken)


def test_this_machine_says_why_it_has_no_rapl() -> None:
    # A virtual machine without the power PMU: the collector is unavailable, with the reason.
    ok, reason = RaplCollector.available()
    if ok:
        pytest.skip("this machine has RAPL; the hardware path is covered by the runs")
    assert reason.startswith("RAPL: ") and "\n" not in reason


def test_the_kernels_refusal_is_one_line() -> None:
    # A perf type no PMU has: the real perf_event_open refuses it, and the reason says so.
    bogus = EnergyEvent(EventSpec(0x7FFF_FFF0, 2, "none", "J"), JOULES_PER_COUNT, (0,))
    with pytest.raises(RaplUnavailable, match="perf_event_open refused") as refused:
        PackageEnergy(bogus)
    assert "\n" not in str(refused.value)


def test_package_energy_per_step(tmp_path: Path) -> None:
    """Two packages drawing 30 W and 45 W: each step's joules are the power times its time."""
    run_dir = tmp_path / "run"
    with dlprof.profile(out=run_dir, collectors=["host"]) as prof:
        for _ in range(5):
            time.sleep(0.02)
            prof.step()
    run = dlprof.load(run_dir)
    origin = run.manifest.start_ns
    times = list(range(origin, run.manifest.end_ns + 10_000_000, 2_000_000))
    watts = (30.0, 45.0)
    counted = [tuple(1000.0 + w * (ts - origin) / 1e9 for w in watts) for ts in times]
    table = energy_table(times, counted, counted[0], pid=1)
    assert set(table["device"].to_pylist()) == {package_device(0, 2), package_device(1, 2)} == {"cpu:0", "cpu:1"}
    assert min(table["value"].to_pylist()) == 0.0, "joules counted since profiling started"
    writer = RankWriter(run_dir, 0)
    writer.write_chunk(StoreTable.COUNTERS, table, "rapl")
    writer.compact()
    run = dlprof.load(run_dir)
    energy = step_energy(run)
    assert set(energy["source"]) == {PowerSource.RAPL}
    for step in step_report(run).steps.itertuples():
        rows = energy[energy["start_ns"] == step.start_ns].set_index("device")
        for device, power in zip(("cpu:0", "cpu:1"), watts, strict=True):
            assert rows.loc[device, "joules"] == pytest.approx(power * step.dur_ns / 1e9, rel=1e-6)
            assert rows.loc[device, "watts"] == pytest.approx(power, rel=1e-6)
