"""The GPU check's report: statuses from parts, exit codes, and the JSON and Markdown it writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.gpu_check.report import (
    JSON_NAME,
    MARKDOWN_NAME,
    CheckResult,
    ExitCode,
    Part,
    Report,
    Status,
    cell,
    overall,
    render_markdown,
    write_report,
)

PASS = Part("kernel calls per name equal the reference's", Status.PASSED, "412 on both sides")
FAIL = Part("kernel device time within 2% of the reference's", Status.FAILED, "ratio 1.0310",
            {"dlprof_ms": 10.31, "reference_ms": 10.0, "largest_moves": [
                {"name": "void k<float|int>(x)", "dlprof_ms": 2.0, "reference_ms": 1.7}]})
SKIP = Part("memory-bound and compute-bound kernels on their sides of the roofline", Status.COULD_NOT_RUN,
            "no roofline command yet")


@pytest.mark.parametrize(("parts", "status"), [
    ([PASS], Status.PASSED), ([PASS, SKIP], Status.PASSED), ([PASS, FAIL, SKIP], Status.FAILED),
    ([SKIP], Status.COULD_NOT_RUN), ([], Status.COULD_NOT_RUN)])
def test_a_checks_status_follows_its_parts(parts: list[Part], status: Status) -> None:
    assert overall(parts) is status
    result = CheckResult.of("x", "title", parts)
    assert result.status is status
    assert result.reason == ("no roofline command yet" if parts == [SKIP] else "")


@pytest.mark.parametrize(("statuses", "code"), [
    ([Status.PASSED, Status.PASSED], ExitCode.PASSED), ([Status.PASSED, Status.FAILED], ExitCode.FAILED),
    ([Status.COULD_NOT_RUN, Status.FAILED], ExitCode.FAILED),
    ([Status.PASSED, Status.COULD_NOT_RUN], ExitCode.INCOMPLETE), ([], ExitCode.INCOMPLETE)])
def test_the_exit_code_says_failed_before_incomplete(statuses: list[Status], code: ExitCode) -> None:
    checks = tuple(CheckResult(f"c{i}", "t", s) for i, s in enumerate(statuses))
    assert Report({}, checks).exit_code() is code
    assert {int(c) for c in ExitCode} == {0, 1, 2, 3, 4}  # distinct, and 3 is the machine without a GPU


def sample_report() -> Report:
    return Report(
        {"GPU": "NVIDIA H100 80GB HBM3", "driver": "570.86.15", "CUDA (driver)": "12.8", "torch": "2.13.0"},
        (CheckResult.of("torch_cuda", "the CNN on CUDA", [PASS, FAIL], 41.2, ("`torch` collector, CUDA",)),
         CheckResult.of("cupti_metrics", "PM sampling", [PASS, SKIP], 20.0, ("`cupti_metrics`",)),
         CheckResult.not_run("nvml", "NVML", "pynvml does not import: ModuleNotFoundError", covers=("`nvml`",))),
        started="2026-11-24 10:00:00 UTC", seconds=80.0, notes=("python3 has every package dlprof needs",))


def test_the_json_reads_back_as_written(tmp_path: Path) -> None:
    report = sample_report()
    json_path, markdown_path = write_report(report, tmp_path / "out")
    assert (json_path.name, markdown_path.name) == (JSON_NAME, MARKDOWN_NAME)
    data = json.loads(json_path.read_text())
    assert data["exit_code"] == 1 and data["summary"] == "3 checks: 1 passed, 1 failed, 1 could not run; parts not run: 1"
    assert data["checks"][0]["parts"][1]["figures"]["dlprof_ms"] == 10.31
    again = Report.from_json(data)
    assert again == report


def test_the_markdown_reads_right_at_a_glance() -> None:
    text = render_markdown(sample_report())
    lines = text.splitlines()
    assert lines[0] == "# dlprof GPU check, 2026-11-24 10:00:00 UTC"
    assert "**3 checks: 1 passed, 1 failed, 1 could not run; parts not run: 1** (exit code 1, 80 s)" in text
    assert "| GPU | NVIDIA H100 80GB HBM3 |" in lines
    assert ("| torch_cuda | FAILED | 41 | the CNN on CUDA | kernel device time within 2% of the reference's |"
            in lines)
    assert "| nvml | could not run | 0 | NVML | pynvml does not import: ModuleNotFoundError |" in lines
    assert "## torch_cuda: FAILED" in lines and "- **FAILED**: kernel device time within 2% of the reference's" in lines
    assert "  - dlprof_ms: 10.31" in lines
    assert "  | void k<float\\|int>(x) | 2.0 | 1.7 |" in lines  # a pipe in a kernel name stays in its cell
    assert "- **could not run**: memory-bound and compute-bound kernels on their sides of the roofline" in lines
    # The README's rows: only what passed is claimed as verified.
    assert "| `torch` collector, CUDA | **no**: failed on NVIDIA H100 80GB HBM3 (2026-11-24) |" in lines
    assert ("| `cupti_metrics` | yes (NVIDIA H100 80GB HBM3, 2026-11-24, `make gpu-check`) |" in lines)
    assert "| `nvml` | **no**: could not run on NVIDIA H100 80GB HBM3 (pynvml does not import: " \
           "ModuleNotFoundError) |" in lines
    assert lines[-1] == "- python3 has every package dlprof needs"


def test_a_cell_is_one_line_escaped_and_cut() -> None:
    assert cell("a|b\nc") == "a\\|b c"
    assert cell("x" * 50, 10) == "x" * 9 + "…"
    assert cell("back\\slash") == "back\\\\slash"
