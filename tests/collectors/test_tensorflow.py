"""The TensorFlow collector on real Keras training: ops, steps, layers, schedules, memory, clocks,
checked against the XPlane files TensorFlow wrote into the run (read with TensorFlow's protobuf)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

import dlprof
from dlprof.analysis.aggregate import top
from dlprof.analysis.tau_profile import tau_profiles
from dlprof.collectors.tensorflow import is_tensorflow_chatter
from dlprof.config import ProfileConfig
from dlprof.keys import RunStatus
from dlprof.recording.runner import Target, run_target
from dlprof.support.chatter import hidden_chatter
from dlprof.support.import_watch import when_imported
from tests.exporters.perfetto_trace import export
from tests.references import EXPECTED_CATEGORY
from tests.tensorflow_runs import (
    BATCH,
    BATCHES,
    EPOCHS,
    EXAMPLE_PROGRAM,
    all_events,
    dense_scopes,
    example_model,
    op_events,
    op_name,
    ops_matching_the_profile,
    xplane_files,
)

pytestmark = pytest.mark.tf


def ancestors(slices: pd.DataFrame, slice_id: int) -> list[str]:
    by_id = slices.set_index("id")
    names = []
    parent = by_id.loc[slice_id, "parent_id"]
    while not pd.isna(parent):
        names.append(str(by_id.loc[parent, "name"]))
        parent = by_id.loc[parent, "parent_id"]
    return names


def test_ops_are_the_xplane_ops(keras_run: Path) -> None:
    run = dlprof.load(keras_run)
    assert run.status is RunStatus.COMPLETE
    xplane = xplane_files(keras_run / "tensorflow")
    ops = ops_matching_the_profile(run, xplane)
    assert {"MatMul", "BiasAddGrad", "ReluGrad"} <= set(ops.op_type)
    assert not run.slices.name.str.contains("dlprof::clock_sync").any()


def test_a_step_per_batch_each_holding_its_train_step(keras_run: Path) -> None:
    run = dlprof.load(keras_run)
    slices = run.slices
    steps = slices[slices.kind == "step"].sort_values("start_ns")
    batches = EPOCHS * BATCHES
    # Each batch ends a step; the step under way when the session stops is kept too.
    assert list(steps.name) == [f"ProfilerStep#{n}" for n in range(batches + 1)]
    xplane = xplane_files(keras_run / "tensorflow")
    calls = [e for e in all_events(xplane) if e.name == "multi_step_on_iterator"]
    assert len(calls) == batches, "Keras calls its train function once per batch"
    stored = slices[slices.name == "multi_step_on_iterator"]
    assert len(stored) == batches
    owners = Counter(ancestors(slices, i)[-1] for i in stored.id)
    assert owners == Counter(f"ProfilerStep#{n}" for n in range(batches)), "one call in each step"
    assert set(stored.tid) == set(steps.tid), "the training thread's events are on its own thread id"


def test_layer_slices_hold_their_layers_ops(keras_run: Path) -> None:
    run = dlprof.load(keras_run)
    slices = run.slices
    xplane = xplane_files(keras_run / "tensorflow")
    modules = slices[slices.kind == "module"].set_index("id")
    for scope in dense_scopes(xplane):
        for direction, prefix in (("forward", ""), ("backward", "gradient_tape/")):
            ids = modules.index[modules.name == f"{scope} {direction}"]
            held = slices[slices.parent_id.isin(ids)]
            expected = sum(e.duration_ps for e in op_events(xplane) if op_name(e).startswith(f"{prefix}{scope}/"))
            assert len(held) and set(held.kind) == {"op"}
            assert abs(held.dur_ns.sum() - expected / 1000) <= len(held)


def test_a_layer_is_called_once_per_batch(keras_run: Path) -> None:
    """TensorFlow's executor interleaves a layer's ops with others' (variable reads, the
    optimizer's updates), so a layer's call is several slices; top counts them as one call."""
    run = dlprof.load(keras_run)
    modules = run.slices[run.slices.kind == "module"]
    table = top(run, kind="module", limit=None).set_index("name")
    batches = EPOCHS * BATCHES
    for scope in dense_scopes(xplane_files(keras_run / "tensorflow")):
        pieces = modules[modules.name == f"{scope} backward"]
        assert len(pieces) >= batches
        row = table.loc[f"{scope} backward"]
        assert row.calls == batches, scope
        assert row.total_ns == pieces.dur_ns.sum() and row.max_ns >= pieces.dur_ns.max()
    pieces_per_name = modules.groupby("name").size()
    assert (pieces_per_name > table["calls"].reindex(pieces_per_name.index)).any(), "some calls are in pieces"
    # TAU's profile counts calls the same way, on each thread the pieces ran on.
    profiles = pd.concat([p.functions.assign(thread=p.thread) for p in tau_profiles(run)])
    for scope in dense_scopes(xplane_files(keras_run / "tensorflow")):
        calls = profiles[profiles.name == f"{scope} backward"].calls
        assert batches <= calls.sum() <= batches * len(calls), scope


def test_allocator_events_and_clock(keras_run: Path) -> None:
    run = dlprof.load(keras_run)
    xplane = xplane_files(keras_run / "tensorflow")
    signs = {"MemoryAllocation": 1, "MemoryDeallocation": -1}
    allocations = [e for e in all_events(xplane) if e.name in signs]
    expected = Counter((signs[e.name] * e.stats["allocation_bytes"], e.stats["bytes_allocated"]) for e in allocations)
    assert Counter(zip(run.memory.bytes, run.memory.total_allocated, strict=True)) == expected
    [clock] = [c for c in run.manifest.clocks if c.name == "xplane"]
    assert clock.bounds_ns is not None and clock.bounds_ns[0] <= clock.offset_ns <= clock.bounds_ns[1]
    assert "clock_sync" in clock.method
    ops = run.slices[run.slices.kind == "op"]
    assert run.manifest.start_ns <= ops.start_ns.min() and (ops.start_ns + ops.dur_ns).max() <= run.manifest.end_ns


def test_perfetto_export_round_trips(keras_run: Path, tmp_path: Path) -> None:
    run, parsed = export(keras_run, tmp_path)
    written = Counter((s.name, s.start, s.end - s.start, s.depth) for s in parsed.slices)
    stored = Counter(zip(run.slices.name, run.slices.start_ns, run.slices.dur_ns, run.slices.depth, strict=True))
    assert written == stored
    category = {(s.name, s.start, s.end - s.start): s.category for s in parsed.slices}
    for name, start, dur, kind in zip(run.slices.name, run.slices.start_ns, run.slices.dur_ns,
                                      run.slices.kind, strict=True):
        assert category[(name, start, dur)] == EXPECTED_CATEGORY[kind], (kind, name)


def test_schedule_records_the_active_steps_only(tmp_path: Path) -> None:
    model, x, y = example_model()
    keras = sys.modules["keras"]

    class StepEachBatch(keras.callbacks.Callback):  # type: ignore[misc]
        def on_train_batch_end(self, batch: int, logs: object = None) -> None:
            dlprof.step()

    out = tmp_path / "run"
    with dlprof.profile(out=out, collectors=("tensorflow",), schedule="1,1,1,2,1"):
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[StepEachBatch()])
    run = dlprof.load(out)
    steps = run.slices[run.slices.kind == "step"].sort_values("start_ns")
    assert list(steps.name) == ["ProfilerStep#3", "ProfilerStep#4"]
    xplane = xplane_files(out / "tensorflow")  # the one cycle: warm-up and the two active steps
    assert [path.parents[3].name for path in xplane] == ["cycle-00000"]
    ops = run.slices[run.slices.kind == "op"]
    assert 0 < len(ops) < len(op_events(xplane)), "the warm-up step's ops are left out"
    first, last = steps.iloc[0], steps.iloc[-1]
    assert ops.start_ns.min() >= first.start_ns
    assert ops.start_ns.max() <= last.start_ns + last.dur_ns
    steps_in_profile = [e for e in all_events(xplane) if e.name == "multi_step_on_iterator"]
    assert len(steps_in_profile) == 3, "profiled from the warm-up step to the last active one"


def test_with_stack_is_said_to_record_no_tensorflow_frames(tmp_path: Path,
                                                            capfd: pytest.CaptureFixture[str]) -> None:
    """TensorFlow's Python API drops every profiler option; none is passed, and the run says that
    --with-stack cannot ask TensorFlow for Python frames."""
    from dlprof.collectors.tensorflow import WITH_STACK_NOTE

    model, x, y = example_model()
    with dlprof.profile(out=tmp_path / "run", collectors=("tensorflow",), with_stack=True) as prof:
        model.fit(x[:BATCH], y[:BATCH], batch_size=BATCH, epochs=1, verbose=0)
        prof.step()
    assert "expects an i value" not in capfd.readouterr().err
    [info] = dlprof.load(tmp_path / "run").manifest.collectors
    assert info.active and WITH_STACK_NOTE in info.notes


def test_the_programs_own_profiler_keeps_its_profile(tmp_path: Path) -> None:
    tf = sys.modules["tensorflow"]
    tf.profiler.experimental.start(str(tmp_path / "mine"))
    try:
        with dlprof.profile(out=tmp_path / "run", collectors=("tensorflow",)) as prof:
            tf.constant(1.0) + 1.0
            prof.step()
    finally:
        tf.profiler.experimental.stop()
    run = dlprof.load(tmp_path / "run")
    assert run.status is RunStatus.COMPLETE
    [info] = run.manifest.collectors
    assert any("Another profiler is running" in note for note in info.notes)
    assert xplane_files(tmp_path / "mine"), "the program's own profile is written as usual"


def run_script(tmp_path: Path, source: str, collectors: tuple[str, ...] = ("tensorflow",)) -> dlprof.Run:
    """A script run as `dlprof run` runs it (in this process, where TensorFlow is loaded)."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(source))
    config = ProfileConfig(out=tmp_path / "run", name="train", collectors=collectors, auto_steps=True)
    outcome = run_target(Target(str(script), is_module=False), config)
    run = dlprof.load(outcome.run_dir)
    assert run.manifest.exit_code == outcome.exit_code
    return run


