"""Change the tuned values and restart the engine, health-gated, with rollback.

The one path every engine change takes (`opsctl restart`, `opsctl overrides clear`, the guard):
validate, take the engine lock, write the override file atomically, restart, follow the journal
until the unit is active (its ExecStartPost waits for /health) or the engine dies or misses its
budget; on failure put the previous override file back, restart and verify. Every step is
appended to the history file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

import click

from opsctl import journal, oom, planner
from opsctl.config import NodeConfig
from opsctl.locking import engine_lock
from opsctl.model_shapes import preset
from opsctl.overrides import (
    TunedValues,
    read_override_text,
    render_overrides,
    validate,
    values_in,
    values_in_file,
    write_override_text,
)
from opsctl.render import parse_env_file
from opsctl.state import actor, append_record, read_records
from opsctl.systemd import unit_state

# Journal markers of the startup phases, in order (SGLang's own lines).
PHASES = [
    ("Load weight begin", "loading weights"),
    ("KV Cache is allocated", "allocating the KV pool"),
    ("graph begin", "capturing CUDA graphs"),
    ("The server is fired up", "ready"),
]
# Lines after which the engine is dead, whatever systemd says yet.
FATAL_MARKERS = ("Scheduler hit an exception", "Received sigquit", "SIGQUIT received",
                 "error: unrecognized arguments", "error: ambiguous option", "error: argument",
                 "Loaded weights leave no GPU memory")


# The planner check calibrates from the engine's last start in the journal: the unit's latest
# lines are enough (a day of SGLang's decode logs is well under this), and a slow journal must not
# hold a restart (or the guard) up.
PLANNER_JOURNAL_LINES = 200_000
PLANNER_JOURNAL_TIMEOUT_S = 60


def history_file(config: NodeConfig) -> Path:
    return config.state_dir / "history.jsonl"


@dataclasses.dataclass
class StartReport:
    ok: bool
    reason: str
    seconds: float
    phase: str
    journal: list[str]

    def incidents(self) -> list[oom.Incident]:
        return oom.analyze(self.journal)

    def excerpt(self, after: int = 40) -> list[str]:
        """The journal lines that explain a failure: from the first fatal line on, else the last ones."""
        first = next((i for i, line in enumerate(self.journal) if any(m in line for m in FATAL_MARKERS)), None)
        if first is None:
            return self.journal[-15:]
        return self.journal[max(0, first - 3):first + after]


@dataclasses.dataclass
class RestartOutcome:
    ok: bool
    rolled_back: bool
    attempt: StartReport
    rollback: StartReport | None
    before: TunedValues
    after: TunedValues


ProgressCallback = Callable[[str, float], None]


def usual_start_seconds(config: NodeConfig) -> float | None:
    """The median of earlier successful starts on this node, for the progress estimate."""
    try:
        records = read_records(history_file(config))
    except OSError:  # (a user who may not read the history: the estimate is a nicety)
        return None
    durations = [r["start_seconds"] for r in records if r.get("outcome") == "ok" and r.get("start_seconds")]
    return statistics.median(durations[-10:]) if durations else None


def _systemctl(*args: str) -> None:
    # (its own session: a hangup of opsctl's terminal, which a restart outlives, must not kill it)
    result = subprocess.run(["systemctl", *args], capture_output=True, text=True, check=False, timeout=30,
                            start_new_session=True)
    if result.returncode != 0:
        raise click.ClickException(f"systemctl {' '.join(args)} failed: {result.stderr.strip()}")


# SGLang's launcher logs this once the scheduler's traceback is complete, then kills its tree.
CRASH_END_MARKERS = ("It usually means the child failed", "It usually means one child failed")


def _rest_of_crash(read: Callable[[], list[str]], so_far: list[str], wait_s: float = 5.0) -> list[str]:
    """The traceback's remaining lines: read until the launcher's SIGQUIT line (or `wait_s`)."""
    lines: list[str] = []
    deadline = time.monotonic() + wait_s
    while not any(marker in line for line in so_far + lines for marker in CRASH_END_MARKERS):
        if time.monotonic() > deadline:
            return lines
        time.sleep(0.2)
        lines.extend(read())
    time.sleep(0.3)  # the last lines journald has not handed over yet
    return lines + read()


def _late_lines(read: Callable[[], list[str]], polls: int = 8, every_s: float = 0.25) -> list[str]:
    """Lines a dead run still has in flight: `polls` reads, or fewer when a fatal line arrives."""
    lines: list[str] = []
    for _ in range(polls):
        time.sleep(every_s)
        lines.extend(read())
        if any(marker in line for line in lines for marker in FATAL_MARKERS):
            break
    return lines


def start_and_wait(config: NodeConfig, budget_s: float, progress: ProgressCallback) -> StartReport:
    """Restart the unit and follow it until it serves, dies, or misses `budget_s`."""
    started = time.monotonic()
    seen: list[str] = []
    phase = "stopping"
    with journal.JournalFollower(config.unit, journal.cursor(config.unit)) as follower:
        # `restart --no-block` only queues the job: until systemd runs it, the unit may still be
        # the old run, active. Only a new run (a new InvocationID) that is active has passed the
        # health gate on the new files.
        old_run = unit_state(config.unit).invocation

        def new_run_lines() -> list[str]:
            # The old run's last lines (its stop, or a crash of its own as the restart began)
            # say nothing about the new files: a fatal line of theirs must not fail this start.
            return [entry.text for entry in follower.new_entries() if not old_run or entry.invocation != old_run]
        # A crash loop may have hit the unit's start limit; an explicit restart starts afresh.
        _systemctl("reset-failed", config.unit)
        _systemctl("restart", "--no-block", config.unit)
        baseline = None

        def crash_in(batch: list[str], elapsed: float) -> StartReport | None:
            """Follow the phase through `batch`; the crash report when it holds a fatal line."""
            nonlocal phase
            for index, line in enumerate(batch):
                phase = next((name for marker, name in PHASES if marker in line), phase)
                if any(marker in line for marker in FATAL_MARKERS):
                    seen.extend(batch)  # the traceback often arrives in the same batch
                    seen.extend(_rest_of_crash(new_run_lines, batch[index:]))
                    return StartReport(False, f"the engine crashed while {phase}", elapsed, phase, seen)
            seen.extend(batch)
            return None

        while True:
            elapsed = time.monotonic() - started
            if report := crash_in(new_run_lines(), elapsed):
                return report
            state = unit_state(config.unit)
            new_run = state.invocation != old_run or not state.invocation  # (no ID: a systemd without them)
            if baseline is None and new_run and state.active_state in ("activating", "active"):
                baseline = state.restarts
            if state.active_state == "active" and new_run:
                # Active means the ExecStartPost health gate passed.
                return StartReport(True, "healthy", elapsed, "ready", seen)
            # (states are judged once no job is queued: see UnitState.settled)
            if state.settled and not new_run and state.active_state in ("failed", "inactive"):
                # the job ended without a new run: its start limit, a dependency that failed
                return StartReport(False, f"systemd did not start the engine (result: {state.result or 'none'}); "
                                   f"see `systemctl status {config.unit}`", elapsed, phase, seen)
            # A new run that is dead died before it was healthy (systemd only retries it after
            # RestartSec); an old run in auto-restart is not this start's.
            died = state.dead and (new_run or state.active_state == "failed")
            if died or (baseline is not None and state.restarts > baseline):
                # systemd can report the death before journald hands over the run's last lines:
                # a crash among them names the cause better than the exit status does.
                if report := crash_in(_late_lines(new_run_lines), elapsed):
                    return report
                return StartReport(False, f"the engine exited (status {state.exit_status}) while {phase}",
                                   elapsed, phase, seen)
            if elapsed > budget_s:
                return StartReport(False, f"not healthy within the {budget_s:.0f} s start budget ({phase})",
                                   elapsed, phase, seen)
            progress(phase, elapsed)
            time.sleep(0.25)


def node_plan_inputs(config: NodeConfig, journal_lines: list[str]) -> planner.PlanInputs | None:
    """The planner calibrated from this node's own engine starts, or None when it never logged one."""
    base = planner.PlanInputs(gpu=planner.GpuSpec(total_gib=94.97), shape=preset(config.model_preset),
                              weights_gib=0.0, tp=8)
    try:
        return planner.calibrate_from_log(journal_lines, base)
    except planner.PlanError:
        return None


