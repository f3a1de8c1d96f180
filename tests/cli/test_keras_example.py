"""``dlprof run examples/keras_mlp.py`` as a user types it: no flags, a real subprocess."""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from pathlib import Path

import pytest

import dlprof
from dlprof.keys import RunStatus
from tests.conftest import dlprof_program
from tests.tensorflow_runs import (
    EXAMPLE,
    Event,
    all_events,
    dense_scopes,
    op_events,
    ops_matching_the_profile,
    tensorflow,
    xplane_files,
)

pytestmark = [pytest.mark.tf, pytest.mark.slow]


def test_the_keras_example_runs_with_no_flags(tmp_path: Path) -> None:
    tensorflow()
    out = tmp_path / "run"
    # TensorFlow's BFC allocator on the CPU records every allocation in the profile.
    env = {**os.environ, "TF_CPU_ALLOCATOR_USE_BFC": "true"}
    samples, batch = 1024, 64
    done = subprocess.run(
        [*dlprof_program(), "run", "-o", str(out), str(EXAMPLE), "--epochs", "1", "--samples", str(samples)],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "trained 1 epochs" in done.stdout
    assert "profiler_session.cc" not in done.stderr and "Traceback" not in done.stderr
    assert "expects an i value" not in done.stderr, "no option TensorFlow rejects is passed"
    run = dlprof.load(out)
    assert run.status is RunStatus.COMPLETE
    # A Keras program never imports torch, so torch.profiler never runs (the default set's
    # torch collectors wait for the import that never comes).
    waiting = {c.name: c for c in run.manifest.collectors if c.name in ("torch", "layers", "dataloader")}
    assert len(waiting) == 3 and all(not c.active for c in waiting.values())
    assert all(c.notes == ["the program did not import torch: nothing recorded"] for c in waiting.values())
    assert not (out / "kineto").exists()
    xplane = xplane_files(out / "tensorflow")
    ops = ops_matching_the_profile(run, xplane)
    steps = run.slices[run.slices.kind == "step"]
    assert {f"ProfilerStep#{n}" for n in range(samples // batch)} <= set(steps.name)
    modules = set(run.slices[run.slices.kind == "module"].name)
    assert {f"{scope} {d}" for scope in dense_scopes(xplane) for d in ("forward", "backward")} <= modules
    assert not [m for m in modules if m.startswith("adam")], "the Adam optimizer is no layer"
    assert "evaluate" in set(run.slices[run.slices.kind == "region"].name)
    top_op = ops.groupby("name").dur_ns.sum().idxmax()
    assert top_op[:40] in done.stdout, "the top table printed at the end lists TensorFlow's ops"
    signs = {"MemoryAllocation": 1, "MemoryDeallocation": -1}
    allocations = [e for e in all_events(xplane) if e.name in signs]
    assert len(allocations) > 100
    assert Counter(run.memory.bytes) == Counter(signs[e.name] * e.stats["allocation_bytes"] for e in allocations)
    # Each allocation made while an op runs on its thread is tied to that op; the profile's
    # picoseconds become nanoseconds, so those within a nanosecond of an op's edge may go either way.
    ops_by_line: dict[str, list[tuple[int, int]]] = {}
    for event in op_events(xplane):
        ops_by_line.setdefault(event.line, []).append((event.offset_ps, event.offset_ps + event.duration_ps))

    def inside(event: Event, slack_ps: int) -> bool:
        return any(start + slack_ps <= event.offset_ps < end - slack_ps for start, end in ops_by_line.get(event.line, ()))

    surely, maybe = sum(inside(e, 1000) for e in allocations), sum(inside(e, -1000) for e in allocations)
    attributed = int(run.memory.slice_id.notna().sum())
    assert 0 < surely <= attributed <= maybe
