"""`opsctl restart` and `opsctl overrides`: change the tuned values through one safe path.

Exit codes: 0 the engine serves on the new values; 1 the change failed and was rolled back
(the engine serves on the old values again); 2 usage errors, a refusal by the planner, another
change holding the lock, or an interruption before anything changed; 3 the change failed and so
did the rollback, or the restart could not be followed (systemctl or journald failing, Ctrl-C,
SIGTERM once the file was written): the engine may be down, act now (the previous override
file is back in place). A hangup (SIGHUP: the session of `opsctl -H ssh://...` dropped) is not
an interruption: the restart goes on to its end, rollback included, without output, and
`opsctl status` and the history say how it ended.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from collections.abc import Iterator

import click

from opsctl.config import load_config
from opsctl.envfiles import effective_config
from opsctl.oom import read_journal
from opsctl.output import console, err_console, print_json
from opsctl.overrides import TunedValues, validate, values_in_file
from opsctl.restart import (
    PLANNER_JOURNAL_LINES,
    PLANNER_JOURNAL_TIMEOUT_S,
    RestartAbandoned,
    RestartOutcome,
    StartReport,
    Terminated,
    restart,
    signal_handler,
    terminations_unwind,
    usual_start_seconds,
)

EXIT_ROLLED_BACK, EXIT_REFUSED, EXIT_DOWN = 1, 2, 3


class _Progress:
    """One line per phase on stderr; on a terminal, a live line with elapsed time and the estimate."""

    def __init__(self, usual_s: float | None):
        self.usual = f", usually ready after ~{usual_s:.0f} s" if usual_s else ""
        self.phase = None
        self.status = err_console.status("") if err_console.is_terminal else None
        if self.status:
            self.status.start()

    def __call__(self, phase: str, elapsed: float) -> None:
        if self.status:
            self.status.update(f"{phase}: {elapsed:.0f} s{self.usual}")
        elif phase != self.phase:
            err_console.print(f"  {phase} (+{elapsed:.0f} s{self.usual})")
        self.phase = phase

    def stop(self) -> None:
        if self.status:
            self.status.stop()


@contextlib.contextmanager
def _hangups_go_on() -> Iterator[None]:
    """A dropped session (SIGHUP; the terminal `opsctl -H ssh://` gave this opsctl is gone) must
    not stop a restart halfway, with the engine on new values and the file put back: it goes on
    to its end, health gate and rollback included, and prints nothing more (the terminal is gone:
    writing to it would fail)."""
    def silence(_signum, _frame):
        console.quiet = err_console.quiet = True
    with signal_handler((signal.SIGHUP,), silence):
        yield


@contextlib.contextmanager
def _refused_on_error() -> Iterator[None]:
    """A ClickException in the block (a config that cannot be read, the lock held) changed
    nothing: exit 2, refused, never 1, which reads as "rolled back"."""
    try:
        yield
    except click.ClickException as error:
        error.exit_code = EXIT_REFUSED
        raise


def _journal_lines() -> list[str]:
    try:
        return list(read_journal(load_config().unit, last=PLANNER_JOURNAL_LINES,
                                 timeout_s=PLANNER_JOURNAL_TIMEOUT_S))
    except Exception as error:  # noqa: BLE001 - the planner check is skipped, not the restart
        err_console.print(f"planner check skipped: {error}")
        return []


def _explain(report: StartReport) -> None:
    err_console.print(f"[red]{report.reason}[/red] after {report.seconds:.0f} s")
    for incident in report.incidents():
        advice = f" -> {incident.recommendation.action}" if incident.recommendation else ""
        err_console.print(f"  {incident.kind} ({incident.classification}){advice}", soft_wrap=True)
    excerpt = report.excerpt()
    if excerpt:
        err_console.print("  journal:")
        for line in excerpt:
            err_console.print(f"    {line}", soft_wrap=True, markup=False)


def _outcome_json(outcome: RestartOutcome) -> dict:
    def report(r: StartReport | None) -> dict | None:
        if r is None:
            return None
        incidents = [{"kind": i.kind, "classification": i.classification, "phase": i.phase,
                      "tried_bytes": i.tried_bytes, "free_bytes": i.free_bytes} for i in r.incidents()]
        return {"ok": r.ok, "reason": r.reason, "seconds": round(r.seconds, 1), "phase": r.phase,
                "incidents": incidents, "journal_excerpt": r.excerpt()}
    return {"ok": outcome.ok, "rolled_back": outcome.rolled_back, "from": outcome.before, "to": outcome.after,
            "attempt": report(outcome.attempt), "rollback": report(outcome.rollback)}


def run_restart(requested: TunedValues, reason: str, force: bool, budget_s: float | None, wait_lock_s: float,
                json_: bool, replace: bool = False) -> None:
    with _refused_on_error():
        config = load_config()
    validate(requested)  # (before the line below: a refused value is no restart attempt)
    budget = budget_s or config.start_timeout_s
    progress = _Progress(usual_start_seconds(config))
    err_console.print(f"restarting {config.unit} ({reason})")
    try:
        with terminations_unwind((signal.SIGTERM,)), _hangups_go_on():
            outcome = restart(config, requested, reason=reason, force=force, budget_s=budget,
                              wait_lock_s=wait_lock_s, progress=progress, replace=replace,
                              journal_lines=_journal_lines,
                              warn=lambda message: err_console.print(f"[yellow]{message}[/yellow]", soft_wrap=True))
    except RestartAbandoned as error:  # after the override file was written: not "nothing changed"
        progress.stop()
        error.exit_code = EXIT_DOWN
        raise
    except click.ClickException as error:
        progress.stop()
        error.exit_code = EXIT_REFUSED
        raise
    except (KeyboardInterrupt, Terminated) as error:  # (once the file is written they are RestartAbandoned)
        progress.stop()
        err_console.print(f"interrupted ({str(error) or 'Ctrl-C'}) before anything changed")
        sys.exit(EXIT_REFUSED)
    progress.stop()
    if json_:
        print_json(_outcome_json(outcome))
    if outcome.ok:
        err_console.print(f"[green]healthy[/green] on {outcome.after} after {outcome.attempt.seconds:.0f} s")
        return
    _explain(outcome.attempt)
    assert outcome.rollback is not None
    if outcome.rollback.ok:
        err_console.print(f"rolled back to {outcome.before}: healthy again after {outcome.rollback.seconds:.0f} s")
        sys.exit(EXIT_ROLLED_BACK)
    err_console.print("[bold red]the rollback failed too: the engine is down[/bold red]")
    _explain(outcome.rollback)
    sys.exit(EXIT_DOWN)


_common = [
    click.option("--reason", default="operator request", show_default=True, help="Recorded in the history."),
    click.option("--start-budget", "budget_s", type=click.FloatRange(min=1), default=None,
                 help="Seconds the engine gets to become healthy [default: the node's start timeout]."),
    click.option("--wait-lock", "wait_lock_s", type=click.FloatRange(min=0), default=0.0, show_default=True,
                 help="Seconds to wait for another change in progress to finish."),
    click.option("--json", "json_", is_flag=True, help="Print the outcome as JSON."),
]


def common_options(func):
    for option in reversed(_common):
        func = option(func)
    return func


@click.command("restart")
@click.option("--fraction", type=float, help="--mem-fraction-static, strictly between 0 and 1.")
@click.option("--chunked-prefill-size", "chunk", type=int, help="Prefill chunk in tokens (-1: no chunking).")
@click.option("--expandable-segments/--no-expandable-segments", default=None,
              help="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the engine.")
@click.option("--force", is_flag=True, help="Apply values the memory planner refuses.")
@common_options
def restart_command(fraction, chunk, expandable_segments, force, reason, budget_s, wait_lock_s, json_) -> None:
    """Restart the engine, optionally on new tuned values; roll back if it does not come up.

    Values given here are written to the override file (other overrides stay); the restart is
    health-gated and followed in the journal. Exit 0 healthy, 1 rolled back, 2 refused, 3 down.
    """
    run_restart(TunedValues(fraction, chunk, expandable_segments), reason, force, budget_s, wait_lock_s, json_)


@click.group(invoke_without_command=True)
@click.option("--json", "json_", is_flag=True, help="Print the overrides as JSON.")
@click.pass_context
def overrides(ctx: click.Context, json_: bool) -> None:
    """Show opsctl's overrides of the Ansible values (`overrides clear` removes them)."""
    if ctx.invoked_subcommand:
        return
    with _refused_on_error():
        config = load_config()
        effective = effective_config(config.env_file, config.override_env_file)
        overridden = values_in_file(config.override_env_file)
    if json_:
        print_json({"file": str(config.override_env_file), "overrides": overridden,
                    "effective": {s.name: s for s in effective.settings()}})
        return
    active = [s for s in effective.settings() if s.source == "override"]
    if not active:
        console.print(f"no overrides: the values of {config.env_file} are in force")
    for setting in active:
        console.print(f"{setting.name} = {setting.value} (Ansible: {setting.ansible_value})")


