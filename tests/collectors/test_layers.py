"""The layer view on real modules, in-place ones included, with and without the torch collector."""

from __future__ import annotations

from pathlib import Path

import pytest

import dlprof

pytestmark = pytest.mark.torch

torch = pytest.importorskip("torch", reason="needs PyTorch (pip install 'dlprof[torch]')")
from torch import nn  # noqa: E402


def profile_layers(out: Path, collectors: tuple[str, ...] = ("layers",)) -> dlprof.Run:
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(inplace=True), nn.Linear(64, 4))
    x = torch.randn(16, 32)
    with dlprof.profile(out=out, collectors=collectors) as prof:
        for _ in range(3):
            model(x).sum().backward()
            prof.step()
        with torch.no_grad():
            model(x)
    return dlprof.load(out)


def test_forward_and_backward_per_layer_with_inplace_relu(tmp_path: Path) -> None:
    run = profile_layers(tmp_path / "run")
    modules = run.slices[run.slices["kind"] == "module"]
    counts = modules["name"].value_counts()
    for layer in ("0 (Linear)", "1 (ReLU)", "2 (Linear)", "Sequential (Sequential)"):
        assert counts[f"{layer} forward"] == 4, layer
        assert counts[f"{layer} backward"] == 3, layer
    assert set(run.slices["kind"]) == {"module", "step"}, "no ops without the torch collector"


def test_layer_backward_spans_nest_and_forward_bytes_are_outputs(tmp_path: Path) -> None:
    run = profile_layers(tmp_path / "run")
    modules = run.slices[run.slices["kind"] == "module"].set_index("id")
    first = modules[modules["name"] == "0 (Linear) forward"].iloc[0]
    assert first["bytes"] == 16 * 64 * 4
    backward = modules[modules["name"].str.endswith("backward")]
    assert (backward["dur_ns"] > 0).all()
    container = backward[backward["name"] == "Sequential (Sequential) backward"].iloc[0]
    inner = backward[backward["name"] == "2 (Linear) backward"].iloc[0]
    assert container["start_ns"] <= inner["start_ns"]
    assert inner["start_ns"] + inner["dur_ns"] <= container["start_ns"] + container["dur_ns"]


def test_layers_beside_torch_collector_nest_ops_inside_layers(tmp_path: Path) -> None:
    run = profile_layers(tmp_path / "run", collectors=("torch", "layers"))
    slices = run.slices.set_index("id")
    addmm = slices[slices["name"] == "aten::linear"]
    parents = slices.loc[addmm["parent_id"].dropna().astype("int64"), "name"]
    assert parents.str.endswith("(Linear) forward").mean() > 0.9


def test_layer_slices_get_counter_deltas_forward_and_backward(tmp_path: Path) -> None:
    from dlprof.support.perf_event import PerfCounters

    probe = PerfCounters(["task-clock"])
    probe.close()
    if probe.failed:
        pytest.skip(f"perf_event_open cannot count here: {probe.failed}")
    small, big = nn.Linear(64, 64), nn.Linear(64, 2048)
    model = nn.Sequential(small, nn.ReLU(), big)
    x = torch.randn(256, 64)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the counted thread does all the work: its task-clock tells the sizes apart
    try:
        with dlprof.profile(out=tmp_path / "run", collectors=("layers",), counters=["task-clock"]) as prof:
            for _ in range(3):
                model(x).sum().backward()
                prof.step()
    finally:
        torch.set_num_threads(threads)
    run = dlprof.load(tmp_path / "run")
    rows = run.metrics.merge(run.slices[["id", "kind", "name"]], left_on="slice_id", right_on="id")
    rows = rows[(rows["kind"] == "module") & (rows["metric"].astype(str) == "perf:task-clock")]
    counted = rows.groupby("name")["value"]
    for layer in ("0 (Linear)", "2 (Linear)", "Sequential (Sequential)"):
        for direction in ("forward", "backward"):
            assert counted.size()[f"{layer} {direction}"] == 3, (layer, direction)
    assert (rows["value"] > 0).all()
    total = counted.sum()
    assert total["2 (Linear) forward"] > total["0 (Linear) forward"]
    assert total["2 (Linear) backward"] > total["0 (Linear) backward"]
    assert total["Sequential (Sequential) forward"] >= total["2 (Linear) forward"]


def test_a_layer_called_too_often_too_briefly_is_throttled(tmp_path: Path) -> None:
    """Past THROTTLE_CALLS calls at under 10 us each, a layer's later calls are counted, not
    timed, as a region's are; its earlier slices stay.

    No save may fall inside the loop: a slice a save finds open is always recorded outside the
    count, so a save (by time, or by the events the default memory cap allows) adds a timed call."""
    from dlprof.keys import THROTTLE_CALLS

    layer, x = nn.Identity(), torch.ones(1)
    with torch.no_grad(), dlprof.profile(out=tmp_path / "run", collectors=("layers",),
                                         save_seconds=3600, memory_cap_mib=4096):
        for _ in range(THROTTLE_CALLS + 50):
            layer(x)
    run = dlprof.load(tmp_path / "run")
    name = "Identity (Identity) forward"
    assert (run.slices.name == name).sum() == THROTTLE_CALLS
    assert run.manifest.saving["throttled"][name]["calls"] == 50
