"""Saves made final one at a time: what a run of many saves holds equals what nesting the whole
run at once gives, regions spanning saves included."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pytest

import dlprof
from dlprof.config import ProfileConfig
from dlprof.keys import StoreTable
from dlprof.recording.session import Session
from dlprof.store.layout import rank_dir, rank_files
from dlprof.store.nesting import nest_slices
from tests.recording.well_nested import assert_self_time_is_what_children_leave, assert_well_nested


def _spin(ns: int) -> None:
    end = time.perf_counter_ns() + ns
    while time.perf_counter_ns() < end:
        pass


def _profile_with_saves(out: Path, steps: int, save_every: int) -> Path:
    config = ProfileConfig(out=out, collectors=(), flush_steps=save_every)
    with Session(config) as session, dlprof.region("whole loop"):
        for step in range(steps):
            with dlprof.region("epoch" if step % 4 == 0 else "batch"):
                for _ in range(3):
                    with dlprof.region("work"):
                        _spin(1_000_000)
            session.step()
    return out


def test_many_saves_nest_as_the_whole_run_would(tmp_path: Path) -> None:
    run_dir = _profile_with_saves(tmp_path / "run", steps=12, save_every=3)
    parts = rank_files(rank_dir(run_dir, StoreTable.SLICES, 0)).parts
    assert len(parts) >= 4, "a part per save"
    slices = dlprof.load(run_dir).arrow(StoreTable.SLICES).drop_columns(["rank"])
    # Nesting every row at once, as a single compaction of the whole run would.
    bare = slices.drop_columns(["depth", "parent_id", "self_ns"])
    for name, kind in (("depth", pa.int16()), ("parent_id", pa.int64()), ("self_ns", pa.int64())):
        bare = bare.append_column(name, pa.nulls(bare.num_rows, kind))
    whole, _ = nest_slices(bare)
    mine = {row["id"]: row for row in slices.to_pylist()}
    for row in whole.to_pylist():
        got = mine[row["id"]]
        assert (got["depth"], got["parent_id"], got["self_ns"]) == (row["depth"], row["parent_id"], row["self_ns"]), got["name"]


def test_a_region_spanning_every_save_holds_what_ran_inside_it(tmp_path: Path) -> None:
    run = dlprof.load(_profile_with_saves(tmp_path / "run", steps=8, save_every=2))
    slices = run.slices
    [loop] = slices[slices.name == "whole loop"].itertuples()
    children = slices[slices.parent_id == loop.id]
    # Each step begins where the one before ended; the first began with the session, before the
    # region (nesting decides which of the two holds the other).
    assert set(children.name) >= {f"ProfilerStep#{n}" for n in range(1, 8)}
    regions = slices[slices.name.isin(["epoch", "batch"])]
    assert len(regions) == 8 and set(regions.parent_id) <= set(children.id)
    assert loop.self_ns == loop.dur_ns - children.dur_ns.sum()
    assert children.dur_ns.sum() >= 8 * 3 * 1_000_000, "the regions' work, in every save, is its children's"


@pytest.mark.torch
def test_a_layer_open_at_a_save_keeps_its_children(tmp_path: Path) -> None:
    """A save inside a forward (a long step saved by time) hands the layer over open."""
    torch = pytest.importorskip("torch", reason="needs PyTorch (pip install 'dlprof[torch]')")
    from torch import nn

    class Saving(nn.Module):
        def forward(self, x: object) -> object:
            session._save(within_step=True)  # what a save by time does inside a step
            return x

    model = nn.Sequential(nn.Linear(4, 4), Saving(), nn.Linear(4, 4))
    config = ProfileConfig(out=tmp_path / "run", collectors=("torch", "layers"))
    with Session(config) as session:
        model(torch.ones(2, 4))
        session.step()
    slices = dlprof.load(tmp_path / "run").slices
    [outer] = slices[slices.name == "Sequential (Sequential) forward"].itertuples()
    children = slices[slices.parent_id == outer.id]
    assert {"0 (Linear) forward", "1 (Saving) forward", "2 (Linear) forward"} <= set(children.name)
    [step] = slices[slices.name == "ProfilerStep#0"].itertuples()
    assert outer.parent_id == step.id
    assert outer.self_ns == outer.dur_ns - children.dur_ns.sum()


@pytest.mark.torch
def test_layers_inside_a_torch_range_split_by_a_save_keep_their_self_times(tmp_path: Path) -> None:
    """A save inside a layer that runs inside a torch range (DistributedDataParallel's forward
    wraps the model in one): the range is split at the save, the open layers begun inside it
    stretch back over its first piece, and each layer's self time is still its time less its
    children's."""
    torch = pytest.importorskip("torch", reason="needs PyTorch (pip install 'dlprof[torch]')")
    from torch import nn

    class Saving(nn.Module):
        def forward(self, x: object) -> object:
            session._save(within_step=True)  # what a save by time does inside a step
            return x

    class Wrapper(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: object) -> object:
            with torch.profiler.record_function("Wrapper.forward"):
                return self.inner(x)

    model = Wrapper(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), Saving(), nn.Linear(64, 64)))
    config = ProfileConfig(out=tmp_path / "run", collectors=("torch", "layers"))
    with Session(config) as session:
        for _ in range(2):
            model(torch.ones(8, 64))
            session.step()
    run = dlprof.load(tmp_path / "run")
    assert run.manifest.saving["saves"] >= 3
    assert_well_nested(run)
    assert_self_time_is_what_children_leave(run)


