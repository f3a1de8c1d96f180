"""What the GPU check found: each check's parts with their figures, written as JSON and Markdown.

Standard library only: the report is written by the process that sets everything else up, before
(and whether or not) dlprof's dependencies can be installed::

    part = Part("kernel calls per name", Status.PASSED, "412 kernels, 37 names: equal")
    result = CheckResult.of("torch_cuda", "PyTorch CNN on CUDA", [part], seconds=41.0)
    paths = write_report(Report(environment={"GPU": "NVIDIA H100"}, checks=(result,)), out_dir)

A check passes when none of its parts failed and at least one passed; it failed when any part
failed; it could not run when no part could be judged (no CuPy, counters restricted, a time-out).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import IntEnum, StrEnum
from pathlib import Path
from typing import Any

JSON_NAME = "gpu-check.json"
MARKDOWN_NAME = "gpu-check.md"
LOG_NAME = "gpu-check.log"
# Kernel names run to thousands of characters (templates): tables show the start of each.
_SHOWN_NAME = 100


class Status(StrEnum):
    """How a check, or one part of it, came out."""

    PASSED = "passed"
    FAILED = "failed"
    COULD_NOT_RUN = "could not run"


class ExitCode(IntEnum):
    """``python -m tools.gpu_check``'s exit status (``make`` reports it as ``Error N``)."""

    PASSED = 0  # every check passed
    FAILED = 1  # at least one check failed
    USAGE = 2  # bad options
    NO_GPU = 3  # no NVIDIA GPU or driver here: nothing was checked
    INCOMPLETE = 4  # nothing failed, but a check could not run


@dataclass(frozen=True)
class Part:
    """One thing a check asserts, and the figures it was judged on."""

    what: str  # the claim, e.g. "kernel calls per name equal torch.profiler's"
    status: Status
    detail: str = ""  # one line: the deciding figures, or why it could not be judged
    figures: dict[str, Any] = field(default_factory=dict)  # JSON-able numbers and short lists

    def to_json(self) -> dict[str, Any]:
        return {"what": self.what, "status": str(self.status), "detail": self.detail,
                "figures": self.figures}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Part:
        return cls(str(data["what"]), Status(data["status"]), str(data.get("detail", "")),
                   dict(data.get("figures", {})))


def overall(parts: Sequence[Part]) -> Status:
    """A check's status from its parts': failed if any failed, passed if any passed, else not run."""
    statuses = {part.status for part in parts}
    if Status.FAILED in statuses:
        return Status.FAILED
    return Status.PASSED if Status.PASSED in statuses else Status.COULD_NOT_RUN


@dataclass(frozen=True)
class CheckResult:
    """One check: what it proves, how it came out, and why."""

    name: str  # short key: torch_cuda, cupti_activity, cupti_metrics, nvml
    title: str  # what it exercises, for a person
    status: Status
    reason: str = ""  # why the whole check could not run, or what ended it
    parts: tuple[Part, ...] = ()
    seconds: float = 0.0
    covers: tuple[str, ...] = ()  # rows of the README's "What was verified where" table

    @classmethod
    def of(cls, name: str, title: str, parts: Iterable[Part], seconds: float = 0.0,
           covers: tuple[str, ...] = ()) -> CheckResult:
        """A result whose status follows from its parts."""
        parts = tuple(parts)
        reason = ""
        if parts and all(p.status is Status.COULD_NOT_RUN for p in parts):
            reason = parts[0].detail
        return cls(name, title, overall(parts), reason, parts, seconds, covers)

    @classmethod
    def not_run(cls, name: str, title: str, reason: str, seconds: float = 0.0,
                covers: tuple[str, ...] = ()) -> CheckResult:
        """A check that could not be run at all, and why."""
        return cls(name, title, Status.COULD_NOT_RUN, reason, (), seconds, covers)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "status": str(self.status),
                "reason": self.reason, "seconds": round(self.seconds, 1), "covers": list(self.covers),
                "parts": [part.to_json() for part in self.parts]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CheckResult:
        return cls(str(data["name"]), str(data["title"]), Status(data["status"]),
                   str(data.get("reason", "")), tuple(Part.from_json(p) for p in data.get("parts", [])),
                   float(data.get("seconds", 0.0)), tuple(str(c) for c in data.get("covers", [])))