PROGRAM = EXAMPLE_PROGRAM


def test_keras_fit_ends_a_step_per_batch_under_dlprof_run(tmp_path: Path) -> None:
    keras = pytest.importorskip("keras")
    fit = keras.Model.fit
    run = run_script(tmp_path, PROGRAM + f"""
    model.fit(x, y, batch_size={BATCH}, epochs=1, verbose=0)
    """)
    assert run.status is RunStatus.COMPLETE
    steps = run.slices[run.slices.kind == "step"]
    assert sorted(steps.name, key=lambda n: int(n.split("#")[1])) == [f"ProfilerStep#{n}" for n in range(BATCHES + 1)]
    assert keras.Model.fit is fit, "fit is given back when the session stops"


def test_a_fit_that_fails_leaves_a_failed_run_with_its_steps(tmp_path: Path) -> None:
    run = run_script(tmp_path, PROGRAM + f"""
    class Boom(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == 3:
                raise RuntimeError("diverged at batch 3")

    model.fit(x, y, batch_size={BATCH}, epochs=1, verbose=0, callbacks=[Boom()])
    """)
    assert run.status is RunStatus.FAILED
    assert "diverged at batch 3" in run.manifest.error and run.manifest.exit_code == 1
    names = set(run.slices[run.slices.kind == "step"].name)
    assert {"ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"} <= names <= {f"ProfilerStep#{n}" for n in range(4)}
    assert (run.slices.kind == "op").sum() > 0
    assert (run.slices.kind == "module").sum() > 0


