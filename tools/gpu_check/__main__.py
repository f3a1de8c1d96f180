"""``make gpu-check``: prove or disprove every GPU path of dlprof in one go, on a machine with an
NVIDIA GPU and no network.

    python -m tools.gpu_check                     # report into $DLPROF_GPU_CHECK_OUT if set, else the work directory
    python -m tools.gpu_check --out reports/ --check torch_cuda --check nvml

Steps: ask the driver for a GPU (none: one line, exit 3); make sure the Python has dlprof's
dependencies, installing only what is missing from ``.whl`` into ``.gpu-venv`` (never from the
network); ask that Python what it can import and which versions it has; run each check
(:data:`tools.gpu_check.checks.CHECKS`), then when time is left each part after them
(:data:`tools.gpu_check.checks.AFTER_CHECKS`: recordings, commands, overhead), in a process of
its own with a time limit, all within ``--budget`` seconds (8 minutes); write ``gpu-check.json``,
``gpu-check.md`` and ``gpu-check.log`` after every one, so that even a run cut short leaves a
report. The report's directory also receives the recordings: at most 8 files of at most 16 MiB
in all (:mod:`tools.gpu_check.bring_back`).

Exit status (:class:`tools.gpu_check.report.ExitCode`): 0 every check passed, 1 a check failed,
2 bad options, 3 no NVIDIA GPU here, 4 nothing failed but a check could not run.

Standard library only, up to the point where the checks run in the prepared Python.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from tools.gpu_check.checks import AFTER_CHECKS, CHECKS, CheckSpec
from tools.gpu_check.driver import Gpus, find_gpus
from tools.gpu_check.install import Prepared, prepare
from tools.gpu_check.report import LOG_NAME, CheckResult, ExitCode, Report, write_report
from tools.gpu_check.runner import CHECK_LOG_NAME, run_check

ROOT = Path(__file__).resolve().parents[2]
# Set-up, the checks, the recordings, the commands and the overhead: 8 minutes, so that a GPU lent
# for 15 (its start-up and the copying of the tree included) runs it in one command.
BUDGET_S = 480
REPORT_RESERVE_S = 15  # kept back at the end for the report
PROBE_TIMEOUT_S = 120
# Where the report goes when --out is not given.
OUT_VARIABLE = "DLPROF_GPU_CHECK_OUT"
LOG_TAIL_BYTES = 1024 * 1024  # of each part's log in gpu-check.log: 8 parts stay far under 16 MiB


def _say(message: str) -> None:
    print(f"gpu-check: {message}", flush=True)


def parse(argv: list[str]) -> argparse.Namespace:
    names = [spec.name for spec in (*CHECKS, *AFTER_CHECKS)]
    parser = argparse.ArgumentParser(
        prog="python -m tools.gpu_check",
        description="Prove every GPU path of dlprof on a machine with an NVIDIA GPU, offline, in one go.",
        epilog="exit status: 0 all passed, 1 a check failed, 2 bad options, 3 no NVIDIA GPU here, "
               "4 nothing failed but a check could not run. Example: python -m tools.gpu_check "
               "--out /tmp/report --check torch_cuda",
    )
    parser.add_argument("--out", type=Path, default=None,
                        help="where to write gpu-check.json, .md and .log (default: $DLPROF_GPU_CHECK_OUT if set, else the "
                             "work directory)")
    parser.add_argument("--work", type=Path, default=None,
                        help="where the runs go (default: dlprof-runs/gpu-check-<time>/)")
    parser.add_argument("--python", default=sys.executable,
                        help="the machine's Python, with torch and CuPy (default: this one)")
    parser.add_argument("--wheels", type=Path, default=ROOT / ".whl",
                        help="wheels to install what is missing from (default: .whl, made by make gpu-wheels)")
    parser.add_argument("--venv", type=Path, default=ROOT / ".gpu-venv",
                        help="where to make a virtual environment if something is missing (default: .gpu-venv)")
    parser.add_argument("--budget", type=float, default=BUDGET_S,
                        help=f"seconds for everything (default: {BUDGET_S})")
    parser.add_argument("--check", dest="checks", action="append", choices=names, metavar="NAME",
                        help=f"run only this check or part (repeatable): {', '.join(names)}")
    return parser.parse_args(argv)


def probe(python: str, modules: list[str], env: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """What ``python`` can import (module -> "" or the error) and the versions it reports."""
    try:
        done = subprocess.run([python, "-m", "tools.gpu_check.environment", *modules], cwd=ROOT,
                              env=env, capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S, check=False)
        data = json.loads(done.stdout.strip().splitlines()[-1])
        return dict(data["modules"]), dict(data["environment"])
    except (OSError, ValueError, IndexError, KeyError, subprocess.TimeoutExpired) as error:
        why = f"{python} could not be asked what it imports: {type(error).__name__}: {error}"
        return {m: why for m in modules}, {}


def check_environment(work: Path, pythonpath: list[str] | None = None) -> dict[str, str]:
    """The environment of every check: this tree first on the path (then ``pythonpath``), CuPy's
    cache in the work directory."""
    path = os.pathsep.join(p for p in (str(ROOT), *(pythonpath or []), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1",
            "CUPY_CACHE_DIR": str(work / "cupy-cache")}


def describe(gpus: Gpus, found: dict[str, str]) -> dict[str, str]:
    """The report's environment: the driver's own answers first, then what the libraries say."""
    environment = {"GPU": ", ".join(gpus.names), "CUDA (driver)": gpus.cuda_text}
    for key, value in found.items():
        if key in environment and value.startswith("unknown"):
            continue  # NVML could not say: keep the driver's answer
        environment[key] = value
    return environment


def _pending(specs: list[CheckSpec], done: list[CheckResult], why: str) -> tuple[CheckResult, ...]:
    left = [CheckResult.not_run(s.name, s.title, why, covers=s.covers) for s in specs[len(done):]]
    return (*done, *left)


def _append_log(log: Path, title: str, text: str) -> None:
    with log.open("a", encoding="utf-8") as out:
        out.write(f"\n===== {title} =====\n{text}\n")


def _check_log(path: Path) -> str:
    try:
        with path.open("rb") as log:
            log.seek(max(0, path.stat().st_size - LOG_TAIL_BYTES))
            return log.read().decode(errors="replace")
    except OSError as error:
        return f"(no log: {error})"


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    started = time.monotonic()
    gpus = find_gpus()
    if gpus.reason:
        _say(f"no NVIDIA GPU here ({gpus.reason}); nothing was checked (exit {int(ExitCode.NO_GPU)})")
        return ExitCode.NO_GPU
    _say(f"{len(gpus.names)} GPU(s): {', '.join(gpus.names)}; the driver supports CUDA {gpus.cuda_text}")
    work = args.work or ROOT / "dlprof-runs" / f"gpu-check-{datetime.now():%Y%m%d-%H%M%S}"
    out = args.out or (Path(os.environ[OUT_VARIABLE]) if os.environ.get(OUT_VARIABLE) else work)
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    log = out / LOG_NAME
    log.write_text(f"python -m tools.gpu_check {' '.join(sys.argv[1:] if argv is None else argv)}\n")
    try:
        prepared = prepare(args.python, args.wheels, args.venv, gpus.cuda_major)
    except (OSError, subprocess.SubprocessError, ValueError, KeyError) as error:
        prepared = Prepared(args.python, [], f"could not prepare {args.python}: {type(error).__name__}: {error}")
    _append_log(log, "set-up", "\n".join([*prepared.notes, prepared.problem]))
    _say(prepared.notes[-1] if prepared.notes else f"using {prepared.python}")
    if prepared.problem:
        _say(prepared.problem)
    specs = [s for s in (*CHECKS, *AFTER_CHECKS) if not args.checks or s.name in args.checks]
    modules = list(dict.fromkeys(m for s in specs for m in s.needs))
    env = check_environment(work, prepared.pythonpath)
    imports, found = probe(prepared.python, modules, env)
    environment = describe(gpus, found)
    _append_log(log, "environment", json.dumps({"imports": imports, "environment": environment}, indent=1))
    results: list[CheckResult] = []
    for spec in specs:
        left = args.budget - (time.monotonic() - started) - REPORT_RESERVE_S
        unmet = {m: imports.get(m, "not asked") for m in spec.needs if imports.get(m, "not asked")}
        if prepared.problem:
            result = CheckResult.not_run(spec.name, spec.title, prepared.problem, covers=spec.covers)
        elif unmet:
            why = "; ".join(f"{m} does not import: {e}" + (f" (cupti-python {environment.get('cupti-python')})"
                                                            if m.startswith("cupti") else "")
                            for m, e in unmet.items())
            result = CheckResult.not_run(spec.name, spec.title, why, covers=spec.covers)
        elif left < spec.least_s:
            result = CheckResult.not_run(spec.name, spec.title, f"out of time: {max(left, 0):.0f} s of the "
                                         f"{args.budget:.0f} s budget left, {spec.least_s} s needed",
                                         covers=spec.covers)
        else:
            _say(f"{spec.name}: running (at most {min(spec.timeout_s, left):.0f} s)")
            result = run_check(spec, prepared.python, work, min(spec.timeout_s, left), env, out)
            _append_log(log, spec.name, _check_log(work / spec.name / CHECK_LOG_NAME))
        results.append(result)
        ended = f": {result.reason}" if result.reason else ""
        _say(f"{spec.name} {result.status} ({result.seconds:.0f} s){ended}")
        partial = Report(environment, _pending(specs, results, "not reached: the GPU check was stopped first"),
                         seconds=time.monotonic() - started, notes=tuple(prepared.notes))
        write_report(partial, out)
    report = Report(environment, tuple(results), seconds=time.monotonic() - started, notes=tuple(prepared.notes))
    json_path, markdown_path = write_report(report, out)
    _say(f"{report.summary()}; report: {markdown_path}, {json_path}, {log} (exit {int(report.exit_code())})")
    return report.exit_code()


if __name__ == "__main__":
    sys.exit(main())
