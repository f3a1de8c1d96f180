"""dlprof's pauses of the program: each a ``profiler`` slice on the thread it held, nested inside
what was open there, with every enclosing slice's ``pause_ns`` made whole across saves; and, on a
real training run whose saves a small memory cap forces, no layer holds time that is neither its
ops' nor a pause's, and the backward keeps its slices."""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

import dlprof
from dlprof.config import ProfileConfig
from dlprof.keys import Kind, StoreTable
from dlprof.recording.pauses import PauseCause
from dlprof.recording.session import Session
from dlprof.store.layout import rank_dir, rank_files
from tests.recording.well_nested import assert_self_time_is_what_children_leave, assert_well_nested


def _spin(ns: int) -> None:
    end = time.perf_counter_ns() + ns
    while time.perf_counter_ns() < end:
        pass


def _pauses(slices: pd.DataFrame) -> pd.DataFrame:
    return slices[slices.kind == Kind.PROFILER]


@pytest.mark.torch
def test_a_save_inside_a_layer_is_a_pause_inside_it_and_in_every_slice_around_it(tmp_path: Path) -> None:
    """A save inside a forward, inside a torch range the forward opened: the pause is a slice
    under the layer, between the range's two pieces, and the layer, its parents and the step
    carry it in ``pause_ns``."""
    torch = pytest.importorskip("torch", reason="needs PyTorch (pip install 'dlprof[torch]')")
    from torch import nn

    class Saving(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with torch.profiler.record_function("saving.range"):
                x = x * 2
                session._save(within_step=True)  # what a save for memory does inside a layer
                return x * 2

    model = nn.Sequential(nn.Linear(64, 64), Saving(), nn.Linear(64, 64))
    with Session(ProfileConfig(out=tmp_path / "run", collectors=("torch", "layers"))) as session:
        for _ in range(2):
            model(torch.ones(8, 64))
            session.step()
    run = dlprof.load(tmp_path / "run")
    assert_well_nested(run)
    assert_self_time_is_what_children_leave(run)
    slices = run.slices.set_index("id", drop=False)
    pauses = _pauses(slices)
    assert len(pauses) == 2 and set(pauses.name) == {PauseCause.SAVE_INSIDE_STEP}
    for pause in pauses.itertuples():
        layer = slices.loc[pause.parent_id]
        assert layer["name"] == "1 (Saving) forward"
        assert layer.pause_ns == pause.dur_ns
        # Every slice around it holds it: the layers, the step.
        above = layer
        while not pd.isna(above.parent_id):
            above = slices.loc[int(above.parent_id)]
            assert above.pause_ns >= pause.dur_ns, above["name"]
        assert above.kind == Kind.STEP
        # The range split at the save ends before the pause and enters again after it.
        pieces = slices[slices.name == "saving.range"]
        ends = pieces.start_ns + pieces.dur_ns
        pause_end = pause.start_ns + pause.dur_ns
        assert not ((pieces.start_ns < pause.start_ns) & (ends > pause.start_ns)).any()
        assert not ((pieces.start_ns < pause_end) & (ends > pause_end)).any()
    assert (slices.name == "saving.range").sum() == 4, "each forward's range in two pieces"
    summary = run.manifest.saving["pauses"]
    assert summary["count"] == 2 + len(pauses[pauses.name == PauseCause.SAVE])
    # Step 0 holds start-up (a warm-up step): its pause is inside a layer, not a training step.
    assert summary["inside_steps"] == 1 and summary["inside_layers"] == 2
    assert summary["longest_ms"] == pytest.approx(pauses.dur_ns.max() / 1e6, abs=0.1)


def test_a_region_open_across_saves_carries_the_pauses_of_each(tmp_path: Path) -> None:
    """An epoch region open over several step boundaries' saves: each save's pause lies between
    two steps inside it, and the region's pause_ns sums them though its row came with the last
    save (the others saw it open)."""
    config = ProfileConfig(out=tmp_path / "run", collectors=(), flush_steps=1)
    with Session(config) as session, dlprof.region("epoch"):
        for _ in range(5):
            with dlprof.region("work"):
                _spin(2_000_000)
            session.step()
    run = dlprof.load(tmp_path / "run")
    assert_well_nested(run)
    slices = run.slices
    [epoch] = slices[slices.name == "epoch"].itertuples()
    pauses = _pauses(slices)
    inside = pauses[(pauses.start_ns >= epoch.start_ns) & (pauses.start_ns < epoch.start_ns + epoch.dur_ns)]
    assert len(inside) >= 4, "a pause at each boundary's save but the last (the run's end)"
    assert (inside.parent_id == epoch.id).all(), "between two steps: directly in the region"
    assert epoch.pause_ns == inside.dur_ns.sum()
    assert epoch.self_ns == epoch.dur_ns - slices[slices.parent_id == epoch.id].dur_ns.sum()
    steps = slices[slices.kind == Kind.STEP]
    assert steps.pause_ns.isna().all(), "boundary saves fall between steps"


# A small GPT-like model trained with gradient accumulation; --memory-cap 16 holds about 7,000
# events, fewer than a step's 16 micro-batches make: saves are forced inside steps and layers.
# The program's own garbage collections (up to hundreds of milliseconds here, wherever they fall)
# are holes in a layer too; they are not what this run is about.
STEPS, MICRO_BATCHES = 6, 16
TRAINING = textwrap.dedent(f"""
    import gc
    import torch
    gc.disable()
    from torch import nn
    torch.manual_seed(0)
    torch.set_num_threads(1)

    class Block(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.norm = nn.LayerNorm(width)
            self.attention = nn.MultiheadAttention(width, 2, batch_first=True)
            self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

        def forward(self, x):
            y = self.norm(x)
            x = x + self.attention(y, y, y, need_weights=False)[0]
            return x + self.mlp(x)

    model = nn.Sequential(nn.Embedding(65, 32), Block(32), Block(32), nn.Linear(32, 65))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range({STEPS}):
        for micro in range({MICRO_BATCHES}):
            tokens = torch.randint(65, (4, 32))
            loss = nn.functional.cross_entropy(model(tokens).view(-1, 65), tokens.view(-1)) / {MICRO_BATCHES}
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
""")


@pytest.fixture(scope="module")
def forced_saves_run(tmp_path_factory: pytest.TempPathFactory) -> dlprof.Run:
    pytest.importorskip("torch", reason="needs PyTorch (pip install 'dlprof[torch]')")
    work = tmp_path_factory.mktemp("forced")
    script = work / "train.py"
    script.write_text(TRAINING)
    done = subprocess.run([sys.executable, "-m", "dlprof", "run", "-o", str(work / "run"), "-n", "0",
                           "--memory-cap", "16", str(script)], capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return dlprof.load(work / "run")


def _cuts(run: dlprof.Run) -> list[tuple[int, int]]:
    """Where dlprof cut its recording, from the saves' own parts (not from the pause slices): from
    the last op of one save's profiler cycle to the first op of the next."""
    bounds = []
    for part in rank_files(rank_dir(run.path, StoreTable.SLICES, 0)).parts:
        ops = pq.read_table(part, columns=["kind", "start_ns", "dur_ns"]).to_pandas()
        ops = ops[ops.kind == Kind.OP]
        if len(ops):
            bounds.append((int(ops.start_ns.min()), int((ops.start_ns + ops.dur_ns).max())))
    bounds.sort()
    return [(end, next_start) for (_, end), (next_start, _) in itertools.pairwise(bounds)]


def _layer_holes(slices: pd.DataFrame) -> pd.DataFrame:
    """Each stretch inside a layer slice covered by neither an op nor a pause of its thread."""
    cpu = slices[slices.device == "cpu"]
    covering = cpu[cpu.kind.isin([Kind.OP, Kind.PROFILER])]
    rows = []
    for (pid, tid), layers in cpu[cpu.kind == Kind.MODULE].groupby(["pid", "tid"]):
        cover = covering[(covering.pid == pid) & (covering.tid == tid)].sort_values("start_ns")
        starts, ends = cover.start_ns.to_numpy(), (cover.start_ns + cover.dur_ns).to_numpy()
        for layer in layers.itertuples():
            end = layer.start_ns + layer.dur_ns
            inside = (ends > layer.start_ns) & (starts < end)
            reached = layer.start_ns
            for begin, finish in [*zip(starts[inside], ends[inside], strict=True), (end, end)]:
                if begin > reached:
                    rows.append((layer.name, reached, begin))
                reached = max(reached, finish)
    return pd.DataFrame(rows, columns=["name", "start_ns", "end_ns"])


@pytest.mark.slow
@pytest.mark.torch
def test_no_layer_holds_a_pause_that_is_not_a_pause_slice(forced_saves_run: dlprof.Run) -> None:
    """Saves forced by a small cap fall inside steps and layers: each is a pause slice there, so
    no layer holds a stretch over 50 ms where dlprof cut its recording in which neither its ops
    nor a pause ran (before, every such save was a hole of its own in the layer, billed to it)."""
    run = forced_saves_run
    summary = run.manifest.saving["pauses"]
    assert summary["for_memory"] >= 1 and summary["inside_layers"] >= 1, summary
    slices = run.slices
    holes = _layer_holes(slices)
    cuts = _cuts(run)
    assert len(cuts) >= 3
    # A busy machine leaves a thread waiting tens of milliseconds anywhere; where dlprof cut its
    # recording, a hole is dlprof's.
    at_cuts = holes[[any(start < cut_end and cut_start < end for cut_start, cut_end in cuts)
                     for start, end in zip(holes.start_ns, holes.end_ns, strict=True)]]
    long = at_cuts[at_cuts.end_ns - at_cuts.start_ns > 50_000_000]
    assert long.empty, long.head().to_string()
    # The pauses are dlprof's: the layers' time as top shows it leaves them out.
    layers = slices[slices.kind == Kind.MODULE]
    assert layers.pause_ns.fillna(0).sum() > 0
    assert (layers.pause_ns.fillna(0) <= layers.dur_ns).all()


@pytest.mark.slow
@pytest.mark.torch
def test_the_backward_keeps_its_slices_between_forced_saves(forced_saves_run: dlprof.Run) -> None:
    """No save is made inside a backward, so no pause swallows a backward layer or op: each step
    has its backward layers, and they hold as much of the user's time as the ops inside them say
    (what ``dlprof steps`` gives backward, once pauses are left out of the parts)."""
    slices = forced_saves_run.slices
    pauses = _pauses(slices)
    backward = slices[(slices.kind == Kind.MODULE) & slices.name.str.endswith(" backward")]
    forward = slices[(slices.kind == Kind.MODULE) & slices.name.str.endswith(" forward")]
    for pause in pauses.itertuples():
        inside = backward[(backward.start_ns < pause.start_ns) & (pause.start_ns < backward.start_ns + backward.dur_ns)]
        assert inside.empty, f"a pause inside {inside.name.tolist()}"
    outermost_forward = forward[forward.name == "Sequential (Sequential) forward"]
    outermost_backward = backward[backward.name == "Sequential (Sequential) backward"]
    assert len(outermost_forward) == len(outermost_backward) == STEPS * MICRO_BATCHES, "a backward each"
    user = {name: float((part.dur_ns - part.pause_ns.fillna(0)).sum())
            for name, part in (("forward", outermost_forward), ("backward", outermost_backward))}
    # A transformer's backward costs about twice its forward; with dlprof's pauses billed to the
    # forward (as before), the forward came out several times the backward.
    assert user["backward"] >= 0.6 * user["forward"], user