@pytest.mark.parametrize("fixture", ["cnn_run", "two_rank_gloo_run"])
def test_real_runs_are_well_nested(fixture: str, request: pytest.FixtureRequest) -> None:
    run = dlprof.load(request.getfixturevalue(fixture))
    assert_well_nested(run)
    assert_self_time_is_what_children_leave(run)


def _ticks(ns: int) -> None:
    """Record small regions for ``ns``: events piling up inside a step, as a model's ops do (each
    20 µs long, so that they are never throttled as too many too brief)."""
    end = time.perf_counter_ns() + ns
    while time.perf_counter_ns() < end:
        with dlprof.region("tick"):
            _spin(20_000)


def test_saves_inside_steps_keep_the_run_well_nested(tmp_path: Path) -> None:
    """Saves that memory forces inside steps and regions that overlap step boundaries (a region
    around the loop body, ended a moment after the optimizer's step) still give one consistent
    tree."""
    config = ProfileConfig(out=tmp_path / "run", collectors=(), memory_cap_bytes=64 << 10)
    with Session(config) as session:
        for step in range(12):
            with dlprof.region("body"):
                with dlprof.region("work"):
                    if step in (2, 7):
                        _ticks(500_000_000)
                    else:
                        _spin(3_000_000)
                session.step()  # as an optimizer's step() does, inside the loop body
    run = dlprof.load(tmp_path / "run")
    assert run.manifest.saving["saves_within_steps"] >= 2
    assert_well_nested(run)
    bodies = run.slices[run.slices.name == "body"]
    assert len(bodies) == 12 and bodies.parent_id.notna().all(), "each body in its step"


def test_a_region_begun_late_in_a_step_and_saved_inside_both_ends_with_the_step(tmp_path: Path) -> None:
    """A region around the loop body begins late in the first step (the step holds start-up) and
    outlives it (the optimizer's step ends it from inside the body); a save inside both leaves
    the body's children under the body, so the body cannot be stretched back over the step: it
    ends with the step, and the run stays one tree."""
    config = ProfileConfig(out=tmp_path / "run", collectors=(), flush_steps=1)
    with Session(config) as session:
        _spin(30_000_000)  # start-up, inside step 0
        for step in range(3):
            with dlprof.region("body"):
                with dlprof.region("zero_grad"):
                    _spin(1_000_000)
                if step == 0:
                    session._save(within_step=True)  # a save by time: the step and the body open
                with dlprof.region("forward"):
                    _spin(2_000_000)
                session.step()  # the optimizer's step ends the step, inside the body, and saves
                with dlprof.region("after the step"):  # longer than the body's part in the step
                    _spin(40_000_000 if step == 0 else 1_000_000)
    run = dlprof.load(tmp_path / "run")
    assert_well_nested(run)
    assert_self_time_is_what_children_leave(run)
    slices = run.slices
    [first] = slices[slices.name == "ProfilerStep#0"].itertuples()
    bodies = slices[slices.name == "body"].sort_values("start_ns")
    assert bodies.iloc[0].start_ns > first.start_ns + 30_000_000, "the body is not stretched over start-up"
    assert bodies.iloc[0].start_ns + bodies.iloc[0].dur_ns == first.start_ns + first.dur_ns
    assert bodies.iloc[0].parent_id == first.id
    assert run.manifest.normalised["clipped_to_parent"] >= 1


