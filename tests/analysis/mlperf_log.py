"""An MLPerf-style training program, written out for ``dlprof run``: it prints ``:::MLLOG`` lines
with times of its own choosing, so that every figure of time to accuracy can be checked by hand."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

T0_MS = 1_600_000_000_000  # the program's run_start, epoch milliseconds
EPOCH_MS = 100_000  # each epoch ends 100 s after the last
EVAL_MS = 10_000  # the evaluation closing each epoch lasts 10 s
ACCURACY_AT_MS = 8_000  # eval_accuracy is logged 8 s into it, before eval_stop (as MLPerf's ResNet)
STEPS_PER_EPOCH = 10
GLOBAL_BATCH_SIZE = 256

PROGRAM = '''
import json
import dlprof

T0, EPOCH, EVAL, AT, STEPS, BATCH = {T0_MS}, {EPOCH_MS}, {EVAL_MS}, {ACCURACY_AT_MS}, {STEPS_PER_EPOCH}, {GLOBAL_BATCH_SIZE}

def mllog(key, value, ms, event="POINT_IN_TIME", **metadata):
    line = {{"namespace": "", "time_ms": T0 + ms, "event_type": event, "key": key, "value": value,
             "metadata": {{"file": "train.py", "lineno": 1, **metadata}}}}
    print(":::MLLOG", json.dumps(line))   # print's own pieces: ':::MLLOG', ' ', the JSON, '\\n'

mllog("submission_benchmark", "resnet", 0)
mllog("global_batch_size", BATCH, 0)
mllog("run_start", None, 0, "INTERVAL_START")
for epoch, accuracy in enumerate({accuracies}, start=1):
    for _ in range(STEPS):
        dlprof.step()
    end = epoch * EPOCH
    mllog("eval_start", None, end - EVAL, "INTERVAL_START", epoch_num=epoch)
    mllog("eval_accuracy", accuracy, end - EVAL + AT, epoch_num=epoch)
    mllog("eval_stop", None, end, "INTERVAL_END", epoch_num=epoch)
mllog("run_stop", None, len({accuracies}) * EPOCH + 1000, "INTERVAL_END", status="success")
'''


def run_mlperf_program(tmp_path: Path, name: str, accuracies: list[float]) -> Path:
    """Run the program under ``dlprof run`` (a real subprocess); returns the run directory."""
    script = tmp_path / f"{name}.py"
    script.write_text(PROGRAM.format(accuracies=accuracies, **{k: v for k, v in globals().items() if k.isupper()}))
    out = tmp_path / name
    done = subprocess.run([sys.executable, "-m", "dlprof", "run", "-o", str(out), "--collectors", "host",
                           str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=180, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(":::MLLOG") == 3 + 3 * len(accuracies) + 1  # the user sees every line
    return out
