"""opsctl: operate an SGLang DFlash/DDTree server. Each command group lives in opsctl/commands/."""

from __future__ import annotations

import click

from opsctl import __version__
from opsctl.commands.oom import oom
from opsctl.commands.plan import plan
from opsctl.commands.status import status


@click.group()
@click.version_option(__version__, prog_name="opsctl")
def cli() -> None:
    """Operate an SGLang DFlash/DDTree server: status, restarts, OOM analysis, planning."""


cli.add_command(status)
cli.add_command(oom)
cli.add_command(plan)
