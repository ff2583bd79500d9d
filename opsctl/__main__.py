from opsctl.cli import cli

cli()