@overrides.command("clear")
@click.option("--no-restart", is_flag=True, help="Only rewrite the file; the engine keeps its values until restarted.")
@common_options
def overrides_clear(no_restart, reason, budget_s, wait_lock_s, json_) -> None:
    """Remove every override and restart on the Ansible values (rolled back if that fails)."""
    if no_restart:
        from opsctl.locking import engine_lock
        from opsctl.overrides import render_overrides, write_override_text
        from opsctl.restart import history_file, record_after_change
        from opsctl.state import actor

        with _refused_on_error():
            config = load_config()
            with engine_lock(config.state_dir, f"{actor()}: overrides clear", wait_lock_s):
                try:  # (written atomically: on an error the old file is whole and in force)
                    write_override_text(config.override_env_file,
                                        render_overrides(TunedValues(), config.env_file, actor(), reason))
                except OSError as error:
                    raise click.ClickException(f"cannot write {config.override_env_file} "
                                               f"({error.strerror or error}); nothing was changed") from None
                record_after_change(history_file(config),
                                    {"event": "overrides-clear", "outcome": "written", "actor": actor(),
                                     "reason": reason, "time_written": time.time()},
                                    lambda message: err_console.print(f"[yellow]{message}[/yellow]", soft_wrap=True))
        err_console.print("overrides cleared; restart the engine to apply")
        return
    run_restart(TunedValues(), reason, True, budget_s, wait_lock_s, json_, replace=True)