@pytest.mark.torch
def test_a_torch_optimizer_inside_a_keras_fit_ends_no_step_of_its_own(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    run = run_script(tmp_path, PROGRAM + f"""
    import torch
    weight = torch.nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.SGD([weight], lr=0.1)

    class TorchToo(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            (weight.sum() * 2).backward()
            optimizer.step()

    model.fit(x, y, batch_size={BATCH}, epochs=1, verbose=0, callbacks=[TorchToo()])
    for _ in range(3):  # outside the fit, the optimizer ends the steps again
        (weight.sum() * 2).backward()
        optimizer.step()
    """, collectors=("tensorflow", "optimizer_steps"))
    steps = run.slices[run.slices.kind == "step"]
    assert len(steps) == BATCHES + 3 + 1


def test_a_program_that_never_imports_tensorflow_does_not_load_it(tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        import sys, dlprof
        with dlprof.profile(out={str(tmp_path / "run")!r}, collectors=("tensorflow",)) as prof:
            prof.step()
        print("tensorflow" in sys.modules, "keras" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split() == ["False", "False"]
    [info] = dlprof.load(tmp_path / "run").manifest.collectors
    assert any("did not import tensorflow" in note for note in info.notes)


def test_a_watch_runs_once_the_module_has_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "dlprof_watch_probe.py").write_text("import sys\nfinished = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    watch = when_imported("dlprof_watch_probe", lambda module: seen.append(module.finished))
    try:
        import dlprof_watch_probe  # type: ignore[import-not-found]  # noqa: F401
    finally:
        watch.cancel()
        sys.modules.pop("dlprof_watch_probe", None)
    assert seen == [True]
    assert watch not in sys.meta_path


def test_profiler_chatter_is_hidden_and_the_rest_passed_on(capfd: pytest.CaptureFixture[str]) -> None:
    lines = (
        b"I0000 00:00:1795354126.321718    3773 profiler_session.cc:117] Profiler session initializing.\n"
        b"I0000 00:00:1795354126.346927    3773 save_profile.cc:150] Collecting XSpace to repository: x\n"
        b"the program's own line\n"
    )
    with hidden_chatter(is_tensorflow_chatter):
        os.write(2, lines)
    assert capfd.readouterr().err == "the program's own line\n"

