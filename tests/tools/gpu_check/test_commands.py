"""The commands part on the H200 recording, as it reads the GPU run: the commands, how each is
shown and judged."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from dlprof.exporters.registry import BY_FORMAT
from tools.gpu_check.checks import commands as part
from tools.gpu_check.checks.commands import check, commands, estimate_target, shown
from tools.gpu_check.checks.harness import CannotRun, Check
from tools.gpu_check.checks.recordings import GPT_RUN
from tools.gpu_check.report import Status

H200_RUN = Path(__file__).resolve().parents[2] / "data" / "h200" / "gpt2-dlprof-run"


def test_every_kind_and_every_export_format_gets_a_command(tmp_path: Path) -> None:
    formats = {name: exporter.file_extension for name, exporter in BY_FORMAT.items()}
    listed = commands(H200_RUN, ["kernel", "op"], formats, tmp_path, "NVIDIA H200", None)
    names = [" ".join(argv[:1] + argv[2:]) for argv in listed]
    assert names[:2] == ["top --kind kernel", "top --kind op"]
    for command in ("steps", "gpu", "memory", "roofline --by kernel", "estimate --device a100", "advise", "tune",
                    "metrics"):
        assert command in names
    exports = [argv for argv in listed if argv[0] == "export"]
    assert sorted(argv[3] for argv in exports) == sorted(BY_FORMAT)
    assert all(Path(argv[-1]).parent == tmp_path / "export" for argv in exports)  # never into the run
    assert estimate_target("NVIDIA A100-SXM4-80GB") == "h100"
    assert shown(listed[-1], H200_RUN, None, tmp_path).startswith("dlprof export RUN -f ")


@pytest.mark.slow
def test_each_command_is_a_part_with_its_exit_status_and_time(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "commands"
    work.mkdir()
    shutil.copytree(H200_RUN, tmp_path / "recordings" / GPT_RUN)
    every = commands
    monkeypatch.setattr(part, "commands", lambda *args: [argv for argv in every(*args)
                                                         if argv[0] in ("steps", "metrics")
                                                         or argv[-2:] == ["--kind", "kernel"] or "chrome" in argv])
    c = Check(work, work / "result.json", time.monotonic() + 600)
    check(c)
    found = {p.what: p for p in c.parts}
    assert sorted(found) == ["dlprof export RUN -f chrome -o trace.json", "dlprof metrics RUN",
                             "dlprof steps RUN", "dlprof top RUN --kind kernel"]
    assert found["dlprof steps RUN"].status is Status.PASSED and found["dlprof steps RUN"].figures["exit"] == 0
    # The GPT run has no counters and no PM sampling run is beside it: metrics refuses, in one line.
    metrics = found["dlprof metrics RUN"]
    assert metrics.status is Status.FAILED and metrics.detail.startswith("exited 2 after ")
    assert "no built-in metric can be computed" in metrics.detail
    assert (work / "export" / "trace.json").is_file()


def test_without_the_recorded_run_the_part_says_why(tmp_path: Path) -> None:
    (tmp_path / "commands").mkdir()
    with pytest.raises(CannotRun, match="no gpt-dlprof-run in"):
        check(Check(tmp_path / "commands", tmp_path / "result.json", time.monotonic() + 60))
