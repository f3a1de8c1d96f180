"""``dlprof advise``: what to change in a program, ranked by the time at stake, each finding
with its evidence, threshold, estimate and source; the rules the run could not feed listed
with the reason."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

import click
import pandas as pd

from dlprof.advice.base import Finding, duration
from dlprof.advice.ranking import Advice, advise
from dlprof.advice.registry import rule_names, rules
from dlprof.cli.common import (
    UsageError,
    check_rank,
    engine_option,
    open_run,
    rank_option,
    run_argument,
    runs_dir_option,
)
from dlprof.cli.table_options import format_option, limit_option, wide_option
from dlprof.keys import TableFormat
from dlprof.viewers.names import signatures_shortened
from dlprof.viewers.screen import table_width, wrapped
from dlprof.viewers.terminal import readable_columns, write_table

HELP = """What to change in a program, ranked by the time at stake.

Each rule reads the run (steps, GPU activity, ops, memory, ranks) and, when it fires, says
what it saw with the top three places and their numbers, its threshold, how much time is at
stake and how that is estimated, the fix, and where the advice comes from. The time at stake
is an estimate of what the fix could gain; where a rule assumes a saving it says so. Rules
whose data the run lacks (no GPU activity, no steps, one rank) are listed under the findings
with the reason.

RUN is a run directory; by default the newest under ./dlprof-runs.

\b
Examples:
  dlprof advise                          # the newest run: findings, then skipped rules
  dlprof advise RUN --rank 0             # one rank of a job
  dlprof advise RUN --rule input-bound   # only this rule (repeatable)
  dlprof advise RUN --all                # rules off by default too (repeated-indexing)
  dlprof advise RUN --format json        # findings and skipped rules for a script
"""

FORMATS = (TableFormat.TABLE, TableFormat.JSON)


@click.command("advise", help=HELP)
@run_argument
@rank_option
@click.option("--rule", "names", multiple=True, metavar="NAME",
              help=f"Only this rule, on by default or not (repeatable): {', '.join(rule_names())}.")
@click.option("--all", "everything", is_flag=True, help="Every rule, those off by default too.")
@limit_option("Findings to show, most at stake first", note="Rules comparing ranks are skipped under --rank.")
@format_option(FORMATS, help_text="Findings for a person, or JSON for a script.")
@wide_option
@runs_dir_option
@engine_option
def command(run: str | None, rank: int | None, names: tuple[str, ...], everything: bool, limit: int,
            fmt: str) -> int:
    loaded = open_run(run)
    check_rank(loaded, rank)
    try:
        chosen = rules(names, everything)
    except KeyError as error:
        raise UsageError(f"no rule {error.args[0]}; the rules are: {', '.join(rule_names())}") from None
    advice = advise(loaded, rank, chosen)
    shown = advice.findings[:limit] if limit else advice.findings
    if TableFormat(fmt) is TableFormat.JSON:
        print(json.dumps(_as_json(advice, shown), indent=1))
        return 0
    title = f"{loaded.path.name} ({loaded.status})"
    if shown:
        write_table(_findings_table(shown), f"{title}: findings, most time at stake first", TableFormat.TABLE,
                    keep=("#", "Rule", "At stake", "Finding"))
        for number, finding in enumerate(shown, start=1):
            _write_finding(number, finding)
    else:
        click.echo(f"{title}: no rule found anything to change ({len(advice.passed)} rules judged the run)")
    if advice.skipped:
        skipped = pd.DataFrame({"Rule": [s.rule for s in advice.skipped], "Reason": [s.reason for s in advice.skipped]})
        write_table(skipped, f"{title}: rules skipped", TableFormat.TABLE)
    return 0


def _findings_table(findings: tuple[Finding, ...]) -> pd.DataFrame:
    table = pd.DataFrame({
        "#": range(1, len(findings) + 1),
        "rule": [f.rule for f in findings],
        "severity": [str(f.severity) for f in findings],
        "stake_ns": [f.stake_ns for f in findings],
        "title": [f.title for f in findings],
    })
    return readable_columns(table, ["#", "rule", "severity"], [[("stake_ns", "At stake")]]).assign(
        Finding=table["title"])


def stake_text(finding: Finding) -> str:
    """``1.43 s at stake``, and the part rules ranked above claimed first, by whom."""
    text = f"{duration(finding.stake_ns)} at stake"
    if finding.shared_ns > 0:
        text += (f" ({duration(finding.shared_ns)} of the time it claims counted under "
                 f"{', '.join(finding.shared_with) or 'the findings above'})")
    return text


def _write_finding(number: int, finding: Finding) -> None:
    """A finding's details under its number: what was seen, where, and what to do; C++
    signatures cut to the width (whole in JSON)."""
    out = sys.stdout
    width = table_width(out)
    short = (lambda text: signatures_shortened(text, max(width - 12, 30))) if width else (lambda text: text)
    click.echo()
    click.echo(wrapped(f"{number}. {finding.title} ({finding.rule}, {finding.severity}): "
                       f"{stake_text(finding)}", out, indent="   "))
    click.echo(wrapped(f"   Seen: {short(finding.summary)}", out, indent="         "))
    for evidence in finding.evidence:
        click.echo(wrapped(f"     - {short(evidence.place)}: {short(evidence.detail)}", out, indent="       "))
    for label, text in (("Threshold", finding.threshold), ("At stake", finding.stake_basis),
                        ("Fix", finding.fix), ("Source", finding.source)):
        click.echo(wrapped(f"   {label}: {text}", out, indent="     "))


def _as_json(advice: Advice, shown: tuple[Finding, ...]) -> dict[str, object]:
    return {
        "findings": [asdict(f) for f in shown],
        "skipped": [asdict(s) for s in advice.skipped],
        "passed": list(advice.passed),
    }