@dataclasses.dataclass(frozen=True)
class PlanVerdict:
    """What the planner says of one set of tuned values: the KV pool against the context target,
    and the headroom against the prefill spike (None where it cannot judge)."""
    tokens: int | None
    spike_margin_bytes: float | None
    problems: tuple[str, ...]


def judge_plan(config: NodeConfig, target: TunedValues, inputs: planner.PlanInputs | None) -> PlanVerdict:
    if inputs is None or target.mem_fraction_static is None:
        return PlanVerdict(None, None, ())
    problems = []
    fraction = target.mem_fraction_static
    tokens = planner.max_total_num_tokens(fraction, inputs)
    if tokens < config.context_target:
        lowest = planner.lowest_fraction_for(config.context_target, inputs)
        problems.append(f"at {fraction} the KV pool holds {tokens:,} tokens, {tokens / config.context_target:.1%} "
                        f"of the {config.context_target:,}-token target"
                        + (f"; the lowest fraction that holds it is {lowest:.3f}" if lowest else ""))
    chunk, margin = target.chunked_prefill_size, None
    if chunk and chunk > 0:
        expandable = bool(target.expandable_segments)
        headroom = planner.headroom_bytes(fraction, inputs)
        spike = planner.required_headroom_bytes(chunk, inputs, expandable=expandable)
        margin = headroom - spike
        if not planner.is_safe(fraction, chunk, inputs, expandable=expandable):
            problems.append(f"at {fraction} the headroom is {headroom / 2**30:.2f} GiB, less than the "
                            f"{spike / 2**30:.2f} GiB a {chunk}-token prefill chunk needs; use a smaller chunk "
                            "or a lower fraction")
    return PlanVerdict(tokens, margin, tuple(problems))


