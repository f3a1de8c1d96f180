"""Device time of ops, layers, steps and regions, inclusive and self: on the H200 run against
the slices table walked one parent link at a time, against autograd's sequence numbers, and on
hand-built rows for the threads a slice's time comes from."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pandas as pd
import pytest

import dlprof
from dlprof.analysis.aggregate import top
from dlprof.analysis.device_time import device_times
from dlprof.keys import Kind, SortKey
from tests.builders import op, write_rows_run
from tests.references import Walk

LM_HEAD = "lm_head (Linear)"
SDPA = "aten::scaled_dot_product_attention"


def launched_under(run: dlprof.Run) -> dict[int, int]:
    """Each CPU slice's device time, the slow way: every piece of work's runtime call (by
    correlation id), then every ancestor of that call, one parent link at a time."""
    slices = run.slices
    work = slices[slices["device"] != "cpu"].groupby("correlation_id")["dur_ns"].sum()
    calls = slices[(slices["kind"] == Kind.RUNTIME) & slices["correlation_id"].isin(work.index)]
    walk = Walk(run)
    found: dict[int, int] = defaultdict(int)
    for call, correlation in zip(calls["id"], calls["correlation_id"], strict=True):
        current: int | None = int(call)
        while current is not None:
            found[current] += int(work[correlation])
            current = walk.parent(current)
    return found


@pytest.fixture(scope="module")
def h200(h200_run: Path) -> dlprof.Run:
    return dlprof.load(h200_run)


@pytest.fixture(scope="module")
def walked(h200: dlprof.Run) -> dict[int, int]:
    return launched_under(h200)


def test_lm_heads_device_time_is_the_sum_of_its_kernels(h200: dlprof.Run, walked: dict[int, int]) -> None:
    slices = h200.slices
    layers = device_times(h200, Kind.MODULE).merge(slices[["id", "name"]], on="id")
    for phase in ("forward", "backward"):
        calls = layers[layers["name"] == f"{LM_HEAD} {phase}"]
        assert len(calls) == 20
        assert calls["device_ns"].tolist() == [walked.get(int(i), 0) for i in calls["id"]]
        assert (calls["self_device_ns"] == calls["device_ns"]).all()  # no layer inside it
    table = top(h200, kind=Kind.MODULE, limit=None).set_index("name")
    forward = int(layers.loc[layers["name"] == f"{LM_HEAD} forward", "device_ns"].sum())
    # Its GEMM alone is 67 ms of the GPU's time over the run.
    assert table.loc[f"{LM_HEAD} forward", "device_ns"] == forward > 67_000_000
    # Layers nest: the model's forward holds every layer's forward work.
    model = table.loc["GPT2LMHeadModel (GPT2LMHeadModel) forward"]
    assert model["device_ns"] > forward and model["self_device_ns"] < model["device_ns"]


def test_every_slice_matches_the_walk_up_its_parents(h200: dlprof.Run, walked: dict[int, int]) -> None:
    for kind in (Kind.OP, Kind.MODULE, Kind.USER_ANNOTATION):
        times = device_times(h200, kind)
        assert times["device_ns"].tolist() == [walked.get(int(i), 0) for i in times["id"]], kind


def test_an_op_holds_its_childrens_kernels(h200: dlprof.Run) -> None:
    table = top(h200, limit=None).set_index("name")
    child = table.loc["aten::_scaled_dot_product_cudnn_attention"]
    # Autocast dispatches the op to itself: its device time counts the work once, not twice.
    assert table.loc[SDPA, "device_ns"] == child["device_ns"] > 4_000_000
    assert table.loc[SDPA, "self_device_ns"] == 0


def test_backward_layers_agree_with_autograds_sequence_numbers(h200: dlprof.Run) -> None:
    """A backward node (its ``evaluate_function`` op) carries the sequence number of the forward
    op that made it: its work belongs to the layers around that forward op."""
    slices = h200.slices
    main = int(slices.loc[slices["kind"] == Kind.STEP, "tid"].iloc[0])
    walk = Walk(h200)
    ops = slices[(slices["kind"] == Kind.OP) & slices["sequence_nr"].notna()]
    forward_ops = ops[ops["tid"] == main].sort_values("depth", ascending=False)
    made_by = dict(zip(forward_ops["sequence_nr"].astype("int64"), forward_ops["id"], strict=True))  # outermost
    names = dict(zip(slices["id"], slices["name"], strict=True))
    nodes = ops[(ops["tid"] != main) & ops["name"].str.startswith("autograd::engine::evaluate_function")]
    node_of = dict(zip(nodes["id"], nodes["sequence_nr"].astype("int64"), strict=True))
    work = slices[slices["device"] != "cpu"].groupby("correlation_id")["dur_ns"].sum()
    calls = slices[(slices["kind"] == Kind.RUNTIME) & (slices["tid"] != main) & slices["correlation_id"].isin(work.index)]
    by_sequence: dict[str, int] = defaultdict(int)
    for call, correlation in zip(calls["id"], calls["correlation_id"], strict=True):
        chain = [int(call)]
        while (parent := walk.parent(chain[-1])) is not None:
            chain.append(parent)
        node = next((i for i in reversed(chain) if i in node_of), None)
        if node is None or node_of[node] not in made_by:
            continue
        current: int | None = int(made_by[node_of[node]])
        while current is not None:
            if walk.rows[current]["kind"] == Kind.MODULE:
                by_sequence[names[current].replace(" forward", " backward")] += int(work[correlation])
            current = walk.parent(current)
    table = top(h200, kind=Kind.MODULE, limit=None).set_index("name")
    blocks = [f"transformer.h.{i}{part}" for i in range(6)
              for part in (" (GPT2Block)", ".mlp (GPT2MLP)", ".attn (GPT2Attention)")]
    for block in blocks:
        assert table.loc[f"{block} backward", "device_ns"] == by_sequence[f"{block} backward"] > 0, block
    assert table.loc[f"{LM_HEAD} backward", "device_ns"] == by_sequence[f"{LM_HEAD} backward"]


def test_a_step_holds_the_work_of_every_thread_of_its_process(h200: dlprof.Run) -> None:
    slices = h200.slices
    steps = device_times(h200, Kind.STEP).merge(slices[["id", "start_ns", "dur_ns"]], on="id")
    work = slices[slices["device"] != "cpu"].groupby("correlation_id")["dur_ns"].sum()
    calls = slices[(slices["kind"] == Kind.RUNTIME) & slices["correlation_id"].isin(work.index)]
    main = int(slices.loc[slices["kind"] == Kind.STEP, "tid"].iloc[0])
    assert (calls["tid"] != main).sum() > 5_000  # autograd's thread launched the backward
    for step in steps.itertuples():
        inside = calls[(calls["start_ns"] >= step.start_ns) & (calls["start_ns"] < step.start_ns + step.dur_ns)]
        assert step.device_ns == step.self_device_ns == int(work[inside["correlation_id"]].sum())


def test_top_sorts_by_device_time_on_a_gpu_run_and_keeps_the_column(h200_run: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from dlprof.cli.main import main

    assert main(["top", str(h200_run), "--kind", "module", "-n", "5"]) == 0
    out = capsys.readouterr().out
    assert "top module by device" in out and "Device (ms)" in out
    assert max(len(line) for line in out.splitlines()) <= 80
    first = next(line for line in out.splitlines() if line.strip().startswith("GPT2LMHeadMode"))
    assert "backward" in first  # 233 ms of GPU time, though its forward took longer on the host
    assert main(["top", str(h200_run), "--kind", "module", "-n", "5", "--by", "total"]) == 0
    assert "top module by total" in capsys.readouterr().out


def test_ops_count_their_thread_steps_and_regions_their_process(tmp_path: Path) -> None:
    run = write_rows_run(tmp_path / "threads", [
        op(1, "ProfilerStep#1", 0, 1000, kind="step"),
        op(2, "train", 0, 900, kind="region"),
        op(3, "inner", 100, 300, kind="region"),
        op(4, "aten::mm", 100, 100),
        op(5, "cudaLaunchKernel", 110, 5, kind="runtime", correlation_id=1),
        op(6, "aten::add", 150, 40),  # inside aten::mm
        op(7, "cudaLaunchKernel", 160, 5, kind="runtime", correlation_id=2),
        # Another thread of the process launches during aten::mm and inside the inner region.
        op(8, "MmBackward0", 120, 50, tid=2),
        op(9, "cudaLaunchKernel", 130, 5, tid=2, kind="runtime", correlation_id=3),
        # At the step's end exactly: not inside it.
        op(10, "cudaLaunchKernel", 1000, 5, tid=2, kind="runtime", correlation_id=4),
        op(11, "k1", 200, 10, tid=7, kind="kernel", device="cuda:0", correlation_id=1),
        op(12, "k2", 210, 20, tid=7, kind="kernel", device="cuda:0", correlation_id=2),
        op(13, "k3", 230, 40, tid=7, kind="kernel", device="cuda:0", correlation_id=3),
        op(14, "k4", 1100, 80, tid=7, kind="kernel", device="cuda:0", correlation_id=4),
    ])

    def figures(kind: Kind) -> dict[int, tuple[int, int]]:
        table = device_times(run, kind)
        return {int(r.id): (int(r.device_ns), int(r.self_device_ns)) for r in table.itertuples()}

    assert figures(Kind.OP) == {4: (30, 10), 6: (20, 20), 8: (40, 40)}
    # The inner region holds all three launches (one from the other thread): none is train's own.
    assert figures(Kind.REGION) == {2: (70, 0), 3: (70, 70)}
    assert figures(Kind.STEP) == {1: (70, 70)}
    assert pd.notna(top(run, kind=Kind.OP)["self_device_ns"]).all()
    assert top(run, kind=Kind.OP, by=SortKey.DEVICE)["name"].tolist() == ["MmBackward0", "aten::mm", "aten::add"]
