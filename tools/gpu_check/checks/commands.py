"""Every analysis command on the GPU run, as a user types it, each within 30 s: what a user would
see in the first minutes on a GPU.

    python -m tools.gpu_check.checks.commands --work DIR --result FILE --seconds 120

The run is the recordings part's ``dlprof run`` of the GPT-style workload; ``dlprof metrics``
reads the metrics part's torch run instead when there is one (PM samples on torch's kernels: the
GPT run has no counters). The commands (:func:`commands`): ``top --kind K`` for every kind the
run holds, ``steps``, ``gpu``, ``memory``, ``roofline --by kernel``, ``estimate`` on another GPU,
``advise``, ``tune``, ``metrics``, ``report``, and ``export`` in every format (files go to this
part's work directory, never into the run). One part per command: passed when it exits 0 within
:data:`COMMAND_LIMIT_S`, failed with its exit status (or the time-out) and its last line of
error; its time is a figure, its output goes to the log.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from tools.gpu_check.checks.harness import CannotRun, Check, StepFailed, main, tail
from tools.gpu_check.checks.recordings import GPT_RUN
from tools.gpu_check.report import Part, Status

COMMAND_LIMIT_S = 30
RECORDINGS = "recordings"  # the recordings part's work directory, beside this one
METRICS_RUN = ("cupti_metrics", "torch-run")  # the metrics part's run with PM samples on torch's kernels


def estimate_target(gpu: str) -> str:
    """A device to predict the run on: not the one it ran on."""
    return "h100" if "a100" in gpu.lower() else "a100"


def commands(run: Path, kinds: list[str], formats: dict[str, str], work: Path, gpu: str,
             metrics_run: Path | None) -> list[list[str]]:
    """The ``dlprof`` commands to run (without ``dlprof``), in order.

    Args:
        run: the GPU run.
        kinds: the kinds of slice it holds.
        formats: export format -> file extension.
        work: where exports and the report go.
        gpu: the name of the GPU it ran on.
        metrics_run: a run with PM samples, for ``metrics``; the GPU run when there is none.
    """
    where = str(run)
    listed = [["top", where, "--kind", kind] for kind in kinds]
    listed += [["steps", where], ["gpu", where], ["memory", where], ["roofline", where, "--by", "kernel"],
               ["estimate", where, "--device", estimate_target(gpu)], ["advise", where], ["tune", where],
               ["metrics", str(metrics_run or run)], ["report", where, "-o", str(work / "report.html")]]
    listed += [["export", where, "-f", name, "-o", str(work / "export" / f"trace{extension}")]
               for name, extension in formats.items()]
    return listed


def shown(argv: list[str], run: Path, metrics_run: Path | None, work: Path) -> str:
    """A command as the report names it: the runs as RUN (and METRICS_RUN), files by name."""
    names = {str(run): "RUN", str(metrics_run): "METRICS_RUN"}
    return "dlprof " + " ".join(names.get(a, Path(a).name if a.startswith(str(work)) else a) for a in argv)


def run_command(c: Check, argv: list[str], what: str) -> Part:
    """One command with its time limit; the part holds its exit status and seconds."""
    if c.seconds_left() < COMMAND_LIMIT_S / 3:
        return Part(what, Status.COULD_NOT_RUN, f"out of time: {c.seconds_left():.0f} s left")
    started = time.monotonic()
    try:
        done = c.python(what, ["-m", "dlprof", *argv], timeout_s=COMMAND_LIMIT_S, allow_failure=True,
                        env={"COLUMNS": "120"})
    except StepFailed as failure:
        return Part(what, Status.FAILED, failure.detail, {"seconds": round(time.monotonic() - started, 1)})
    seconds = round(time.monotonic() - started, 1)
    figures = {"exit": done.returncode, "seconds": seconds}
    if done.returncode != 0:
        return Part(what, Status.FAILED, f"exited {done.returncode} after {seconds} s: {tail(done.stderr, 2)}",
                    figures)
    return Part(what, Status.PASSED, f"exit 0 in {seconds} s", figures)


def check(c: Check) -> None:
    import dlprof
    from dlprof.exporters.registry import BY_FORMAT

    run_path = c.all_work / RECORDINGS / GPT_RUN
    if not (run_path / "run.json").is_file():
        raise CannotRun("the GPU run was recorded", f"no {GPT_RUN} in {run_path.parent} (see the recordings part)")
    run = dlprof.load(run_path)
    kinds = [str(kind) for kind, in run.query("SELECT DISTINCT kind FROM slices ORDER BY kind").rows]
    gpu = str(run.manifest.devices[0].get("name", "")) if run.manifest.devices else ""
    metrics_run = c.all_work.joinpath(*METRICS_RUN)
    metrics = metrics_run if (metrics_run / "run.json").is_file() else None
    formats = {name: exporter.file_extension for name, exporter in BY_FORMAT.items()}
    (c.work / "export").mkdir(parents=True, exist_ok=True)
    for argv in commands(run_path, kinds, formats, c.work, gpu, metrics):
        c.add(run_command(c, argv, shown(argv, run_path, metrics, c.work)))


if __name__ == "__main__":
    sys.exit(main(check))