def _takes_headroom(before: TunedValues, after: TunedValues) -> bool:
    """Whether a change can make the prefill spike outgrow its headroom: a higher fraction, a
    larger chunk (or none: -1), expandable segments off. A value newly set counts as a rise (the
    engine's default was in force). Lowering any of them only gives headroom back."""
    def rises(old, new, *, unbounded=None) -> bool:
        if new is None or new == old:
            return False
        if old is None or new == unbounded:
            return True
        return old != unbounded and new > old
    return (rises(before.mem_fraction_static, after.mem_fraction_static)
            or rises(before.chunked_prefill_size, after.chunked_prefill_size, unbounded=-1)
            or (before.expandable_segments is not False and after.expandable_segments is False))


def check_plan(config: NodeConfig, before: TunedValues, after: TunedValues,
               inputs: planner.PlanInputs | None) -> tuple[list[str], list[str]]:
    """(refusals, warnings) for a change from `before` to `after`.

    The planner refuses a change that makes the KV pool smaller or the prefill margin thinner
    and leaves a problem; a problem the node already has, and that the change does not worsen, is
    only a warning: a plain restart of a hung engine, or a smaller chunk, must not be refused
    for a fraction nobody is changing."""
    now, then = judge_plan(config, before, inputs), judge_plan(config, after, inputs)
    if not then.problems:
        return [], []
    worse_pool = then.tokens is not None and then.tokens < config.context_target and (
        now.tokens is None or then.tokens < now.tokens)
    worse_margin = then.spike_margin_bytes is not None and then.spike_margin_bytes < 0 and (
        now.spike_margin_bytes is None or then.spike_margin_bytes < now.spike_margin_bytes)
    return (list(then.problems), []) if worse_pool or worse_margin else ([], list(then.problems))


class RestartAbandoned(click.ClickException):
    """The restart stopped after the new override file was written: that file is back as it was."""


class Terminated(BaseException):
    """SIGTERM (or, for a rollout, SIGHUP) during a restart: unwinds like Ctrl-C, so the
    previous override file is put back and the history says so."""


@contextlib.contextmanager
def signal_handler(signums: tuple[int, ...], handler: Callable) -> Iterator[dict]:
    """`handler` for `signums` during the block, the handlers before it back after; yields those."""
    previous = {sig: signal.signal(sig, handler) for sig in signums}
    try:
        yield previous
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def terminations_unwind(signums: tuple[int, ...] = (signal.SIGTERM, signal.SIGHUP)) -> Iterator[None]:
    """Turn `signums` into `Terminated` for the block (their default ends the process at once,
    leaving the new override file and no outcome in the history)."""
    def unwind(signum, _frame):
        raise Terminated(signal.Signals(signum).name)
    with signal_handler(signums, unwind):
        yield


