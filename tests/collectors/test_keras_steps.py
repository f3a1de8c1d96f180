"""Steps from a Keras fit under ``dlprof run``, on real Keras training: the fit is the program's,
called as it called it; dlprof's callback failing never fails the fit."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

import dlprof
from dlprof.config import ProfileConfig
from dlprof.keys import RunStatus
from dlprof.recording.runner import Target, run_target
from tests.conftest import needs_counters
from tests.tensorflow_runs import BATCH, BATCHES, EXAMPLE_PROGRAM

pytestmark = pytest.mark.tf

PROGRAM = EXAMPLE_PROGRAM + """
    class Batches(keras.callbacks.Callback):
        seen = 0
        def on_train_batch_end(self, batch, logs=None):
            Batches.seen += 1
"""


def run_program(tmp_path: Path, body: str, counters: tuple[str, ...] = ()) -> tuple[dlprof.Run, int]:
    """A script run as `dlprof run` runs it (in this process, where TensorFlow is loaded)."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(PROGRAM) + textwrap.dedent(body))
    config = ProfileConfig(out=tmp_path / "run", name="train", collectors=("host",), counters=counters,
                           auto_steps=True)
    outcome = run_target(Target(str(script), is_module=False), config)
    return dlprof.load(outcome.run_dir), outcome.exit_code


def steps(run: dlprof.Run) -> int:
    return int((run.slices.kind == "step").sum())


def test_a_fit_given_one_callback_not_in_a_list_runs(tmp_path: Path) -> None:
    """Keras takes a single callback as well as a list; before, dlprof's wrapper failed the fit
    with TypeError: Value after * must be an iterable."""
    run, code = run_program(tmp_path, f"""
    model.fit(x, y, batch_size={BATCH}, epochs=1, verbose=0, callbacks=Batches())
    sys.exit(0 if Batches.seen == {BATCHES} else 5)
    """)
    assert code == 0
    assert steps(run) == BATCHES + 1 and run.status is RunStatus.COMPLETE


def test_a_fit_keras_refuses_is_refused_in_keras_own_words(tmp_path: Path) -> None:
    """Before, the wrapper's own binding of the arguments refused it, in other words."""
    run, code = run_program(tmp_path, f"""
    try:
        model.fit(x, y, batch_size={BATCH}, epochs=1, verbose=0, learning_speed=2)
    except TypeError as error:
        print(error, file=sys.stderr)
        sys.exit(0 if str(error).endswith("fit() got an unexpected keyword argument 'learning_speed'") else 6)
    """)
    assert code == 0
    assert run.manifest.degraded == []


def test_counters_unreadable_inside_a_fit_stop_the_recording_not_the_fit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each batch restarts dlprof's step, reading the counters: the program points their
    descriptors away as the third batch begins, before dlprof's callback restarts the step.
    Before, the reading's error failed the fit."""
    needs_counters()
    run, code = run_program(tmp_path, f"""
    import os

    class Redirect(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == 2:
                null = os.open(os.devnull, os.O_RDONLY)
                for name in os.listdir("/proc/self/fd"):
                    try:
                        if os.readlink(f"/proc/self/fd/{{name}}") == "anon_inode:[perf_event]":
                            os.dup2(null, int(name))
                    except OSError:
                        pass
                os.close(null)

    model.fit(x, y, batch_size={BATCH}, epochs=1, verbose=0, callbacks=[Redirect(), Batches()])
    sys.exit(0 if Batches.seen == {BATCHES} else 5)
    """, counters=("task-clock",))
    assert code == 0, "the fit ran every batch"
    (reason,) = run.manifest.degraded
    assert re.fullmatch(r"recording failed \(error: unpack requires a buffer of \d+ bytes\) after step 2: "
                        r"recording stopped", reason), reason
    assert f"dlprof: {reason}; the program goes on" in capsys.readouterr().err
    assert run.status is RunStatus.DEGRADED
