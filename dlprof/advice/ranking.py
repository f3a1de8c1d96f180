"""Apply the advice rules to a run and rank what they find by the time at stake.

    advice = advise(run)
    for finding in advice.findings:        # most time at stake first
        print(finding.title, finding.stake_ns)
    advice.skipped                         # rules that could not judge the run, with why
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dlprof.advice.base import Finding, Rule, Skip, Skipped
from dlprof.advice.data import RunData
from dlprof.advice.registry import rules as default_rules
from dlprof.store.reader import Run


@dataclass(frozen=True)
class Advice:
    """What the rules said about one run."""

    findings: tuple[Finding, ...]  # most time at stake first
    skipped: tuple[Skipped, ...]  # by rule name
    passed: tuple[str, ...]  # the rules that judged the run and found nothing


def advise(run: Run, rank: int | None = None, rules: Sequence[Rule] | None = None) -> Advice:
    """Apply rules to a run.

    Args:
        run: the run.
        rank: only this rank (rules that compare ranks are then skipped).
        rules: the rules to apply (default: those on by default, :func:`registry.rules`).

    Returns:
        The findings, ranked by the time at stake (then by rule name); the rules skipped, with
        the reason; the rules that found nothing.
    """
    data = RunData(run, rank)
    findings: list[Finding] = []
    skipped: list[Skipped] = []
    passed: list[str] = []
    for rule in default_rules() if rules is None else rules:
        reason = next((r for need in rule.needs if (r := data.missing(need)) is not None), None)
        if reason is None:
            try:
                found = rule.check(data)
            except Skip as skip:
                reason = str(skip)
        if reason is not None:
            skipped.append(Skipped(rule.name, reason))
        elif found is None:
            passed.append(rule.name)
        else:
            findings.append(found)
    findings.sort(key=lambda f: (-f.stake_ns, f.rule))
    return Advice(tuple(findings), tuple(skipped), tuple(passed))
