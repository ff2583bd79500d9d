"""`opsctl guard`: the auto-remediation guard (`run` is what opsctl-guard.service starts).

    opsctl guard status [--json]        state, budget, last step, last config that served
    opsctl guard history [-n N] [--json] the audit log: what it saw, what it changed, the outcome
    opsctl guard pause --reason TEXT    stop acting (it keeps reading the journal)
    opsctl guard resume --reason TEXT   act again; lifts a stop and starts a new hour of budget

Exit codes of `status`: 0 watching, 1 paused or acting, 2 stopped (an alert was raised; paused
as well or not) or not running, 3 never ran on this node, or its files cannot be read (they are root's).
"""

from __future__ import annotations

import functools
import os
import signal
import time
from typing import Any

import click
from rich.table import Table

from opsctl.commands.status import NagiosCommand
from opsctl.config import load_config
from opsctl.guard.state import GuardStore, summary
from opsctl.output import console, err_console, print_json


def reads_root_files(exit_code: int = 1):
    """A command over the guard's files, which are root's: a user who may not read them is told
    so, with the command's exit code for "not known", instead of a traceback (a node config that
    cannot be read gets that code too)."""
    def wrap(command):
        @functools.wraps(command)
        def run(*args, **kwargs):
            try:
                return command(*args, **kwargs)
            except PermissionError as error:
                failure = click.ClickException(f"{error.filename or 'the state folder'}: {error.strerror}; the "
                                               "guard's files are root's: run this as root on the node (sudo opsctl guard ...)")
                failure.exit_code = exit_code
                raise failure from None
            except click.ClickException as error:  # a node config that cannot be read: "not known" too
                error.exit_code = exit_code
                raise
        return run
    return wrap


@click.group()
def guard() -> None:
    """The guard: follows the engine, and on a death it understands, tunes and restarts it."""


@guard.command("run")
def guard_run() -> None:
    """Run the guard in the foreground (opsctl-guard.service runs this)."""
    from opsctl.guard.daemon import Watcher  # late: only the daemon needs it

    os.environ.setdefault("OPSCTL_ACTOR", "opsctl-guard")
    config = load_config()
    watcher = Watcher(config)
    signal.signal(signal.SIGTERM, lambda *_: watcher.stopping.set())
    err_console.print(f"opsctl guard watching {config.unit} (budget {config.guard.budget_per_hour}/h, "
                      f"hang after {config.guard.hang_timeout_s:g} s)")
    watcher.run()


def _values(values: dict[str, Any] | None) -> str:
    if not values:
        return "-"
    return (f"fraction {values['mem_fraction_static']}, chunk {values['chunked_prefill_size']}, "
            f"expandable_segments {values['expandable_segments']}")


@guard.command("status", cls=NagiosCommand)
@click.option("--json", "json_", is_flag=True, help="Print one JSON document.")
@reads_root_files(exit_code=3)
def guard_status(json_: bool) -> None:
    """Show what the guard is doing, its budget, its last step and the last config that served."""
    report = summary(load_config())
    code = {"watching": 0, "acting": 1, "paused": 1, "stopped": 2, "never-ran": 3}.get(report["state"], 2)
    if json_:
        print_json(report | {"exit_code": code})
        raise SystemExit(code)
    if report["state"] == "never-ran":
        console.print("the guard never ran on this node (is opsctl-guard.service installed?)")
        raise SystemExit(code)
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("state", report["state"] + (f": {report['problem']}" if report["problem"] else ""))
    table.add_row("budget", f"{report['budget_left']} remediation(s) left this hour "
                            f"({report['remediations_last_hour']} used, "
                            f"{report['blind_restarts_last_hour']} as-is restart(s))")
    if report["pending"]:
        pending = report["pending"]
        table.add_row("in flight", f"step {pending['id']} {pending['rung']} ({pending['phase']}): {pending['why']}")
    if report["last_step"]:
        last = report["last_step"]
        table.add_row("last step", f"#{last['id']} {last['rung']} -> {last['outcome']} at "
                                   f"{time.strftime('%H:%M:%S', time.localtime(last['at']))}: "
                                   f"{_values(last['from'])} => {_values(last['to'])}")
    last_good = report["last_good"]
    table.add_row("last good", _values(last_good["values"]) if last_good else "-")
    console.print(table, soft_wrap=True)
    raise SystemExit(code)


def _describe(record: dict[str, Any]) -> str:
    event = record["event"]
    step = f"#{record['step_id']} " if "step_id" in record else ""
    if event == "incident":
        return f"saw {record['kind']} ({record['cause']}): {record.get('detail', '')[:160]}"
    if event == "decision":
        return f"{step}{record['rung']}: {record['why']} [{_values(record['from'])} => {_values(record['to'])}]"
    if event == "action":
        return f"{step}restarting (attempt {record.get('attempt')}): {record.get('systemd', '')}"
    if event == "outcome":
        secs = f", engine start {record['start_seconds']} s" if record.get("start_seconds") is not None else ""
        return f"{step}{record['outcome']}: {record['why']}{secs}"
    if event == "stopped":
        return f"STOPPED: {record['reason']} (alert {record['alert_id']})"
    fields = {k: v for k, v in record.items() if k not in ("event", "time", "epoch", "actor")}
    return ", ".join(f"{k}={v}" for k, v in fields.items())[:200]


@guard.command("history")
@click.option("-n", "--last", "last", type=click.IntRange(min=1), default=50, show_default=True,
              help="How many of the latest records to show.")
@click.option("--json", "json_", is_flag=True, help="Print the records as a JSON list.")
@reads_root_files()
def guard_history(last: int, json_: bool) -> None:
    """Show the guard's audit log: incidents, decisions, actions, outcomes, stops."""
    records = GuardStore.for_config(load_config()).records()[-last:]
    if json_:
        print_json(records)
        return
    if not records:
        console.print("no guard records on this node")
    for record in records:
        console.print(f"{record['time']} {record['event']:<13} {_describe(record)}", soft_wrap=True, markup=False)


@guard.command("pause")
@click.option("--reason", required=True, help="Why (recorded in the audit log and shown by status).")
@reads_root_files()
def guard_pause(reason: str) -> None:
    """Stop the guard from acting until `opsctl guard resume` (it keeps running)."""
    if GuardStore.for_config(load_config()).pause(reason):
        err_console.print("guard paused: it will not act until `opsctl guard resume`")
    else:
        err_console.print("the guard was already paused")


@guard.command("resume")
@click.option("--reason", default="operator resume", show_default=True, help="Recorded in the audit log.")
@click.option("--pause-only", is_flag=True,
              help="Lift only a pause: a stop and the spent budget stay (what a rollout that paused the guard uses).")
@reads_root_files()
def guard_resume(reason: str, pause_only: bool) -> None:
    """Let the guard act again: lifts a pause or a stop and starts a new hour of budget."""
    before = GuardStore.for_config(load_config()).resume(reason, pause_only=pause_only)
    lifted = [name for name, value in before.items() if value]
    err_console.print(f"guard resumed ({', '.join(lifted) + ' lifted' if lifted else 'it was not paused or stopped'})")
