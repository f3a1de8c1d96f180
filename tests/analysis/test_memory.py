"""The memory analyses on a real PyTorch run, checked against the memory table replayed here row
by row in Python: the peak, the blocks live at it, and the layer a predictable activation
belongs to. Also a TensorFlow profile's allocator rows."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import dlprof
from dlprof.analysis.memory import (
    NO_LAYER,
    NO_OP,
    CategoryBasis,
    MemoryGroup,
    layer_peaks,
    live_at_peak,
    memory_peaks,
)
from dlprof.store.reader import Run

BATCH, WIDE = 64, 8192
# The wide layer's output, float32: made inside its forward, kept for the next layer's backward.
WIDE_OUTPUT_BYTES = BATCH * WIDE * 4


@pytest.fixture(scope="module")
def wide_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Three training steps of a model whose wide layer's output dominates memory, recorded with
    torch.profiler's memory profiling (on by default) and layer slices."""
    torch = pytest.importorskip("torch", reason="needs PyTorch (pip install 'dlprof[torch]')")

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wide = torch.nn.Linear(32, WIDE)
            self.head = torch.nn.Linear(WIDE, 4)

        def forward(self, x: object) -> object:
            # No activation between them: head keeps wide's output for its weight's gradient.
            return self.head(self.wide(x))

    torch.manual_seed(0)
    model = Model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs, labels = torch.randn(BATCH, 32), torch.randint(0, 4, (BATCH,))
    out = tmp_path_factory.mktemp("runs") / "wide"
    with dlprof.profile(out=out, collectors=("torch", "layers"), profile_memory=True) as prof:
        for _ in range(3):
            loss = torch.nn.functional.cross_entropy(model(inputs), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            prof.step()
    return dlprof.load(out)


def replay(rows: pd.DataFrame, peak_ns: int, peak_bytes: int) -> tuple[dict[int, int], int, int]:
    """Walk one device's rows in time order up to the peak row, matching frees to allocations by
    address: the blocks live then (address -> bytes), the bytes of frees that matched no recorded
    allocation, and the total allocated before the first row."""
    ordered = rows.sort_values(["ts_ns", "bytes"], kind="stable")
    first = ordered.iloc[0]
    before_first = int(first["total_allocated"]) - int(first["bytes"])
    live: dict[int, int] = {}
    unmatched = 0
    for ts, size, addr in zip(ordered["ts_ns"], ordered["bytes"], ordered["addr"], strict=True):
        if ts > peak_ns:
            break
        if size > 0:
            live[int(addr)] = int(size)
        elif int(addr) in live:
            del live[int(addr)]
        else:
            unmatched += int(size)
    assert peak_bytes == int(rows["total_allocated"].max())
    return live, unmatched, before_first


@pytest.mark.torch
def test_peak_is_the_highest_total_and_live_blocks_add_up_to_it(wide_run: Run) -> None:
    """The peak is the memory table's highest ``total_allocated``. The recorded blocks live at it
    add up to the peak less what was allocated before profiling began and is still live then:
    the allocator's total before the first recorded row, less the frees of such blocks recorded
    before the peak (their allocations were never seen, so no address matches them)."""
    peaks = memory_peaks(wide_run)
    memory = wide_run.memory
    assert list(peaks["device"]) == sorted(memory["device"].astype(str).unique())
    for peak in peaks.itertuples():
        rows = memory[memory["device"].astype(str) == peak.device]
        assert peak.peak_bytes == rows["total_allocated"].max()
        assert peak.peak_ns == rows.loc[rows["total_allocated"] == peak.peak_bytes, "ts_ns"].min()
        live, unmatched_bytes, before_first = replay(rows, peak.peak_ns, peak.peak_bytes)
        assert peak.live_bytes == sum(live.values()) and peak.live_blocks == len(live)
        assert peak.live_bytes + peak.untraced_bytes == peak.peak_bytes
        assert peak.untraced_bytes == before_first + unmatched_bytes
        assert peak.allocations == (rows["bytes"] > 0).sum() and peak.frees == (rows["bytes"] < 0).sum()
        assert peak.step is not None and peak.step.startswith("ProfilerStep#")
        assert peak.op is not None and peak.op.startswith("aten::")
        assert pd.isna(peak.reserved_peak_bytes)  # the CPU allocator reports nothing reserved


@pytest.mark.torch
@pytest.mark.parametrize("by", list(MemoryGroup))
def test_every_grouping_accounts_for_every_live_byte(wide_run: Run, by: MemoryGroup) -> None:
    peaks = memory_peaks(wide_run).set_index("device")
    live = live_at_peak(wide_run, by)
    for device, groups in live.groupby("device"):
        assert groups["bytes"].sum() == peaks.loc[device, "live_bytes"]
        assert groups["blocks"].sum() == peaks.loc[device, "live_blocks"]
        assert list(groups["bytes"]) == sorted(groups["bytes"], reverse=True)
        assert groups["peak_pct"].sum() == pytest.approx(100.0 * groups["bytes"].sum() / peaks.loc[device, "peak_bytes"])
    assert by.value in live.columns
    limited = live_at_peak(wide_run, by, limit=2)
    assert len(limited) <= 2 * live["device"].nunique()
    assert limited.reset_index(drop=True).equals(live.groupby("device").head(2).reset_index(drop=True))


@pytest.mark.torch
def test_the_wide_layers_output_is_live_at_the_peak_in_its_layer(wide_run: Run) -> None:
    by_op = live_at_peak(wide_run, MemoryGroup.OP)
    assert NO_OP not in set(by_op["op"])  # every allocation of a torch run is tied to its op
    by_layer = live_at_peak(wide_run, MemoryGroup.LAYER).set_index("layer")
    # The peak comes in the backward, with wide's output still held for head's weight gradient.
    assert by_layer.loc["wide (Linear) forward", "bytes"] >= WIDE_OUTPUT_BYTES
    assert by_layer["bytes"].idxmax() != NO_LAYER
    categories = live_at_peak(wide_run, MemoryGroup.CATEGORY)
    activations = categories[categories["category"] == "activation"]
    assert set(activations["basis"]) == {CategoryBasis.INFERRED.value}
    assert activations["bytes"].sum() >= WIDE_OUTPUT_BYTES


@pytest.mark.torch
def test_a_layer_adds_at_least_its_output(wide_run: Run) -> None:
    layers = layer_peaks(wide_run).set_index("layer")
    wide = layers.loc["wide (Linear) forward"]
    assert wide["calls"] == 3
    assert WIDE_OUTPUT_BYTES <= wide["added_bytes"] <= wide["high_bytes"]
    assert wide["mean_added_bytes"] <= wide["added_bytes"]
    # A layer's calls nest inside the model's, so the model's forward adds at least as much.
    assert layers.loc["Model (Model) forward", "added_bytes"] >= wide["added_bytes"]
    peak = memory_peaks(wide_run)["peak_bytes"].max()
    assert (layers["high_bytes"] <= peak).all()


@pytest.mark.torch
def test_device_and_rank_filters(wide_run: Run) -> None:
    assert memory_peaks(wide_run, device="cuda:7").empty
    assert live_at_peak(wide_run, rank=3).empty
    assert memory_peaks(wide_run, rank=0, device="cpu").equals(memory_peaks(wide_run))


@pytest.fixture(scope="module")
def tensorflow_allocations(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The TensorFlow example profiled by TensorFlow's own profiler with its CPU allocator made a
    BFC allocator (which records allocation events; the default CPU allocator records none),
    imported. A process of its own: TensorFlow reads the setting once, when it loads."""
    pytest.importorskip("tensorflow", reason="needs TensorFlow (pip install 'dlprof[tf]')")
    from dlprof.importers.trace_file import import_traces

    logdir = tmp_path_factory.mktemp("tf-allocations")
    program = ("import sys; from pathlib import Path; from tests.tensorflow_runs import profile_with_tensorflow; "
               "print(profile_with_tensorflow(Path(sys.argv[1]), jit_compile=False))")
    done = subprocess.run([sys.executable, "-c", program, str(logdir / "log")], capture_output=True, text=True,
                          timeout=300, check=False, cwd=Path(__file__).resolve().parents[2],
                          env={**os.environ, "TF_CPU_ALLOCATOR_USE_BFC": "true"})
    assert done.returncode == 0, done.stderr[-3000:]
    import_traces([Path(done.stdout.strip().splitlines()[-1])], logdir / "run")
    return dlprof.load(logdir / "run")


@pytest.mark.tf
@pytest.mark.slow
def test_tensorflow_allocator_rows(tensorflow_allocations: Run) -> None:
    """TensorFlow's allocator totals include what it held before profiling: the peak is theirs,
    and what no recorded allocation explains is untraced."""
    run = tensorflow_allocations
    memory = run.memory
    assert len(memory) > 100
    peaks = memory_peaks(run)
    assert list(peaks["device"]) == ["cpu"]
    for peak in peaks.itertuples():
        rows = memory[memory["device"].astype(str) == peak.device]
        live, unmatched_bytes, before_first = replay(rows, peak.peak_ns, peak.peak_bytes)
        assert peak.live_bytes == sum(live.values()) > 0
        assert peak.untraced_bytes == before_first + unmatched_bytes > 0
    layers = live_at_peak(run, MemoryGroup.LAYER)
    assert layers["bytes"].sum() == peaks["live_bytes"].sum()
    assert any(name.endswith((" forward", " backward")) for name in layers["layer"])
    added = layer_peaks(run)
    assert len(added) and (added["added_bytes"] > 0).any()
