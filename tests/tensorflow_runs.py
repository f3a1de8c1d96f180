"""Real TensorFlow runs the tests share, each made once per test session: importing TensorFlow
takes seconds, so every TensorFlow test reuses these.

The model and data are the bundled example's (``examples/keras_mlp.py``). The tests read the
XPlane files TensorFlow wrote with TensorFlow's own protobuf module, to check dlprof's tables
against what the profile holds without going through dlprof's reader.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pandas as pd
import pytest

import dlprof

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "keras_mlp.py"
SAMPLES, BATCH = 256, 32
BATCHES = SAMPLES // BATCH  # per epoch
EPOCHS = 2  # of keras_run
# The head of a script run under `dlprof run` that trains the example: its model and data.
EXAMPLE_PROGRAM = f"""
    import importlib.util, sys
    spec = importlib.util.spec_from_file_location("example", {str(EXAMPLE)!r})
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    keras = example.keras
    x, y = example.synthetic_data({BATCH * BATCHES}, 32, 10)
    model = example.build_model(32, 10, 64)
"""


def tensorflow() -> ModuleType:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return pytest.importorskip("tensorflow", reason="needs TensorFlow (pip install 'dlprof[tf]')")


def keras_example() -> ModuleType:
    """The example as a module: its model and data, without running its main()."""
    tensorflow()
    spec = importlib.util.spec_from_file_location("keras_mlp_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def example_model(jit_compile: bool = False, warm: bool = True) -> tuple[Any, Any, Any]:
    """A fresh example model and the example's data; warm: traced and compiled by one batch."""
    example = keras_example()
    x, y = example.synthetic_data(SAMPLES, 32, 10)
    model = example.build_model(32, 10, 64, jit_compile=jit_compile)
    if warm:  # so that a profile holds steady-state steps
        model.fit(x[:BATCH], y[:BATCH], batch_size=BATCH, epochs=1, verbose=0)
    return model, x, y


def xplane_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("**/plugins/profile/*/*.xplane.pb"))


def read_xspace(path: Path) -> Any:
    """An XPlane file parsed by TensorFlow's own generated protobuf module."""
    tensorflow()
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(path.read_bytes())
    return space


@dataclass(frozen=True)
class Event:
    """One event of an XPlane, as the test reads it: its metadata, line and stats by name."""

    plane: str
    line: str
    name: str
    display_name: str
    offset_ps: int
    duration_ps: int
    stats: dict[str, Any]


def events(space: Any, plane_name: str = "/host:CPU") -> Iterator[Event]:
    for plane in space.planes:
        if plane.name != plane_name:
            continue
        stat_names = {m.id: m.name for m in plane.stat_metadata.values()}
        for line in plane.lines:
            for event in line.events:
                metadata = plane.event_metadata[event.metadata_id]
                stats = {}
                for stat in event.stats:
                    which = stat.WhichOneof("value")
                    value = getattr(stat, which)
                    stats[stat_names[stat.metadata_id]] = stat_names[value] if which == "ref_value" else value
                yield Event(plane.name, line.name, metadata.name, metadata.display_name,
                            line.timestamp_ns * 1000 + event.offset_ps, event.duration_ps, stats)


def profile_with_tensorflow(logdir: Path, jit_compile: bool) -> Path:
    """TensorFlow's own profiler around one epoch of a warm example model: its XPlane file."""
    tf = tensorflow()
    model, x, y = example_model(jit_compile)
    tf.profiler.experimental.start(str(logdir))
    try:
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    finally:
        tf.profiler.experimental.stop()
    [path] = xplane_files(logdir)
    return path


@pytest.fixture(scope="session")
def tf_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example profiled by TensorFlow's own profiler (no dlprof)."""
    return profile_with_tensorflow(tmp_path_factory.mktemp("tf-profile"), jit_compile=False)


@pytest.fixture(scope="session")
def tf_xla_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same with the training step compiled by XLA (``jit_compile=True``)."""
    return profile_with_tensorflow(tmp_path_factory.mktemp("tf-xla-profile"), jit_compile=True)


@pytest.fixture(scope="session")
def keras_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``dlprof.profile()`` around EPOCHS epochs of the example, a step ended after each batch by
    the program's own callback calling ``prof.step()``; the XPlane files stay in the run."""
    keras = keras_example().keras
    out = tmp_path_factory.mktemp("runs") / "keras"

    class StepEachBatch(keras.callbacks.Callback):  # type: ignore[misc]
        def __init__(self, session: Any) -> None:
            super().__init__()
            self.session = session

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.session.step()

    model, x, y = example_model(warm=False)
    with dlprof.profile(out=out, collectors=("tensorflow",)) as prof:
        model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0, callbacks=[StepEachBatch(prof)])
    return out


CALL_PREFIX = re.compile(r"^((Stateful)?PartitionedCall(_\d+)?/)+")


def op_events(paths: Path | list[Path]) -> list[Event]:
    """TensorFlow op events as the profiles mark them: ``name:Type`` with the type as display
    name (of every profile given: a run saved more than once has one per save)."""
    return [e for e in all_events(paths) if e.display_name and e.name.endswith(":" + e.display_name)
            and e.duration_ps > 0]


def all_events(paths: Path | list[Path]) -> list[Event]:
    """The host events of one profile, or of each of several."""
    return [e for path in ([paths] if isinstance(paths, Path) else paths) for e in events(read_xspace(path))]


def op_name(event: Event) -> str:
    return CALL_PREFIX.sub("", event.name[: -len(event.display_name) - 1])


def ops_matching_the_profile(run: dlprof.Run, xplane: Path | list[Path]) -> pd.DataFrame:
    """The run's op slices, after checking they are the profile's op events (name, raw type)."""
    expected = Counter((op_name(e), e.display_name) for e in op_events(xplane))
    ops = run.slices[run.slices.kind == "op"]
    assert Counter(zip(ops.name, ops.category, strict=True)) == expected
    return ops


def dense_scopes(tf_profile: Path | list[Path]) -> list[str]:
    """The name scopes of the example's Dense layers: where its fused MatMul+BiasAdd ops run."""
    return sorted({op_name(e).rsplit("/", 1)[0] for e in op_events(tf_profile)
                   if e.display_name == "_MklNativeFusedMatMul"})