@dataclass(frozen=True)
class Report:
    """Every check of one run of the GPU check, with the machine and library versions."""

    environment: dict[str, str]  # "GPU", "driver", "CUDA (driver)", "torch", "CuPy", ...
    checks: tuple[CheckResult, ...]
    started: str = field(default_factory=lambda: datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"))
    seconds: float = 0.0
    notes: tuple[str, ...] = ()  # how the Python environment was prepared, and similar

    def exit_code(self) -> ExitCode:
        statuses = {check.status for check in self.checks}
        if Status.FAILED in statuses:
            return ExitCode.FAILED
        if Status.COULD_NOT_RUN in statuses or not self.checks:
            return ExitCode.INCOMPLETE
        return ExitCode.PASSED

    def summary(self) -> str:
        """One line: how many checks passed, failed or could not run."""
        counts = {status: sum(c.status is status for c in self.checks) for status in Status}
        text = ", ".join(f"{n} {status}" for status, n in counts.items() if n)
        skipped = [f"{c.name}: {p.what}" for c in self.checks if c.status is not Status.COULD_NOT_RUN
                   for p in c.parts if p.status is Status.COULD_NOT_RUN]
        if skipped:
            text += f"; parts not run: {len(skipped)}"
        return f"{len(self.checks)} checks: {text or 'none'}"

    def to_json(self) -> dict[str, Any]:
        return {"started": self.started, "seconds": round(self.seconds, 1),
                "summary": self.summary(), "exit_code": int(self.exit_code()),
                "environment": self.environment, "notes": list(self.notes),
                "checks": [check.to_json() for check in self.checks]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Report:
        return cls({str(k): str(v) for k, v in data.get("environment", {}).items()},
                   tuple(CheckResult.from_json(c) for c in data.get("checks", [])),
                   str(data.get("started", "")), float(data.get("seconds", 0.0)),
                   tuple(str(n) for n in data.get("notes", [])))


def write_report(report: Report, directory: Path) -> tuple[Path, Path]:
    """Write ``gpu-check.json`` and ``gpu-check.md`` into ``directory`` (made if missing)."""
    directory.mkdir(parents=True, exist_ok=True)
    json_path, markdown_path = directory / JSON_NAME, directory / MARKDOWN_NAME
    json_path.write_text(json.dumps(report.to_json(), indent=1) + "\n", encoding="utf-8")
    markdown_path.write_text(render_markdown(report), encoding="utf-8")
    return json_path, markdown_path


def cell(text: object, limit: int | None = None) -> str:
    """Text for one Markdown table cell: one line, pipes escaped, cut to ``limit`` characters."""
    value = " ".join(str(text).split())
    if limit is not None and len(value) > limit:
        value = value[: limit - 1] + "…"
    return value.replace("\\", "\\\\").replace("|", "\\|")


def render_markdown(report: Report) -> str:
    """The report for a person: versions, a table of checks, then each check's parts and figures."""
    lines = [f"# dlprof GPU check, {report.started}", "", f"**{report.summary()}** "
             f"(exit code {int(report.exit_code())}, {report.seconds:.0f} s)", "",
             "| | |", "|---|---|"]
    lines += [f"| {cell(key)} | {cell(value)} |" for key, value in report.environment.items()]
    lines += ["", "| check | status | seconds | what it exercises | why not passed |",
              "|---|---|---|---|---|"]
    for check in report.checks:
        why = check.reason or "; ".join(p.what for p in check.parts if p.status is Status.FAILED)
        lines.append(f"| {cell(check.name)} | {_status_text(check.status)} | {check.seconds:.0f} | "
                     f"{cell(check.title)} | {cell(why, 300)} |")
    for check in report.checks:
        lines += ["", f"## {check.name}: {_status_text(check.status)}", "", cell(check.title)]
        if check.reason:
            lines += ["", f"Reason: {cell(check.reason)}"]
        for part in check.parts:
            lines += ["", f"- **{_status_text(part.status)}**: {cell(part.what)}"]
            if part.detail:
                lines.append(f"  - {cell(part.detail, 2000)}")
            if part.figures:
                lines += _figures(part.figures)
    lines += _verified_rows(report)
    if report.notes:
        lines += ["", "## Notes", ""] + [f"- {cell(note)}" for note in report.notes]
    return "\n".join(lines) + "\n"


def _status_text(status: Status) -> str:
    return "FAILED" if status is Status.FAILED else str(status)


def _figures(figures: Mapping[str, Any]) -> list[str]:
    """Figures as an indented list; lists of rows (dicts) as small tables."""
    lines: list[str] = []
    for key, value in figures.items():
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            columns = list(dict.fromkeys(k for row in value for k in row))
            lines += ["", f"  {cell(key)}:", "", "  | " + " | ".join(cell(c) for c in columns) + " |",
                      "  |" + "---|" * len(columns)]
            lines += ["  | " + " | ".join(cell(row.get(c, ""), _SHOWN_NAME) for c in columns) + " |"
                      for row in value]
            lines.append("")
        else:
            shown = json.dumps(value) if isinstance(value, (list, dict)) else value
            lines.append(f"  - {cell(key)}: {cell(shown, 600)}")
    return lines


def _verified_rows(report: Report) -> list[str]:
    """For the README's table: which of its rows this run proved, on which GPU."""
    gpu = report.environment.get("GPU", "a GPU")
    rows = [(row, check) for check in report.checks for row in check.covers]
    if not rows:
        return []
    lines = ["", "## For the README's \"What was verified where\" table", "",
             "| source | verified on real hardware |", "|---|---|"]
    for row, check in rows:
        if check.status is Status.PASSED:
            verdict = f"yes ({gpu}, {report.started[:10]}, `make gpu-check`)"
        elif check.status is Status.FAILED:
            verdict = f"**no**: failed on {gpu} ({report.started[:10]})"
        else:
            verdict = f"**no**: could not run on {gpu} ({check.reason or 'see the report'})"
        lines.append(f"| {cell(row)} | {cell(verdict, 300)} |")
    return lines
