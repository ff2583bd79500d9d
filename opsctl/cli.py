"""opsctl: operate an SGLang DFlash/DDTree server. Each command group lives in opsctl/commands/."""

from __future__ import annotations

import sys

import click

from opsctl import __version__, remote
from opsctl.commands.bench import bench
from opsctl.commands.guard import guard
from opsctl.commands.oom import oom
from opsctl.commands.plan import plan
from opsctl.commands.restart import overrides, restart_command
from opsctl.commands.rollout import rollout
from opsctl.commands.status import UNKNOWN, NagiosCommand, status


def _names_a_check(args: list[str]) -> bool:
    """Whether the command in `args` (target options and all) is a Nagios check (`status`,
    `guard status`): a usage error there exits UNKNOWN (3), as the check's own do."""
    command: click.Command = cli
    for arg in args:
        if isinstance(command, click.Group) and arg in command.commands:
            command = command.commands[arg]
    return isinstance(command, NagiosCommand)


class _Cli(click.Group):
    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, list(args), parent=parent, **extra)
        except click.UsageError as error:  # a typo before the command: `opsctl --bogus status`
            if _names_a_check(list(args)):
                error.exit_code = UNKNOWN
            raise


@click.group(cls=_Cli)
@click.version_option(__version__, prog_name="opsctl")
@click.option("-H", "--host", "host", metavar="TARGET",
              help="Run on a node: docker://CONTAINER or ssh://[USER@]HOST[:PORT] (before the command).")
@click.option("-i", "--inventory", metavar="PATH", help="Ansible inventory to find the -l host in.")
@click.option("-l", "--limit", metavar="HOST", help="The inventory host to run on.")
def cli(host: str | None, inventory: str | None, limit: str | None) -> None:
    """Operate an SGLang DFlash/DDTree server: status, restarts, OOM analysis, planning.

    Runs on the node itself, or from an operator's machine with -H or -i/-l, which hand the
    command to the node's opsctl (over `docker exec` or ssh) and return its output and exit code.
    """
    # main() takes the target options before click sees them; any left here would be ignored and
    # the command would run on this machine instead of the node
    if host or inventory or limit:
        raise click.UsageError("give -H / -i / -l before the command, e.g. opsctl -H docker://NODE status")


cli.add_command(status)
cli.add_command(bench)
cli.add_command(oom)
cli.add_command(plan)
cli.add_command(restart_command)
cli.add_command(overrides)
cli.add_command(guard)
cli.add_command(rollout)


def main() -> None:
    """Entry point: hand the command to a node when a target is given, else run it here."""
    try:
        target, rest = remote.split_target_args(sys.argv[1:])
        if target:
            sys.exit(remote.run_remote(target, rest))
    except click.ClickException as error:  # outside click's own handling: show it as click would
        if isinstance(error, click.UsageError) and _names_a_check(sys.argv[1:]):
            error.exit_code = UNKNOWN  # a mistyped target in a monitoring config: not CRITICAL
        error.show()
        sys.exit(error.exit_code)
    cli()
