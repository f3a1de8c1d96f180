"""dlprof: profiling and tracing for deep-learning programs.

    import dlprof

    with dlprof.profile(out="runs/mine", schedule="0,1,1,5") as prof:
        for batch in loader:
            with dlprof.region("train_step"):
                train(batch)
            prof.step()
            dlprof.log(loss=loss.item())                   # a metric's curve: the series table
        dlprof.log(split="eval", eval_accuracy=accuracy)   # dlprof tta --target "eval_accuracy>=0.75"

    run = dlprof.load("runs/mine")                # engine="spark" for Apache Spark
    run.sql("SELECT name, sum(dur_ns) FROM slices GROUP BY name")   # on DuckDB, a DataFrame back
    run.slices  # the whole table as a pandas DataFrame, read on first use
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlprof.config import ProfileConfig, default_memory_cap, save_limits
from dlprof.schedule import Schedule

if TYPE_CHECKING:
    from dlprof.recording.regions import region
    from dlprof.recording.session import Session
    from dlprof.store.reader import Run, RunError, load

__all__ = ["Run", "RunError", "Session", "load", "log", "profile", "region", "step"]
__version__ = "0.1.0"

# Loaded on first use, so that importing one layer (dlprof.store.reader, say) does not load the
# session and its collectors through this package's __init__.
_LAZY = {
    "region": "dlprof.recording.regions",
    "Session": "dlprof.recording.session",
    "Run": "dlprof.store.reader",
    "RunError": "dlprof.store.reader",
    "load": "dlprof.store.reader",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dlprof' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def profile(
    out: str | os.PathLike[str] | None = None,
    *,
    schedule: str | Schedule | None = None,
    collectors: tuple[str, ...] | list[str] | None = None,
    name: str = "profile",
    record_shapes: bool = True,
    profile_memory: bool = True,
    with_flops: bool = True,
    with_stack: bool = False,
    all_threads: bool = False,
    counters: tuple[str, ...] | list[str] = (),
    counter_scope: str = "thread",
    save_seconds: float | None = None,
    memory_cap_mib: int | None = None,
    force: bool = False,
    strict: bool = False,
) -> Session:
    """A profiling session for a block of code; use it with ``with``.

    Args:
        out: the run directory; by default ``./dlprof-runs/<time>-<name>``.
        schedule: ``"skip_first,wait,warmup,active,repeat"`` or a :class:`Schedule`; by
            default every step is recorded.
        collectors: which collectors to run (``torch``, ``layers``, ``tensorflow``, ``host``...);
            None, the default set, records whichever of PyTorch and TensorFlow the program
            imports (each framework's collectors start once it is imported).
        name: the run's name.
        record_shapes: record op input shapes (torch collector).
        profile_memory: record allocations (torch collector).
        with_flops: estimate FLOPs of matrix and convolution ops (torch collector).
        with_stack: record Python stacks of ops (torch collector; TensorFlow's Python tracer
            for the tensorflow collector; costly).
        all_threads: record the ops of every Python thread, not only of the one that enters
            the session (torch collector; torch.profiler then records no allocations).
        counters: CPU counters per step and region (``task-clock``, ``page-faults``...; see
            ``dlprof counters``); adds the ``counters`` collector. A counter that cannot be
            counted here is reported and left out.
        counter_scope: ``"thread"`` (the thread that starts the session) or ``"process"``.
        save_seconds: save at least this often, at step boundaries (without steps, where no
            layer or region is open), whatever the pauses cost: a process killed loses what came
            since its last save (as ``dlprof run --save-seconds``). None: about every 10 s while
            those pauses stay under 2% of the run.
        memory_cap_mib: what profiling may hold above the program's own memory: saves come
            before dlprof's events would pass it (``--memory-cap``); None, the smaller of 2048
            MiB and a tenth of this machine's memory.
        force: replace the run already in ``out`` (as ``dlprof run --force``); without it an
            ``out`` that holds a run is refused. Ranks of a job share ``out`` and never check.
        strict: a collector that cannot record is an error, not a degraded run (as ``dlprof run
            --strict``): entering the block raises ``CollectorError`` where that is known then
            (a collector named in ``collectors`` that cannot run here, one that fails to start),
            leaving it raises ``DegradedRun`` otherwise, once the run is saved.

    Returns:
        The session; call ``.step()`` at the end of each training step.

    Raises:
        RunExistsError: (a ``FileExistsError``) ``out`` holds a run and ``force`` is false, holds
            a run another process is writing, or holds other files. Entering the session raises
            ``RunInUseError`` (a ``FileExistsError`` too) when another process began writing
            ``out`` meanwhile: one writer per run.
    """
    if isinstance(schedule, str):
        schedule = Schedule.parse(schedule)
    from dlprof.distributed import RankEnvironment
    from dlprof.recording.session import Session

    place = RankEnvironment.from_environment()
    if counter_scope not in ("thread", "process"):
        raise ValueError(f"counter_scope {counter_scope!r}: choose thread or process")
    if save_seconds is not None and save_seconds < 0.1:
        raise ValueError(f"save_seconds {save_seconds}: at least 0.1")
    if memory_cap_mib is not None and memory_cap_mib < 16:
        raise ValueError(f"memory_cap_mib {memory_cap_mib}: at least 16")
    if out is not None and place.world_size == 1:
        from dlprof.store.new_run import prepare_run_dir

        prepare_run_dir(Path(out), force, force_hint="force=True")
    seconds, pause_share = save_limits(save_seconds)
    config = ProfileConfig(
        out=Path(out) if out is not None else None,
        name=name,
        collectors=tuple(collectors) if collectors is not None else None,
        schedule=schedule,
        record_shapes=record_shapes,
        profile_memory=profile_memory,
        with_flops=with_flops,
        with_stack=with_stack,
        all_threads=all_threads,
        counters=tuple(counters),
        counter_scope=counter_scope,
        save_seconds=seconds,
        pause_share=pause_share,
        memory_cap_bytes=memory_cap_mib << 20 if memory_cap_mib is not None else default_memory_cap(),
        rank=place.rank,
        world_size=place.world_size,
        strict=strict,
    )
    return Session(config)


def step() -> None:
    """End the current step of the active session (no-op when none is active)."""
    from dlprof.recording.session import active_session

    session = active_session()
    if session is not None:
        session.step()


def log(step: int | None = None, split: str = "train", *, epoch: float | None = None,
        samples: int | None = None, **metrics: float) -> None:
    """Record metric values (loss, accuracy...) of the active session, with the step and time.

    They go to the run's ``series`` table; ``dlprof tta`` finds when one first reached a
    target, and the Perfetto export draws each as a counter track. No-op when no session is
    active, so a program keeps its calls when it runs unprofiled.

    Args:
        step: the steps ended when the values were taken; by default the session's count.
        split: ``"train"``, ``"eval"``, or a word of your own.
        epoch: the epoch they belong to (for epochs to a target).
        samples: training samples seen so far (for samples to a target).
        **metrics: the values by name, each a number (a 0-d tensor or numpy scalar too).

    Raises:
        TypeError: a value is not a number.
    """
    from dlprof.keys import SeriesSource
    from dlprof.recording.session import active_session

    values = []
    for name, value in metrics.items():
        try:
            values.append((name, float(value)))
        except (TypeError, ValueError):
            raise TypeError(f"dlprof.log: {name}={value!r} is not a number") from None
    session = active_session()
    if session is not None and values:
        session.log(SeriesSource.LOG, split, values, step, epoch=epoch, samples=samples)
