"""Names a program gives its ranges, as torch.profiler writes them: one bad name costs nothing.

torch 2.13 writes a ``record_function`` name holding ``"`` into its trace unescaped, so the
cycle's JSON is invalid; before, the whole save was lost with it. Names holding ESC, BEL or
U+202E torch writes as ``unknown``; dlprof's own regions keep them, and tables show them safely.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import dlprof
from dlprof.cli.main import main

pytestmark = [pytest.mark.torch, pytest.mark.slow]

torch = pytest.importorskip("torch", reason="needs PyTorch (pip install 'dlprof[torch]')")

QUOTED = 'say "hi" twice'
CONTROLLED = ("esc\x1b[31mred", "bell\x07", "evil\u202egnp")
STEPS = 4


def test_a_range_name_torch_writes_unescaped_loses_nothing(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    with dlprof.profile(out=out, collectors=["torch"]) as prof:
        for _ in range(STEPS):
            for name in (QUOTED, *CONTROLLED):
                with torch.profiler.record_function(name), dlprof.region(f"region {name}"):
                    torch.ones(8) + 1
            prof.step()
    run = dlprof.load(out)
    names = run.query("SELECT name, count(*) FROM slices GROUP BY name").rows
    counts = dict(names)
    assert counts.get(QUOTED) == STEPS, "the name is mended, not lost"
    assert counts.get("aten::add") == STEPS * (1 + len(CONTROLLED)), "every step's ops are kept"
    assert counts.get("unknown") == STEPS * len(CONTROLLED), "as torch wrote them"
    for name in CONTROLLED:
        assert counts.get(f"region {name}") == STEPS, "dlprof's own regions keep the true name"
    assert run.manifest.dropped == {} and not any("dropped" in note for c in run.manifest.collectors
                                                  for note in c.notes)
    capsys.readouterr()
    assert main(["top", str(out), "--kind", "region", "--wide"]) == 0
    shown = capsys.readouterr().out
    assert "region esc\u241b[31mred" in shown and "region evil\ufffdgnp" in shown
    assert "\x1b" not in shown and "\u202e" not in shown


KILLED_AFTER_IMPORT = """
import os, sys
import dlprof
with dlprof.profile(out=sys.argv[1], collectors=["torch", "host"]) as prof:
    import torch  # the torch collector starts here, inside the import
    for _ in range(3):
        torch.ones(8) + 1
        prof.step()
    os._exit(0)  # killed, as it were: no manifest is written at the end
"""


def test_a_collector_started_by_an_import_is_active_in_a_killed_run(tmp_path: Path) -> None:
    script = tmp_path / "killed.py"
    script.write_text(KILLED_AFTER_IMPORT)
    subprocess.run([sys.executable, str(script), str(tmp_path / "run")], check=True, timeout=300)
    run = dlprof.load(tmp_path / "run")
    active = {info.name: info.active for info in run.manifest.collectors}
    assert active == {"torch": True, "host": True}