@contextlib.contextmanager
def signals_deferred(swallow: bool = False) -> Iterator[None]:
    """Hold Ctrl-C, SIGTERM and SIGHUP off a short step that must finish once begun (writing or
    restoring the override file, recording an outcome), then hand each to the handler that was in
    place: the CLI's turn them into KeyboardInterrupt / Terminated, the guard's sets its stop flag.
    `swallow`: the step is part of an unwinding already (an abandon, a last record), so what
    those handlers raise is dropped. A second Ctrl-C during a rollback's write must not leave the
    failed values in the file."""
    if threading.current_thread() is not threading.main_thread():  # (signals reach the main thread only)
        yield
        return
    caught: list[int] = []
    previous: dict = {}
    try:
        with signal_handler((signal.SIGINT, signal.SIGTERM, signal.SIGHUP),
                            lambda signum, _frame: caught.append(signum)) as previous:
            yield
    finally:
        raised: BaseException | None = None
        for signum in caught:  # every one reaches its handler; the first that raises is raised after
            handler = previous[signum]
            if handler == signal.SIG_DFL:
                signal.raise_signal(signum)  # (its default: the process ends, the step done)
            elif callable(handler):
                try:
                    handler(signum, None)
                except (KeyboardInterrupt, Terminated) as error:
                    raised = raised or error
        if raised is not None and not swallow:
            raise raised


def _why(error: BaseException) -> str:
    if isinstance(error, KeyboardInterrupt):
        return "interrupted"
    if isinstance(error, Terminated):
        return f"terminated by {error}"
    return f"{type(error).__name__}: {error}"


def record_after_change(history: Path, record: dict, warn: Callable[[str], None]) -> None:
    """Append to the history once the override file may have changed. A history that cannot be
    written (a full or read-only disk) must neither stop a rollback nor turn its outcome into a
    traceback: the outcome stands, and the operator is told what the history misses."""
    try:
        append_record(history, record)
    except OSError as error:
        warn(f"could not record the {record['event']} ({record['outcome']}) in {history} "
             f"({error.strerror or error}): the history misses it")


def _abandon(config: NodeConfig, old_text: str, change: dict, error: BaseException,
             warn: Callable[[str], None]) -> NoReturn:
    """Put the previous override file back and record why, when a restart cannot be followed to its
    end. No second start: the unit runs what systemd last started (the new values, if the restart
    went through) until its next start, which reads the restored file. Any cause, a SystemExit
    of an output whose reader went away included, ends as RestartAbandoned (exit 3)."""
    why = _why(error)
    with signals_deferred(swallow=True):
        try:
            write_override_text(config.override_env_file, old_text)
            restored = None
        except OSError as write_error:
            restored = write_error.strerror or str(write_error)
        record_after_change(history_file(config), {"event": "restart", "outcome": "abandoned", "why": why,
                                       "override_restored": restored is None, **change}, warn)
    where = ("the previous override file is restored, but the engine may run the new values until its next start"
             if restored is None else
             f"{config.override_env_file} could not be put back ({restored}) and holds the new values: write it "
             "back (the history's `from` has the previous values) before the engine's next start")
    raise RestartAbandoned(
        f"the restart could not be followed ({why}); {where}. Check `systemctl status {config.unit}` and run "
        "`opsctl status`; restart again once the cause is fixed") from error