def test_an_epoch_region_begun_in_a_first_step_saved_inside_both_stays_one_tree(tmp_path: Path) -> None:
    """A region around an epoch begins late in the first step and spans the steps after it; a
    save inside the first step found both open and nested the epoch's first children under the
    epoch. The epoch is later stretched back over the step: those children then lie inside the
    step, not directly under the epoch, and the self times add up."""
    config = ProfileConfig(out=tmp_path / "run", collectors=(), flush_steps=1)
    with Session(config) as session:
        _spin(30_000_000)  # start-up, inside step 0
        for epoch in range(2):
            with dlprof.region("epoch"):
                for step in range(3):
                    with dlprof.region("zero_grad"):
                        _spin(1_000_000)
                    if epoch == 0 and step == 0:
                        session._save(within_step=True)  # a save by time inside the first step
                    with dlprof.region("forward"):
                        _spin(2_000_000)
                    session.step()
    run = dlprof.load(tmp_path / "run")
    assert_well_nested(run)
    assert_self_time_is_what_children_leave(run)
    slices = run.slices
    [first_step] = slices[slices.name == "ProfilerStep#0"].itertuples()
    first_epoch = slices[slices.name == "epoch"].sort_values("start_ns").iloc[0]
    [early] = slices[slices.name == "zero_grad"].sort_values("start_ns").head(1).itertuples()
    assert early.parent_id == first_step.id and first_step.parent_id == first_epoch.id
    steps_in_epoch = slices[(slices.parent_id == first_epoch.id) & (slices.kind == "step")]
    assert len(steps_in_epoch) == 3


def test_a_save_inside_a_step_while_the_boundarys_save_waits_hands_no_step_over(tmp_path: Path) -> None:
    """The step ends inside the loop body, whose save waits for the body to end (the next step
    begins once that save is made); a save by time comes in between: it hands no step over open,
    so what ran meanwhile nests under the body, not under a step that never gets a row."""
    config = ProfileConfig(out=tmp_path / "run", collectors=(), flush_steps=1)
    with Session(config) as session:
        for step in range(3):
            with dlprof.region("body"):
                with dlprof.region("work"):
                    _spin(2_000_000)
                session.step()
                if step == 1:
                    assert session.save_waiting
                    with dlprof.region("between"):
                        _spin(1_000_000)
                    session._save(within_step=True)  # what the watchdog asks for
                with dlprof.region("after the step"):
                    _spin(1_000_000)
    run = dlprof.load(tmp_path / "run")
    assert_well_nested(run)
    assert_self_time_is_what_children_leave(run)
    slices = run.slices
    [between] = slices[slices.name == "between"].itertuples()
    assert slices.set_index("id").loc[between.parent_id, "name"] == "body"
    assert sorted(slices[slices.kind == "step"].name) == [f"ProfilerStep#{n}" for n in range(4)]


def test_saves_by_time_anywhere_in_an_epoch_of_loop_bodies_keep_one_tree(tmp_path: Path) -> None:
    """An epoch region begun inside the first step, loop bodies that the optimizer's step ends
    the step inside, and saves by time at every point the watchdog may make one: start-up, the
    epoch's start, inside the work, after a body. The run is one tree whose self times add up."""
    config = ProfileConfig(out=tmp_path / "run", collectors=(), flush_steps=1)

    def save_by_time() -> None:
        if not session._save_would_split():  # as the watchdog asks: never across a loop body's end
            session._save(within_step=True)

    with Session(config) as session:
        _spin(5_000_000)  # start-up, inside step 0
        save_by_time()
        with dlprof.region("epoch"):
            save_by_time()
            for _ in range(4):
                with dlprof.region("body"):
                    with dlprof.region("work"):
                        _spin(1_000_000)
                        save_by_time()
                    session.step()
                    save_by_time()
                    with dlprof.region("tail"):
                        _spin(200_000)
                save_by_time()
    run = dlprof.load(tmp_path / "run")
    assert run.manifest.saving["saves"] >= 8
    assert_well_nested(run)
    assert_self_time_is_what_children_leave(run)
    slices = run.slices
    [epoch] = slices[slices.name == "epoch"].itertuples()
    steps = slices[slices.kind == "step"]
    assert set(steps[steps.parent_id == epoch.id].name) >= {f"ProfilerStep#{n}" for n in range(1, 4)}


