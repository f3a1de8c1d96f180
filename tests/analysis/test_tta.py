"""Time to accuracy on real runs: an MLPerf-style log picked up by ``dlprof run`` (figures checked
by hand), ``dlprof.log`` under a fake clock, a Keras fit's logs, and MLPerf's olympic mean."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import dlprof
from dlprof.analysis.tta import Comparison, Target, TimeToTarget, olympic_mean, time_to_target
from dlprof.keys import SeriesSource
from dlprof.store import series_buffer
from tests.analysis.mlperf_log import run_mlperf_program


class FakeClock:
    """The series' clock: ``perf_counter_ns`` as the tests set it, so a logged value's time is
    exactly the start of profiling plus the seconds the test advanced."""

    def __init__(self) -> None:
        self.now_ns = 0

    def __call__(self) -> int:
        return self.now_ns

    def start_with(self, session: dlprof.Session) -> None:
        """Time 0 is the session's start as its manifest records it."""
        self.now_ns = session.manifest.start_ns - session.series.to_epoch_ns

    def advance(self, seconds: float) -> None:
        self.now_ns += round(seconds * 1e9)


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeClock]:
    clock = FakeClock()
    monkeypatch.setattr(series_buffer, "perf_counter_ns", clock)
    yield clock


def test_an_mlperf_log_gives_the_hand_checked_figures(tmp_path: Path) -> None:
    # Evaluations close each 100 s epoch: [90 s, 100 s], [190 s, 200 s]..., accuracy logged 8 s
    # in. 0.762 at epoch 2 (198 s) is the first to reach 0.759; it falls back at epoch 3.
    run = dlprof.load(run_mlperf_program(tmp_path, "resnet", [0.70, 0.762, 0.751, 0.775]))
    result = time_to_target(run, Target.parse("eval_accuracy>=0.759"))
    assert result.reached and result.origin == "run_start"
    assert result.seconds == pytest.approx(198.0)
    assert result.value == pytest.approx(0.762)
    assert result.steps == 20  # 10 steps an epoch, two epochs
    assert result.samples == 20 * 256  # steps times the logged global_batch_size
    assert result.epochs == 2.0
    # Epoch 1's evaluation whole (10 s) and epoch 2's up to the crossing (8 s).
    assert result.eval_seconds == pytest.approx(18.0)
    assert result.eval_share == pytest.approx(18.0 / 198.0)
    assert result.best == pytest.approx(0.775)


def test_a_target_never_met_says_so_with_the_best_value(tmp_path: Path) -> None:
    run = dlprof.load(run_mlperf_program(tmp_path, "short", [0.70, 0.72]))
    result = time_to_target(run, Target.parse("eval_accuracy>=0.759"))
    assert not result.reached
    assert (result.seconds, result.steps, result.samples, result.epochs) == (None, None, None, None)
    assert result.best == pytest.approx(0.72)
    assert result.eval_seconds == pytest.approx(20.0)  # both evaluations, whole


def test_dlprof_log_values_carry_step_and_time_and_the_first_crossing_counts(
        tmp_path: Path, fake_clock: FakeClock) -> None:
    losses = [2.0, 1.2, 0.4, 0.9, 0.2]  # below 0.5 first at the third value, 6 s in
    with dlprof.profile(out=tmp_path / "run", collectors=["host"]) as prof:
        fake_clock.start_with(prof)
        for epoch, loss in enumerate(losses, start=1):
            for _ in range(3):
                prof.step()
            fake_clock.advance(2.0)
            dlprof.log(split="eval", epoch=epoch, samples=epoch * 96, val_loss=loss)
    run = dlprof.load(tmp_path / "run")
    series = run.sql("SELECT ts_ns, step, epoch, samples, split, metric, value, source FROM series ORDER BY ts_ns")
    assert series["value"].tolist() == losses
    assert series["step"].tolist() == [3, 6, 9, 12, 15]
    assert (series["ts_ns"] - run.manifest.start_ns).tolist() == [2_000_000_000 * i for i in range(1, 6)]
    assert set(series["source"]) == {SeriesSource.LOG} and set(series["split"]) == {"eval"}
    result = time_to_target(run, Target.parse("val_loss<0.5"))
    assert (result.seconds, result.steps, result.epochs, result.samples) == (6.0, 9, 3.0, 3 * 96)
    assert result.origin == "profiling start" and result.eval_seconds == 0.0
    assert time_to_target(run, Target.parse("val_loss<=0.2")).seconds == 10.0
    assert not time_to_target(run, Target.parse("val_loss<0.1")).reached


def test_dlprof_log_refuses_what_is_no_number_and_is_quiet_without_a_session() -> None:
    dlprof.log(loss=1.0)  # no session: nothing happens
    with pytest.raises(TypeError, match="loss='high' is not a number"):
        dlprof.log(loss="high")  # type: ignore[arg-type]


def test_a_metric_never_logged_is_named_with_those_that_were(tmp_path: Path) -> None:
    with dlprof.profile(out=tmp_path / "run", collectors=["host"]):
        dlprof.log(loss=1.0, accuracy=0.5)
    with pytest.raises(ValueError, match="no values of 'eval_accuracy'; it logged: accuracy, loss"):
        time_to_target(dlprof.load(tmp_path / "run"), Target.parse("eval_accuracy>=0.759"))