def restart(config: NodeConfig, requested: TunedValues, *, reason: str, force: bool, budget_s: float,
            wait_lock_s: float, progress: ProgressCallback, replace: bool = False,
            journal_lines: Callable[[], list[str]] = lambda: [], rollback_text: str | None = None,
            warn: Callable[[str], None] = lambda _message: None) -> RestartOutcome:
    """Apply `requested` over the current overrides (or instead of them with `replace`) and restart.

    A failed start rolls back to the override file as it is now, or to `rollback_text`: the guard
    passes the file as it was before a step that a kill interrupted after writing it."""
    validate(requested)
    ansible = values_in_file(config.env_file)
    with engine_lock(config.state_dir, f"{actor()}: restart", wait_lock_s):
        old_text = read_override_text(config.override_env_file) if rollback_text is None else rollback_text
        current = values_in(parse_env_file(old_text), str(config.override_env_file))
        overrides = requested if replace else requested.merged_over(current)
        before, after = current.merged_over(ansible), overrides.merged_over(ansible)
        if not force:
            inputs = node_plan_inputs(config, journal_lines())
            if inputs is None and _takes_headroom(before, after):
                # Unchecked is not safe: the seed's 0.94 crashed on its first long prefill.
                raise click.ClickException(
                    f"the planner cannot check this change: no engine start in {config.unit}'s journal "
                    "logged its KV pool (a new node, a rotated journal, or a journal that could not be "
                    "read). Start the engine on its current values first (`opsctl restart`), or pass "
                    "--force to apply the change unchecked.")
            refusals, warnings = check_plan(config, before, after, inputs)
            if refusals:
                raise click.ClickException("the planner refuses this change: " + "; ".join(refusals)
                                           + ". Pass --force to apply it anyway.")
            for warning in warnings:
                warn(f"the planner warns (the values in force already have this; not refused): {warning}")
        history = history_file(config)
        change = {"actor": actor(), "reason": reason, "from": dataclasses.asdict(before),
                  "to": dataclasses.asdict(after)}
        try:  # (no change goes unrecorded: a history that cannot be written refuses it)
            append_record(history, {"event": "restart", "outcome": "started", **change})
        except OSError as error:
            raise click.ClickException(f"cannot record the change in {history} ({error.strerror or error}): nothing "
                                       f"was changed; free space in {history.parent} (or remount it read-write) "
                                       "and retry") from None
        try:
            with signals_deferred():
                write_override_text(config.override_env_file,
                                    render_overrides(overrides, config.env_file, actor(), reason))
        except OSError as error:  # written atomically: the old file is still whole and in force
            record_after_change(history, {"event": "restart", "outcome": "refused", "why": str(error), **change}, warn)
            raise click.ClickException(f"cannot write {config.override_env_file} ({error.strerror}); nothing was "
                                       "changed and the engine was not restarted") from None
        except BaseException as error:  # a Ctrl-C held off while the file was written
            _abandon(config, old_text, change, error, warn)
        try:
            attempt = start_and_wait(config, budget_s, progress)
        except BaseException as error:  # systemctl or journald failing, a timeout, Ctrl-C, SIGTERM, SystemExit
            _abandon(config, old_text, change, error, warn)
        if attempt.ok:
            with signals_deferred(swallow=True):  # (it serves on the new values: a late Ctrl-C changes nothing)
                record_after_change(history, {"event": "restart", "outcome": "ok",
                                  "start_seconds": round(attempt.seconds, 1), **change}, warn)
            return RestartOutcome(True, False, attempt, None, before, after)

        # Roll back: the previous override file, byte for byte, then the same health-gated start.
        restored = False
        try:
            with signals_deferred():
                write_override_text(config.override_env_file, old_text)
                restored = True
                record_after_change(history, {"event": "restart", "outcome": "failed", "why": attempt.reason,
                                  "journal": attempt.journal[-40:], **change}, warn)
            rollback = start_and_wait(config, budget_s, progress)
        except BaseException as error:
            why = _why(error)
            with signals_deferred(swallow=True):
                record_after_change(history, {"event": "rollback", "outcome": "abandoned", "why": why, "actor": actor(),
                                  "override_restored": restored, "to": dataclasses.asdict(before)}, warn)
            where = ("the previous override file is in place" if restored else
                     f"{config.override_env_file} could not be put back and still holds the failed values: write "
                     "it back (the history's `from` has the values) before the engine's next start")
            raise RestartAbandoned(
                f"{attempt.reason}, and the rollback's start could not be followed ({why}); {where}. Check "
                f"`systemctl status {config.unit}` and run `opsctl status`: the engine may be down") from error
        with signals_deferred(swallow=True):
            record_after_change(history, {"event": "rollback", "outcome": "ok" if rollback.ok else "failed",
                              "why": rollback.reason, "start_seconds": round(rollback.seconds, 1),
                              "actor": actor(), "to": dataclasses.asdict(before)}, warn)
        return RestartOutcome(False, True, attempt, rollback, before, after)