def test_a_region_called_too_often_too_briefly_is_throttled(tmp_path: Path) -> None:
    """As TAU throttles a timer: past 100,000 calls at under 10 us each, later calls are counted,
    not traced, and the run says so."""
    from dlprof.keys import THROTTLE_CALLS

    with dlprof.profile(out=tmp_path / "run", collectors=()):
        for _ in range(THROTTLE_CALLS + 500):
            with dlprof.region("tiny"):
                pass
        with dlprof.region("long"):
            _spin(50_000)
    run = dlprof.load(tmp_path / "run")
    assert (run.slices.name == "tiny").sum() == THROTTLE_CALLS
    assert run.manifest.saving["throttled"] == {"tiny": {"calls": 500, "ns": run.manifest.saving["throttled"]["tiny"]["ns"]}}
    assert 0 < run.manifest.saving["throttled"]["tiny"]["ns"] < 500 * 10_000
    assert (run.slices.name == "long").sum() == 1


@pytest.mark.torch
@pytest.mark.slow
def test_a_long_run_without_steps_stays_bounded_with_its_data_saved(tmp_path: Path) -> None:
    """Small tensor ops and no optimizer: nothing ends a step, so saves come by events inside
    the one step; memory does not grow with the run's length, and every op is kept."""
    import subprocess
    import sys
    import textwrap

    import psutil

    script = tmp_path / "tiny_ops.py"
    script.write_text(textwrap.dedent("""
        import sys, torch
        torch.set_num_threads(1)
        x = torch.ones(8)
        for _ in range(int(sys.argv[1])):
            x = x.add(1).mul(0.5)
    """))

    def peak_rss(command: list[str]) -> int:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        peak = 0
        while process.poll() is None:
            try:
                peak = max(peak, psutil.Process(process.pid).memory_info().rss)
            except psutil.Error:
                break
            time.sleep(0.02)
        assert process.wait() == 0
        return peak

    def profiled(iterations: int) -> tuple[int, dlprof.Run]:
        out = tmp_path / f"run-{iterations}"
        peak = peak_rss([sys.executable, "-m", "dlprof", "run", "--top", "0", "--memory-cap", "64",
                         "-o", str(out), str(script), str(iterations)])
        return peak, dlprof.load(out)

    short_peak, short = profiled(20_000)
    long_peak, long = profiled(80_000)
    for run, iterations in ((short, 20_000), (long, 80_000)):
        assert (run.slices.name == "aten::mul").sum() == iterations, "every op kept"
        assert run.manifest.saving["saves_within_steps"] >= 2
    assert long.manifest.saving["saves"] > short.manifest.saving["saves"]
    # Four times the ops, not four times dlprof's memory (the profiler's events never pile up):
    # what each run holds beyond the plain program (torch imported, nothing profiled).
    plain = peak_rss([sys.executable, str(script), "10"])
    short_growth, long_growth = short_peak - plain, long_peak - plain
    assert long_growth < 2 * short_growth, (plain >> 20, short_peak >> 20, long_peak >> 20)


def test_profile_takes_the_save_limits_of_dlprof_run(tmp_path: Path) -> None:
    """profile(save_seconds=, memory_cap_mib=) mean what --save-seconds and --memory-cap mean."""
    with dlprof.profile(out=tmp_path / "run", collectors=(), save_seconds=0.1, memory_cap_mib=64) as prof:
        for _ in range(4):
            with dlprof.region("work"):
                _spin(150_000_000)
            prof.step()
    saving = dlprof.load(tmp_path / "run").manifest.saving
    assert saving["memory_cap_mib"] == 64
    assert saving["saves"] >= 4, "a save at each step that took longer than 0.1 s, whatever it cost"
    with pytest.raises(ValueError, match="save_seconds"):
        dlprof.profile(out=tmp_path / "bad", save_seconds=0)
    with pytest.raises(ValueError, match="memory_cap_mib"):
        dlprof.profile(out=tmp_path / "bad", memory_cap_mib=1)
