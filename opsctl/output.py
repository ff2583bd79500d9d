"""How commands print: JSON to stdout for machines, tables and messages for people.

Every read command takes `--json`; with it, stdout holds exactly one JSON document.
Progress, warnings and hints always go to stderr so they never corrupt that document.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

from rich.console import Console


class _Console(Console):
    """A console whose reader going away (a closed pager, a dropped ssh session) silences it.

    rich's default raises SystemExit there: a restart on a remote node would stop following its
    start at the next progress line, with no health-gated rollback. Now it runs to its end."""

    def on_broken_pipe(self) -> None:
        self.quiet = True


# Tables and reports for people; stdout so they can be piped into a pager or a file.
console = _Console(highlight=False)
# Progress, warnings, hints.
err_console = _Console(stderr=True, highlight=False)


def _default(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return str(value)


def print_json(data: Any) -> None:
    """Write one JSON document to stdout (dataclasses and paths are converted)."""
    sys.stdout.write(json.dumps(data, indent=2, default=_default) + "\n")
    sys.stdout.flush()
