"""Check (b): the cupti collector on a CuPy program against CUPTI's own records of it.

    python -m tools.gpu_check.checks.cupti_activity --work DIR --result FILE --seconds 180

The CuPy program (:mod:`tools.gpu_check.programs.cupy_work`, phase ``activity``) runs alone
first (CuPy compiles its kernels into the cache both later runs share), then under ``dlprof run
--collectors cupti``, then under a bare cupti-python tracer in a process of its own
(:mod:`tools.gpu_check.programs.cupti_reference`). Kernels, copies and memsets must have the same
calls per name and device time within 2 %, CUDA API calls the same counts per name, and each
piece of device work the launching call CUPTI's own correlation ids give it.

Names are compared as each side spells them from its own source: a kernel by its demangled name
(the reference's raw symbol demangled here), a copy by its CUPTI copy and memory kinds
(``HTOD PAGEABLE -> DEVICE``), read back from dlprof's ``Memcpy HtoD (Pageable -> Device)``.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from dlprof.support.demangle import demangle
from tools.gpu_check.checks.harness import PROGRAMS, Check, main
from tools.gpu_check.checks.stored import Link, api_calls, device_work, run_complete, within_span
from tools.gpu_check.compare import (
    DEVICE_KINDS,
    Work,
    check_linked,
    compare_calls,
    compare_counts,
    compare_launchers,
    compare_time,
)
from tools.gpu_check.report import Part, Status

PROGRAM = [str(PROGRAMS / "cupy_work.py"), "--phase", "activity"]
_MEMCPY = re.compile(r"Memcpy (\S+) \((.+) -> (.+)\)")
_MEMSET = re.compile(r"Memset \((.+)\)")


def _enum_like(text: str) -> str:
    """``Device Static`` -> ``DEVICE_STATIC``: a label as CUPTI's enum spells it."""
    return text.strip().upper().replace(" ", "_")


def stored_key(kind: str, name: str) -> str:
    """The comparison's name for a piece of device work as dlprof stored it."""
    if kind == "memcpy" and (match := _MEMCPY.fullmatch(name)):
        copy, src, dst = (_enum_like(g) for g in match.groups())
        return f"{copy} {src} -> {dst}"
    if kind == "memset" and (match := _MEMSET.fullmatch(name)):
        return _enum_like(match.group(1))
    return name


_REFERENCE_KINDS = {"CONCURRENT_KERNEL": "kernel", "KERNEL": "kernel", "MEMCPY": "memcpy",
                    "MEMCPY2": "memcpy", "MEMSET": "memset"}


def reference_work(records: Sequence[Mapping[str, Any]]) -> tuple[list[Work], list[str]]:
    """CUPTI's own records as device work (launcher: the API call with the same correlation id)
    and the API calls' names."""
    calls = [r for r in records if r["kind"] in ("RUNTIME", "DRIVER")]
    by_correlation = {int(r["correlation_id"]): str(r["api"]) for r in calls}
    work = []
    for record in records:
        kind = _REFERENCE_KINDS.get(str(record["kind"]))
        if kind is None:
            continue
        if kind == "kernel":
            name = demangle(str(record["name"]))
        elif kind == "memcpy":
            name = f"{record['copy']} {record['src']} -> {record['dst']}"
        else:
            name = str(record["memory"])
        work.append(Work(kind, name, int(record["dur_ns"]), by_correlation.get(int(record["correlation_id"]))))
    return work, [str(r["api"]) for r in calls]


def compare_activity(ours: Sequence[Work], our_calls: Sequence[str], theirs: Sequence[Work],
                     their_calls: Sequence[str]) -> list[Part]:
    """Every comparison of the check, dlprof's side against CUPTI's."""
    parts = [compare_calls(ours, theirs, kind) for kind in DEVICE_KINDS]
    parts += [compare_time(ours, theirs, kind) for kind in DEVICE_KINDS]
    parts.append(compare_counts("CUDA runtime and driver calls per name equal CUPTI's",
                                Counter(our_calls), Counter(their_calls)))
    parts.append(check_linked(ours, "correlation id to the CUDA API call"))
    parts.append(compare_launchers(ours, theirs))
    return parts


def check(c: Check) -> None:
    c.python("the CuPy program alone (warm-up, fills CuPy's kernel cache)", PROGRAM)
    run = c.load(c.dlprof_run("dlprof run --collectors cupti", "run", "cupti", PROGRAM))
    c.add(run_complete(run, ["cupti"]))
    c.add(within_span(run, "cupti"))
    reference_path = c.work / "cupti_records.json"
    c.python("the CuPy program under a bare CUPTI tracer",
             ["-m", "tools.gpu_check.programs.cupti_reference", str(reference_path), *PROGRAM])
    reference = json.loads(reference_path.read_text())
    theirs, their_calls = reference_work(reference["records"])
    ours = device_work(run, Link.API_CALL, stored_key)
    for part in compare_activity(ours, api_calls(run), theirs, their_calls):
        c.add(part)
    notes = [n for n in next(i.notes for i in run.manifest.collectors if i.name == "cupti") if "dropped" in n]
    dropped = {"dlprof": notes, "reference": reference["dropped"], "reference_errors": reference["errors"]}
    lost = bool(notes) or reference["dropped"] or reference["errors"]
    c.add(Part("no activity record was dropped or unreadable on either side",
               Status.FAILED if lost else Status.PASSED,
               "none" if not lost else json.dumps(dropped), dropped))


if __name__ == "__main__":
    sys.exit(main(check))