@pytest.mark.parametrize("text", ["eval_accuracy", "eval_accuracy=>0.7", ">=0.7", "acc>=nan", "acc>=inf", "acc>=x"])
def test_targets_that_do_not_parse_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="target"):
        Target.parse(text)


def test_targets_parse_each_comparison() -> None:
    assert Target.parse(" val_loss <= 0.25 ") == Target("val_loss", Comparison.AT_MOST, 0.25)
    assert [Target.parse(f"m{c}1").comparison.met(1.0, 1.0) for c in (">=", ">", "<=", "<")] == [
        True, False, True, False]


def _results(times: list[float | None]) -> list[TimeToTarget]:
    return [TimeToTarget(f"r{i}", t is not None, t, None, None, None, None, 0.0, "run_start", None)
            for i, t in enumerate(times)]


def test_the_olympic_mean_drops_the_fastest_and_slowest() -> None:
    # MLPerf's ResNet: 5 runs; 9 and 15 dropped, (10 + 11 + 12) / 3.
    mean = olympic_mean(_results([10.0, 12.0, 9.0, 15.0, 11.0]))
    assert mean.seconds == pytest.approx(11.0)
    assert (mean.kept, mean.dropped_fastest, mean.dropped_slowest, mean.not_reached) == (3, 1, 1, 0)


def test_a_run_that_never_converged_is_the_slowest_dropped() -> None:
    mean = olympic_mean(_results([10.0, 12.0, None, 9.0, 11.0]))
    assert mean.seconds == pytest.approx(11.0)  # 9 dropped as the fastest, the failed one as the slowest
    assert (mean.kept, mean.dropped_fastest, mean.dropped_slowest, mean.not_reached) == (3, 1, 0, 1)
    assert olympic_mean(_results([10.0, None, None, 9.0, 11.0])).seconds is None  # two failed: no score


def test_unet3d_drops_four_at_each_end() -> None:
    times = [float(t) for t in range(1, 41)]  # 40 runs, as MLPerf asks of UNet3D
    assert olympic_mean(_results(times), drop=4).seconds == pytest.approx(sum(times[4:36]) / 32)
    with_failures = [*times[:37], None, None, None]
    assert olympic_mean(_results(with_failures), drop=4).seconds == pytest.approx(sum(times[4:36]) / 32)


def test_too_few_runs_give_no_score() -> None:
    assert olympic_mean(_results([10.0, 12.0])).seconds is None


KERAS_FIT = """
import numpy as np, keras
x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
y = (x[:, 0] > 0).astype("int32")
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.layers.Input((4,)), keras.layers.Dense(2, activation="softmax")])
model.compile(keras.optimizers.SGD(0.5), "sparse_categorical_crossentropy", metrics=["accuracy"])
model.fit(x, y, batch_size=16, epochs=3, validation_data=(x[:32], y[:32]), verbose=0)
"""


@pytest.mark.tf
@pytest.mark.slow
def test_a_keras_fit_logs_are_recorded_with_no_change_to_the_program(tmp_path: Path) -> None:
    pytest.importorskip("keras", reason="needs Keras (pip install 'dlprof[tf]')")
    (tmp_path / "fit.py").write_text(KERAS_FIT)
    done = subprocess.run([sys.executable, "-m", "dlprof", "run", "-o", str(tmp_path / "run"), "fit.py"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    run = dlprof.load(tmp_path / "run")
    series = run.sql("SELECT ts_ns, step, epoch, split, metric, value FROM series ORDER BY ts_ns, metric")
    assert set(run.sql("SELECT DISTINCT source FROM series")["source"]) == {SeriesSource.KERAS}
    val = series[series["metric"] == "val_loss"]
    train = series[series["metric"] == "loss"]
    # One validation and one epoch's end per epoch; 4 batches an epoch end 4 steps.
    assert val["epoch"].tolist() == train["epoch"].tolist() == [1.0, 2.0, 3.0]
    assert val["step"].tolist() == train["step"].tolist() == [4, 8, 12]
    assert set(val["split"]) == {"eval"} and set(train["split"]) == {"train"}
    starts = series[series["metric"] == "eval_start"]["ts_ns"].to_numpy()
    stops = series[series["metric"] == "eval_stop"]["ts_ns"].to_numpy()
    assert len(starts) == len(stops) == 3 and (starts < stops).all()
    assert ((starts <= val["ts_ns"].to_numpy()) & (val["ts_ns"].to_numpy() <= stops)).all()
    # Time to the first validation loss below the third epoch's: reached at the third epoch at most.
    target = val["value"].iloc[-1]
    result = time_to_target(run, Target("val_loss", Comparison.AT_MOST, float(target)))
    first = val[val["value"] <= target].iloc[0]
    assert result.steps == first["step"] and result.epochs == first["epoch"]
    assert result.seconds == pytest.approx((first["ts_ns"] - run.manifest.start_ns) / 1e9)
    assert 0 < result.eval_seconds < result.seconds
