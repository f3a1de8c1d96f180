"""Every analysis shows the user's time: dlprof's own pauses (``profiler`` slices) are left out of
the total and self times of the layers, regions and steps they fell in (``analysis/sql.user_time``
over the store's ``pause_ns``), and are listed as what they are. A real run whose save falls
inside a layer, a region and a step."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import pytest

import dlprof
from dlprof.analysis.aggregate import top
from dlprof.analysis.diff import diff
from dlprof.analysis.tau_profile import tau_profiles
from dlprof.config import ProfileConfig
from dlprof.keys import DiffBasis, Kind, SortKey
from dlprof.recording.session import Session

SAVING = "1 (Saving) forward"


def _spin(ns: int) -> None:
    end = time.perf_counter_ns() + ns
    while time.perf_counter_ns() < end:
        pass


@pytest.fixture(scope="module")
def paused_run(tmp_path_factory: pytest.TempPathFactory) -> dlprof.Run:
    """Two steps, each with a save inside a layer inside a region; the layer itself spins 5 ms."""
    torch = pytest.importorskip("torch", reason="needs PyTorch (pip install 'dlprof[torch]')")
    from torch import nn

    class Saving(nn.Module):
        def forward(self, x: object) -> object:
            _spin(5_000_000)
            session._save(within_step=True)  # what a save for memory does inside a layer
            return x

    model = nn.Sequential(nn.Linear(16, 16), Saving(), nn.Linear(16, 16))
    out = tmp_path_factory.mktemp("paused") / "run"
    with Session(ProfileConfig(out=out, collectors=("torch", "layers"))) as session:
        for _ in range(2):
            with dlprof.region("train"):
                model(torch.ones(4, 16))
            session.step()
    return dlprof.load(out)


def _by_name(table: pd.DataFrame) -> pd.DataFrame:
    return table.set_index("name")


def _pause_inside(slices: pd.DataFrame, name: str) -> int:
    """The pause time inside the slices of that name, from the pause slices themselves."""
    pauses = slices[slices.kind == Kind.PROFILER]
    total = 0
    for outer in slices[slices.name == name].itertuples():
        end = outer.start_ns + outer.dur_ns
        total += int(pauses[(pauses.start_ns >= outer.start_ns) & (pauses.start_ns < end)].dur_ns.sum())
    return total


def test_top_leaves_the_pauses_out_of_layers_regions_and_steps(paused_run: dlprof.Run) -> None:
    slices = paused_run.slices
    assert _pause_inside(slices, SAVING) > 0
    for kind, name in ((Kind.MODULE, SAVING), (Kind.MODULE, "Sequential (Sequential) forward"),
                       (Kind.REGION, "train"), (Kind.STEP, "ProfilerStep#0")):
        table = _by_name(top(paused_run, kind=kind, limit=None))
        recorded = slices[slices.name == name]
        assert table.loc[name, "total_ns"] == recorded.dur_ns.sum() - _pause_inside(slices, name), name
        assert table.loc[name, "max_ns"] < recorded.dur_ns.max(), name
    layers = _by_name(top(paused_run, kind=Kind.MODULE, by=SortKey.SELF, limit=None))
    saving = slices[slices.name == SAVING]
    # Its self time is its own 5 ms spins and hooks, not the pauses (each far longer here).
    assert layers.loc[SAVING, "self_ns"] == layers.loc[SAVING, "total_ns"]
    assert layers.loc[SAVING, "self_ns"] < saving.dur_ns.sum() - _pause_inside(slices, SAVING) + 1
    assert SAVING in set(top(paused_run, kind=Kind.MODULE, limit=None, leaves=True).name), \
        "a pause inside a layer is no layer inside it"


def test_top_lists_the_pauses_as_their_own_kind(paused_run: dlprof.Run) -> None:
    pauses = _by_name(top(paused_run, kind=Kind.PROFILER, limit=None))
    assert pauses.loc["dlprof::save inside a step", "calls"] == 2
    assert pauses.loc["dlprof::save inside a step", "total_ns"] == _pause_inside(paused_run.slices, SAVING)


def test_pprof_inclusive_times_leave_the_pauses_out(paused_run: dlprof.Run) -> None:
    slices = paused_run.slices
    [thread] = [p for p in tau_profiles(paused_run) if p.device == "cpu" and SAVING in set(p.functions.name)]
    functions = _by_name(thread.functions)
    for name in (SAVING, "train", "ProfilerStep#0"):
        assert functions.loc[name, "inclusive_ns"] == \
            slices[slices.name == name].dur_ns.sum() - _pause_inside(slices, name), name


def test_diff_compares_the_users_time(paused_run: dlprof.Run) -> None:
    table = diff(paused_run, paused_run, kinds=(Kind.MODULE,), per=DiffBasis.RUN)
    row = table[table.name == SAVING].iloc[0]
    slices = paused_run.slices
    assert row.time_a_ns == slices[slices.name == SAVING].dur_ns.sum() - _pause_inside(slices, SAVING)


def test_the_tau_export_times_the_users_time(paused_run: dlprof.Run, tmp_path: Path) -> None:
    from dlprof.exporters.tau_tree import SliceTree

    slices = paused_run.slices
    keys = sorted({(int(r), int(p), int(t), str(d)) for r, p, t, d in
                   slices[["rank", "pid", "tid", "device"]].itertuples(index=False)})
    tree = SliceTree(paused_run, keys)
    saving = (slices.name == SAVING).to_numpy()
    assert tree.dur_ns[saving].sum() == slices[slices.name == SAVING].dur_ns.sum() - _pause_inside(slices, SAVING)
