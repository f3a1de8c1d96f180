"""The ``dlprof`` command line: ``main(argv) -> int``, usable in-process and as a program.

Subcommands are imported only when run: ``dlprof --help`` lists them from :data:`COMMANDS`
without loading any, so it starts in the time Python and click take, and a command loads only
what it uses (``dlprof ls`` and ``dlprof info`` read manifests, never Arrow, pandas or an engine).
"""

from __future__ import annotations

import importlib
import sys

import click

from dlprof import __version__
from dlprof.viewers.screen import printable

# Every subcommand: its module under dlprof.cli, and the line ``dlprof --help`` shows for it.
COMMANDS: dict[str, tuple[str, str]] = {
    "calibrate": ("calibrate", "Measure this machine's ceilings and efficiencies as a measured device row."),
    "counters": ("counters", "List the counters dlprof can count on this machine, per backend."),
    "advise": ("advise", "What to change in a program, ranked by the time at stake, with the evidence."),
    "diff": ("diff", "Compare two runs op by op and kernel by kernel; a CI gate on regressions."),
    "estimate": ("estimate", "Predict a run's step and op times on another device."),
    "export": ("export", "Export a run as a trace file (Chrome, Perfetto, TAU, pprof, speedscope)."),
    "finish": ("finish", "Make final the saves a killed run left waiting."),
    "gpu": ("gpu", "Each GPU's busy and idle time per step, what kept it busy, kernels' waits."),
    "import": ("import_traces", "Import trace files (Kineto, Chrome, XPlane) into a run."),
    "info": ("info", "Show what a run is: status, command, times, host, devices, collectors."),
    "ls": ("ls", "List the runs under ./dlprof-runs, newest first."),
    "memory": ("memory", "Peak memory per device and what was live at it, by op, layer or category."),
    "metrics": ("metrics", "Derived metrics (IPC, FLOPs...) from a run's counters."),
    "pprof": ("tau_profile", "A run's flat profile per rank and thread, in TAU's pprof layout."),
    "ranks": ("ranks", "Compare the ranks of a job: compute, communication, idle, stragglers."),
    "report": ("report", "Write a run's report as one HTML file that works offline."),
    "roofline": ("roofline", "Each op, kernel or layer against its device's roofline: bound, % of roof."),
    "run": ("run", "Run a Python script (or -m module) under the profiler."),
    "top": ("top", "The most expensive ops, layers, regions, steps or kernels of a run."),
    "steps": ("steps", "Step-time statistics and where each step's time goes, warm-up left out."),
    "sweep": ("sweep", "Profile a grid of FC, CNN and RNN models on the roofline (ParaDnn)."),
    "tree": ("tree", "Op time down a tree of name scopes, layers or Python code."),
    "tta": ("tta", "Time, steps, samples and epochs to a target accuracy; MLPerf's olympic mean."),
    "tune": ("tune", "Rank a run's kernels by how much tuning them may gain, and why."),
    "view": ("view", "Open a run's timeline in the Perfetto UI (ui.perfetto.dev)."),
}
SUBCOMMANDS = tuple(sorted(COMMANDS))


class _LazyGroup(click.Group):
    """A group whose subcommands are imported when one is run (or its own help asked for)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        command: click.Command = importlib.import_module(f"dlprof.cli.{COMMANDS[cmd_name][0]}").command
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, COMMANDS[name][1]) for name in SUBCOMMANDS])


@click.group(
    cls=_LazyGroup,
    help="dlprof: profile deep-learning programs; see where the time and memory go.\n\n"
    "Start with `dlprof run train.py`, then `dlprof top`.",
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(__version__, prog_name="dlprof")
def cli() -> None:
    pass


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status instead of exiting."""
    from dlprof.cli.common import UsageError
    from dlprof.store.reader import RunError
    from dlprof.store.safe_files import os_error_text

    try:
        result = cli.main(args=argv, prog_name="dlprof", standalone_mode=False)
    except click.exceptions.Exit as done:
        return done.exit_code
    except click.UsageError as error:
        # One line, as every other error: the option at fault and where its help is.
        command = error.ctx.command_path if error.ctx is not None else "dlprof"
        _say(f"{error.format_message()} (see {command} --help)")
        return error.exit_code
    except click.ClickException as error:
        _say(error.format_message())
        return error.exit_code
    except click.exceptions.Abort:
        print("dlprof: aborted", file=sys.stderr)
        return 130
    except (UsageError, RunError) as error:
        _say(str(error))
        return 2
    except OSError as error:
        # The machine's, not the input's: a full disk, a directory that cannot be written.
        _say(os_error_text(error))
        return 1
    return result if isinstance(result, int) else 0


def _say(message: str) -> None:
    """One error line on stderr, whatever the message holds (paths and names from a run or a
    trace: escape sequences and newlines in them are shown, not obeyed)."""
    print(f"dlprof: error: {printable(' '.join(message.splitlines()))}", file=sys.stderr)


def entry() -> None:
    sys.exit(main())
