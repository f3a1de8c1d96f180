"""The counters collector: perf_event counts per step and region, through the API and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import dlprof
from dlprof.cli.main import main
from dlprof.support.perf_event import PerfCounters

DLPROF = [sys.executable, "-m", "dlprof"]


@pytest.fixture(autouse=True)
def _needs_perf_event() -> None:
    probe = PerfCounters(["task-clock", "page-faults"])
    probe.close()
    if probe.failed:
        pytest.skip(f"perf_event_open cannot count here: {probe.failed}")


def touch_memory() -> bytearray:
    memory = bytearray(64 << 20)
    memory[::4096] = b"\1" * (len(memory) // 4096)
    return memory


def profile_regions(out: Path) -> Path:
    with dlprof.profile(out=out, collectors=("host",), counters=["task-clock", "page-faults"]) as prof:
        for _ in range(2):
            with dlprof.region("touch"):
                touch_memory()
            with dlprof.region("compute"):
                sum(range(200_000))
            prof.step()
    return out


def test_metrics_rows_per_region_and_step(tmp_path: Path) -> None:
    run = dlprof.load(profile_regions(tmp_path / "run"))
    rows = run.metrics.merge(run.slices[["id", "kind", "name"]], left_on="slice_id", right_on="id")
    assert set(rows["scope"].astype(str)) == {"thread"}
    assert set(rows["method"].astype(str)) == {"exact"}
    per = rows.assign(metric=rows["metric"].astype(str)).groupby(["kind", "name", "metric"])["value"]
    counts = per.size()
    assert counts[("region", "touch", "perf:task-clock")] == 2
    assert counts[("region", "compute", "perf:page-faults")] == 2
    steps = rows[rows["kind"] == "step"]
    assert steps["slice_id"].nunique() == 3  # two steps and the one stop() closes
    task_clock = rows[rows["metric"].astype(str) == "perf:task-clock"]
    assert (task_clock[task_clock["kind"] == "region"]["value"] > 0).all()
    faults = per.sum()
    assert faults[("region", "touch", "perf:page-faults")] > faults[("region", "compute", "perf:page-faults")]
    notes = next(c for c in run.manifest.collectors if c.name == "counters").notes
    assert "task-clock: perf_event, thread scope" in notes


def test_regions_in_other_threads_get_no_thread_scope_counts(tmp_path: Path) -> None:
    import threading

    def work() -> None:
        with dlprof.region("elsewhere"):
            sum(range(10_000))

    with dlprof.profile(out=tmp_path / "run", collectors=("host",), counters=["task-clock"]):
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
    run = dlprof.load(tmp_path / "run")
    elsewhere = run.slices[run.slices["name"] == "elsewhere"]["id"]
    assert len(elsewhere) == 1
    assert not run.metrics["slice_id"].isin(elsewhere).any()


def test_a_counter_that_cannot_be_counted_is_reported_and_the_run_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with dlprof.profile(out=tmp_path / "run", collectors=("host",), counters=["bogus", "task-clock"]) as prof:
        with dlprof.region("work"):
            sum(range(10_000))
        prof.step()
    assert "dlprof: counter bogus: not counted: unknown counter" in capsys.readouterr().err
    run = dlprof.load(tmp_path / "run")
    assert set(run.metrics["metric"].astype(str)) == {"perf:task-clock"}
    notes = next(c for c in run.manifest.collectors if c.name == "counters").notes
    assert any(note.startswith("bogus: not counted") for note in notes)


def test_run_cli_writes_metrics_and_top_shows_the_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "script.py"
    script.write_text(
        "import dlprof\n"
        "with dlprof.region('touch'):\n"
        "    memory = bytearray(64 << 20)\n"
        "    memory[::4096] = b'\\1' * (len(memory) // 4096)\n"
    )
    done = subprocess.run([*DLPROF, "run", "-o", str(tmp_path / "run"), "--top", "0", "--counters",
                           "page-faults", "--collectors", "host", str(script)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    run = dlprof.load(tmp_path / "run")
    assert set(run.metrics["metric"].astype(str)) == {"perf:page-faults"}
    assert main(["top", str(tmp_path / "run"), "--kind", "region", "--format", "json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["name"] == "touch" and row["perf:page-faults"] > 1000
    assert main(["top", str(tmp_path / "run"), "--kind", "region"]) == 0
    assert "perf:page-faults" in capsys.readouterr().out


def test_run_cli_rejects_a_name_that_is_no_counter(tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text("pass\n")
    done = subprocess.run([*DLPROF, "run", "-o", str(tmp_path / "run"), "--counters", "bogus",
                           str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False)
    assert done.returncode == 2
    assert "--counters: unknown counter bogus" in done.stderr
    assert not (tmp_path / "run").exists()
