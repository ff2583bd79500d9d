"""The guard's loop: follow the engine's journal and unit, probe /health_generate, remediate.

One loop, every `TICK_S`:

1. Control: paused or stopped (state file) -> read and drop the journal, do nothing; back to
   watching -> resync. Another engine change holds the engine lock (`opsctl restart`) -> stand
   by, then resync. A resync primes a fresh scanner on the unit's recent journal, so it knows
   whether the engine is starting or serving.
2. Journal: feed new lines to the same `OomScanner` `opsctl oom` uses. A fatal line (SGLang's
   "Scheduler hit an exception", the launcher's SIGQUIT line, ...) or a unit that died
   (`UnitState.dead`, NRestarts grew) starts a death; it is decided as soon as the scanner
   completes the incident (at the SIGQUIT line) or after `CLASSIFY_GRACE_S`. A run that systemd
   stopped on request (`systemctl stop`: `systemd.stop_requested`) did not die, however it ended
   (past `docker stop`'s grace: killed, 137, unit "failed"): audited once, not acted on.
3. Hang: /health_generate failing for `hang_timeout_s` (probe thread, `policy.HangDetector`)
   while the scheduler logs no batch for as long; failing probes beside logged batches are
   audited once as "busy-not-hung".
4. A death or a hang goes to `policy.decide`; the step runs through `opsctl.restart.restart`
   (engine lock, atomic override, reset-failed + restart, health gate, rollback), so it supersedes
   the restart systemd's `Restart=always` may have scheduled on the old config; the audit log says
   which state the unit was in when the guard acted.

Everything the loop touches on the node sits behind `SystemNode`, so tests drive `Guard` with fakes.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, Protocol

import click
import httpx

from opsctl import journal, locking, oom, planner
from opsctl.config import NodeConfig
from opsctl.guard import policy
from opsctl.guard.alert import raise_alert
from opsctl.guard.state import ACTING, STOPPED, WATCHING, GuardStore, held, unalerted_damage, values_dict, values_from
from opsctl.overrides import TunedValues, read_override_text, values_in_force
from opsctl.restart import (
    FATAL_MARKERS,
    PLANNER_JOURNAL_LINES,
    PLANNER_JOURNAL_TIMEOUT_S,
    history_file,
    node_plan_inputs,
    restart,
)
from opsctl.startup_log import EngineConfig
from opsctl.state import read_records
from opsctl.systemd import UnitState, stop_requested, unit_state

TICK_S = 0.2
# The state file's heartbeat: from its own thread, so that it goes on while a step runs (minutes);
# `opsctl status` takes a beat older than 30 s for a dead guard.
HEARTBEAT_S = 2.0
# Incidents kept while no death is being decided.
INCIDENTS_KEPT = 100
# After a fatal line, how long to wait for the rest of the traceback before deciding anyway.
CLASSIFY_GRACE_S = 1.5
# Deaths that say the tuned values do not fit this node: a config a step tried that died of one
# is passed over by later steps (until it is seen serving, or `guard resume`).
CONFIG_CAUSES = (oom.ACTIVATION_SPIKE, oom.FRAGMENTATION, oom.STARTUP, oom.KV_POOL)
# SGLang 0.5.23 (kv_cache_configurator.py): "Raise --mem-fraction-static above 0.942 (minimum viable =
# 1 - available/pre = 0.9411)". It needs a fraction strictly above the minimum; the value it names
# is the minimum rounded up to 0.001.
_RAISE_ABOVE = re.compile(r"Raise --mem-fraction-static above (\d+\.\d+)(?: \(minimum viable = [^=]*= (\d+\.\d+))?")


@dataclasses.dataclass
class ApplyResult:
    """What one restart through `opsctl.restart.restart` gave."""

    ok: bool
    outcome: str  # ok | rolled_back | down | deferred | error
    why: str
    start_seconds: float | None = None
    death: policy.Death | None = None  # why the attempt died, when it did
    journal_tail: list[str] = dataclasses.field(default_factory=list)


class Node(Protocol):
    """What the guard needs from the node (`SystemNode` on a real one, fakes in tests)."""

    def effective(self) -> TunedValues: ...
    def unit(self) -> UnitState: ...
    def lock_holder(self) -> str | None: ...
    def apply(self, values: TunedValues, reason: str, rollback_text: str | None = None) -> ApplyResult: ...
    def override_text(self) -> str: ...
    def lowest_fraction(self) -> float | None: ...
    def wait_settled(self, budget_s: float) -> bool: ...
    def runs(self, values: TunedValues) -> bool: ...
    def failed_start(self, step_id: int, since: float) -> dict[str, Any] | None: ...


def death_from(incidents: list[oom.Incident]) -> policy.Death:
    """The cause of a death from the incidents around it: a memory cause beats a bare kill."""
    rank = {oom.ACTIVATION_SPIKE: 0, oom.FRAGMENTATION: 0, oom.STARTUP: 0, oom.WEIGHTS_LOAD: 0, oom.NOT_MEMORY: 1,
            oom.HOST_MEMORY: 2, oom.KV_POOL: 3, oom.UNKNOWN: 4}
    fatal = [i for i in incidents if i.kind != "kv_pool_full"] or incidents
    if not fatal:
        return policy.Death(policy.NO_CAUSE, "exited", "the engine exited with no cause in its journal")
    best = min(fatal, key=lambda i: (rank.get(i.classification, 5), -fatal.index(i)))
    raise_to = None
    if (m := _RAISE_ABOVE.search(" ".join(best.lines + [best.detail]))) is not None:
        raise_to = float(m[1])
        if m[2] is not None and float(m[2]) >= raise_to:  # the minimum was the named value itself (to 0.0001)
            raise_to = round(raise_to + 0.001, 3)
    return policy.Death(best.classification, best.kind, best.detail[:300], raise_to)


class Guard:
    def __init__(self, config: NodeConfig, node: Node, store: GuardStore, *,
                 alert: Callable[..., dict[str, Any]] = raise_alert,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep):
        self.config = config
        self.limits = config.guard
        self.node = node
        self.store = store
        self.alert = alert
        self.clock = clock
        self.sleep = sleep

    # -- the step lifecycle --------------------------------------------------------------------
    def on_death(self, death: policy.Death, seen: dict[str, Any]) -> None:
        """Decide about one death (or hang) and carry the step out; retries while the engine stays down."""
        current = policy.complete(self.node.effective())
        self.store.audit("incident", cause=death.cause, kind=death.kind, detail=death.detail,
                         config=values_dict(current), **seen)
        while True:
            state = self.store.load()
            now = self.clock()
            step = policy.decide(death, current, self.limits, lowest_fraction=self.node.lowest_fraction,
                                 blind_restarts_last_hour=len(policy.in_last_hour(state["blind_restarts"], now)),
                                 failed=[values_from(v) for v in state["failed"]])
            if step.action == policy.STOP:
                self._decided_stop(step.why, death)
                return
            if policy.budget_left(state["remediations"], now, self.limits) <= 0:
                self._decided_stop(f"the remediation budget is spent ({self.limits.budget_per_hour} an hour); "
                                   f"the next step would have been: {step.why}", death)
                return
            wait = policy.backoff_s(state["remediations"], now, self.limits)
            if wait > 0:
                self.store.audit("backoff", seconds=round(wait, 1), next_step=step.why)
                self.sleep(wait)
                if self._overtaken(current):
                    return
            result = self.carry_out(step, death, current)
            if result.outcome in ("ok", "deferred"):
                return
            if result.outcome == "rolled_back":
                return  # the engine serves on the previous config; the next death moves further
            # Down: the step and its rollback both failed. Decide again from what the attempt showed.
            current = policy.complete(self.node.effective())
            if result.death is not None and result.death.cause != policy.NO_CAUSE:
                death = result.death
            if death.cause not in (policy.HANG, policy.NO_CAUSE, oom.NOT_MEMORY, oom.HOST_MEMORY, oom.KV_POOL,
                                   oom.WEIGHTS_LOAD):
                continue
            # An unknown cause that keeps the engine down: retry as-is within the budget (a crash
            # loop), not counted against the as-is limit, which is for an engine that served.
            death = dataclasses.replace(death, kind=death.kind or "crash loop")
            state = self.store.load()
            if policy.budget_left(state["remediations"], self.clock(), self.limits) <= 0:
                self._decided_stop(f"crash loop: the engine does not come up on {self._words(current)} and the "
                                   f"remediation budget is spent ({self.limits.budget_per_hour} an hour)", death)
                return
            wait = policy.backoff_s(state["remediations"], self.clock(), self.limits)
            self.store.audit("backoff", seconds=round(wait, 1), next_step="restart as-is (the engine is down)")
            self.sleep(wait)
            if self._overtaken(current):
                return
            step = policy.Step(policy.RESTART, policy.AS_IS, current, "the engine is still down: restart as-is")
            result = self.carry_out(step, death, current, blind=False)
            if result.outcome in ("ok", "deferred", "rolled_back"):
                return

    def _decided_stop(self, reason: str, death: policy.Death) -> None:
        """Stop (and alert) on a verdict about a death, unless a pause came while it was decided:
        as for a step, the pause wins and the verdict is dropped. A rollout pauses the guard around
        its own restart and lifts only its pause afterwards (`resume --pause-only`); a stop made
        meanwhile outlived it, on a verdict about the config the rollout replaced."""
        why = held(self.store.load())
        if why is not None:
            self.store.audit("deferred", why=why, dropped_stop=reason)
            return
        self.stop(reason, death)

    def _why_not_act(self, decided_on: TunedValues, meanwhile: str, also: TunedValues | None = None) -> str | None:
        """Why a step decided on `decided_on` must not run now, or None: the guard was paused or
        stopped, another change holds the lock (it decides the engine's fate), or the config in
        force is neither `decided_on` nor `also` (an operator's restart or `overrides clear`
        `meanwhile`: the step would overwrite it)."""
        why = held(self.store.load())
        if why is None and (holder := self.node.lock_holder()):
            why = f"an engine change started {meanwhile} ({holder}); it decides the engine's fate"
        if why is None and (now_in_force := policy.complete(self.node.effective())) not in (decided_on, also):
            why = (f"the config changed {meanwhile} ({self._words(decided_on)} -> "
                   f"{self._words(now_in_force)}); the step decided on the old one is dropped")
        return why

    def _overtaken(self, decided_on: TunedValues) -> bool:
        """After a backoff: True (and audited) when the step must not run any more (`_why_not_act`)."""
        why = self._why_not_act(decided_on, "during the backoff")
        if why is not None:
            self.store.audit("deferred", why=why)
        return why is not None

    def carry_out(self, step: policy.Step, death: policy.Death, current: TunedValues,
                  blind: bool | None = None) -> ApplyResult:
        """Record the step (state, then audit), then act."""
        now = self.clock()
        blind = step.rung == policy.AS_IS if blind is None else blind
        with self.store.update() as state:
            # a pause (an operator's, or a rollout's) that came while the step was being decided
            # wins: checked under the state file's lock, where `guard pause` writes it
            why = held(state)
            if why is None:
                step_id = state["next_id"]
                state["next_id"] = step_id + 1
                state["status"] = ACTING
                state["remediations"].append(now)
                if blind:
                    state["blind_restarts"].append(now)
                # (the override file as it is before the step: a guard killed after the step wrote its
                # file rolls back to this, not to the step's own values, when it finishes the step)
                state["pending"] = {"id": step_id, "phase": "decided", "action": step.action, "rung": step.rung,
                                    "why": step.why, "death": dataclasses.asdict(death), "from": values_dict(current),
                                    "to": values_dict(step.to), "decided_at": now, "attempts": 0, "blind": blind,
                                    "override_before": self.node.override_text()}
                pending = dict(state["pending"])
        if why is not None:
            self.store.audit("deferred", why=why, dropped_step=step.why)
            return ApplyResult(False, "deferred", f"{why}; the step decided meanwhile was dropped")
        self._audit_decision(pending)
        return self._act(pending)

    def _audit_decision(self, pending: dict[str, Any], **extra: Any) -> None:
        self.store.audit("decision", step_id=pending["id"], action=pending["action"], rung=pending["rung"],
                         why=pending["why"], cause=pending["death"]["cause"], **{"from": pending["from"]},
                         to=pending["to"], **extra)

    def _act(self, pending: dict[str, Any], resumed: bool = False, **extra: Any) -> ApplyResult:
        with self.store.update() as state:
            state["pending"]["phase"] = "acting"
            state["pending"]["attempts"] += 1
            attempt = state["pending"]["attempts"]
        unit = self.node.unit()
        systemd_note = {
            "auto-restart": "systemd's own restart (old config) was pending; the guard's restart replaces it",
            "start": "systemd had restarted the engine on the old config; the guard's restart replaces it",
            "start-pre": "systemd had restarted the engine on the old config; the guard's restart replaces it",
            "start-post": "systemd had restarted the engine on the old config; the guard's restart replaces it",
            "running": "the engine was running (hung or restarted by systemd); the guard restarts it",
            "failed": "the unit had failed (start limit or a failed start); the guard resets and starts it",
        }.get(unit.sub_state, f"unit {unit.active_state}/{unit.sub_state}")
        self.store.audit("action", step_id=pending["id"], attempt=attempt, unit_state=unit.sub_state,
                         systemd=systemd_note, to=pending["to"], **extra)
        # Only the values the step changes go into the override file (an as-is restart: none), so
        # that a later inventory change of the others is not masked by an override of the guard.
        values = TunedValues(**{name: value for name, value in pending["to"].items()
                                if pending["rung"] != policy.AS_IS and pending["from"].get(name) != value})
        # A resumed step may have written its file before the kill: roll back to the file before it.
        rollback_text = pending.get("override_before") if resumed else None
        result = self.node.apply(values, f"guard step {pending['id']}: {pending['why']}", rollback_text)
        self._finish(pending, result)
        return result

    def _finish(self, pending: dict[str, Any], result: ApplyResult, **extra: Any) -> None:
        now = self.clock()
        self.store.audit("outcome", step_id=pending["id"], outcome=result.outcome, why=result.why,
                         start_seconds=result.start_seconds, to=pending["to"],
                         seconds_since_decision=round(now - pending["decided_at"], 2),
                         attempt_death=dataclasses.asdict(result.death) if result.death else None,
                         journal_tail=result.journal_tail[-12:] if not result.ok else [], **extra)
        with self.store.update() as state:
            state["pending"] = None
            state["status"] = WATCHING if state["status"] == ACTING else state["status"]
            state["last_step"] = {"id": pending["id"], "rung": pending["rung"], "outcome": result.outcome,
                                  "from": pending["from"], "to": pending["to"], "at": now}
            if result.ok:
                state["last_good"] = {"values": pending["to"], "at": now}
            elif result.outcome == "deferred":
                state["remediations"] = [t for t in state["remediations"] if t != pending["decided_at"]]
                state["blind_restarts"] = [t for t in state["blind_restarts"] if t != pending["decided_at"]]
            elif (result.outcome in ("rolled_back", "down") and pending["to"] != pending["from"]
                  and pending["to"] not in state["failed"] and result.death is not None
                  and result.death.cause in CONFIG_CAUSES):
                # Only a death that says the config does not fit passes it over from now on: a missed
                # start budget, an NCCL error or a GPU fault says nothing of it (nor does an `error`
                # outcome, systemctl failing), and a config passed over for good would empty the
                # ladder one rung at a time.
                state["failed"].append(pending["to"])

    def resume_pending(self) -> None:
        """Finish the step a killed guard left in its state file (same step, never the next one)."""
        pending = self.store.load()["pending"]
        if not pending:
            return
        seen = {r["event"] for r in self.store.records() if r.get("step_id") == pending["id"]}
        if "decision" not in seen:
            self._audit_decision(pending, recovered=True)
        # What happened while the guard was down decides, as after a backoff: a pause, another
        # change in flight, or a config that is neither the step's start nor its end (an operator's
        # restart) wins; a step whose start already failed is not tried a second time.
        why = self._why_not_act(values_from(pending["from"]), "while the guard was down", values_from(pending["to"]))
        if why is not None:
            self._finish(pending, ApplyResult(False, "deferred", f"{why}; the step is not finished"), recovered=True)
            return
        in_force = policy.complete(self.node.effective())
        if (failed := self.node.failed_start(pending["id"], pending["decided_at"])) is not None:
            # Its start failed and its rollback had begun (the file before the step is back): the
            # step is not tried again. Its death, from the journal lines the history kept, says
            # whether the config is passed over from now on.
            journal = failed.get("journal") or []
            death = death_from(oom.analyze(journal)) if journal else None
            why = "the step's start had failed before the guard was killed"
            if self.node.wait_settled(self.config.start_timeout_s) and self.node.runs(in_force):
                result = ApplyResult(False, "rolled_back", f"{why}; the engine serves on the config before it",
                                     death=death)
            else:  # the rollback's restart was cut short: it runs now, on the file before the step
                again = self.node.apply(TunedValues(), f"guard step {pending['id']}: the rollback a kill cut short")
                outcome = again.outcome if again.outcome in ("deferred", "error") else \
                    "rolled_back" if again.ok else "down"
                result = ApplyResult(False, outcome, f"{why}; its rollback: {again.why}", again.start_seconds, death,
                                     again.journal_tail)
            self._finish(pending, result, recovered=True)
            return
        self.store.audit("resumed-step", step_id=pending["id"], phase=pending["phase"],
                         why="the guard was restarted in the middle of this step; finishing it")
        if pending["phase"] == "acting":
            if "action" not in seen:
                self.store.audit("action", step_id=pending["id"], attempt=pending["attempts"], recovered=True,
                                 to=pending["to"])
            to = values_from(pending["to"])
            settled = self.node.wait_settled(self.config.start_timeout_s)
            if settled and self.node.runs(to):
                self._finish(pending, ApplyResult(True, "ok", "the engine came up on the step's config while "
                                                              "the guard was down; no second restart"),
                             recovered=True)
                return
        self._act(pending, resumed=True)

    def stop(self, reason: str, death: policy.Death | None) -> None:
        state = self.store.load()
        last_good = state["last_good"]
        try:
            config = values_dict(self.node.effective())
        except click.ClickException as error:  # the reason it stops, perhaps
            config = {"unreadable": error.message}
        alert = self.alert(self.limits, reason, {"death": dataclasses.asdict(death) if death else None,
                                                 "last_good": last_good},
                           situation=self._situation(config, last_good))
        now = self.clock()
        with self.store.update() as state:
            state["status"] = STOPPED
            state["stopped"] = {"reason": reason, "at": now, "alert_id": alert["id"]}
        self.store.audit("stopped", reason=reason, last_good=last_good, alert_id=alert["id"],
                         delivery_errors=alert["delivery_errors"], config=config)

    def _situation(self, config: dict[str, Any], last_good: dict[str, Any] | None) -> str:
        """What the engine is doing as the guard stops, in words, from the unit and the files."""
        try:
            unit = self.node.unit()
            state = f"{unit.active_state}/{unit.sub_state}"
        except Exception as error:  # noqa: BLE001 - the alert goes out whatever systemd says
            return f"The engine's unit could not be read ({type(error).__name__}: {error}): check it."
        if "unreadable" in config:
            in_force = f"its env files cannot be read ({config['unreadable']})"
        else:
            in_force = f"the config in force is {self._words(values_from(config))}"
            if last_good is not None:
                complete = values_dict(policy.complete(values_from(config)))
                in_force += (" (the last that served)" if last_good["values"] == complete else
                             f"; the last that served was {self._words(values_from(last_good['values']))}")
        if unit.active_state == "active":
            return f"The engine's unit is {state}; {in_force}."
        return f"The engine is DOWN (unit {state}); {in_force}."

    def observe_serving(self) -> None:
        """Remember the config in force as the last that served (the engine is healthy now)."""
        values = values_dict(policy.complete(self.node.effective()))
        state = self.store.load()
        if state["last_good"] is None or state["last_good"]["values"] != values or values in state["failed"]:
            with self.store.update() as state:
                state["last_good"] = {"values": values, "at": self.clock()}
                state["failed"] = [v for v in state["failed"] if v != values]  # it serves: not passed over
            self.store.audit("serving", config=values)

    def heartbeat(self) -> None:
        with self.store.update() as state:
            state["heartbeat"] = self.clock()
            state["pid"] = os.getpid()

    @staticmethod
    def _words(values: TunedValues) -> str:
        return (f"fraction {values.mem_fraction_static}, chunk {values.chunked_prefill_size}, "
                f"expandable_segments {values.expandable_segments}")


# --- the node -------------------------------------------------------------------------------------


class SystemNode:
    """The real node: systemd, the journal, the env files, the engine's HTTP API, `restart()`."""

    def __init__(self, config: NodeConfig):
        self.config = config

    def effective(self) -> TunedValues:
        return values_in_force(self.config.env_file, self.config.override_env_file)

    def unit(self) -> UnitState:
        return unit_state(self.config.unit)

    def stop_requested(self, unit: UnitState) -> bool:
        return stop_requested(unit)

    def lock_holder(self) -> str | None:
        return locking.holder(self.config.state_dir, other_than=os.getpid())

    def override_text(self) -> str:
        return read_override_text(self.config.override_env_file)

    def apply(self, values: TunedValues, reason: str, rollback_text: str | None = None) -> ApplyResult:
        try:
            outcome = restart(self.config, values, reason=reason, force=True, budget_s=self.config.start_timeout_s,
                              wait_lock_s=0.0, progress=lambda _phase, _elapsed: None, rollback_text=rollback_text)
        except click.ClickException as error:
            if "another engine change is in progress" in error.message:
                return ApplyResult(False, "deferred", error.message)
            return ApplyResult(False, "error", error.message)
        except Exception as error:  # noqa: BLE001 - a systemctl timeout must not end the guard mid-step
            return ApplyResult(False, "error", f"{type(error).__name__}: {error}")
        attempt = outcome.attempt
        if outcome.ok:
            return ApplyResult(True, "ok", attempt.reason, round(attempt.seconds, 2))
        death = death_from(attempt.incidents()) if attempt.journal else None
        rollback_ok = outcome.rollback is not None and outcome.rollback.ok
        why = f"{attempt.reason}; rollback: {outcome.rollback.reason if outcome.rollback else 'none'}"
        return ApplyResult(False, "rolled_back" if rollback_ok else "down", why, round(attempt.seconds, 2),
                           death, attempt.journal[-40:])

    def lowest_fraction(self) -> float | None:
        try:
            lines = list(oom.read_journal(self.config.unit, last=PLANNER_JOURNAL_LINES,
                                          timeout_s=PLANNER_JOURNAL_TIMEOUT_S))
        except oom.JournalError:
            return None
        inputs = node_plan_inputs(self.config, lines)
        return None if inputs is None else planner.lowest_fraction_for(self.config.context_target, inputs)

    def wait_settled(self, budget_s: float) -> bool:
        """Wait while the unit is starting; True when it is active (its health gate passed)."""
        deadline = time.monotonic() + budget_s
        while time.monotonic() < deadline:
            state = self.unit()
            if state.active_state == "active":
                return True
            if state.active_state != "activating" or state.sub_state == "auto-restart":
                return False
            time.sleep(0.25)
        return False

    def failed_start(self, step_id: int, since: float) -> dict[str, Any] | None:
        """The restart history's record of a failed start of guard step `step_id`, decided at
        `since` (its rollback began), or None. (`since`: a new state file numbers its steps from 1
        again.)"""
        try:
            records = read_records(history_file(self.config))
        except OSError:
            return None
        prefix = f"guard step {step_id}:"
        return next((r for r in records if r.get("outcome") == "failed" and str(r.get("reason", "")).startswith(prefix)
                     and r.get("epoch", 0) >= since), None)

    def runs(self, values: TunedValues) -> bool:
        """The engine serves `values`: they are in force, the engine started after the override file
        was written, and it reports the fraction and chunk."""
        if policy.complete(self.effective()) != values:
            return False
        started = _main_start_epoch(self.config.unit)
        override = self.config.override_env_file
        if started is None or (override.exists() and started < override.stat().st_mtime):
            return False
        try:
            key = self.config.api_key()
            info = httpx.get(self.config.engine_url.rstrip("/") + "/server_info", timeout=5,
                             headers={"Authorization": f"Bearer {key}"} if key else {}).json()
        except httpx.TimeoutException:
            # SGLang answers /server_info through its scheduler, which a long prefill holds: an
            # engine that started after the file, on the values in force, runs them
            return True
        except (httpx.HTTPError, ValueError, click.ClickException):
            return False
        return (float(info.get("mem_fraction_static", -1)) == values.mem_fraction_static
                and int(info.get("chunked_prefill_size", -1)) == values.chunked_prefill_size)

    def config_hint(self) -> EngineConfig:
        values = self.effective()
        return EngineConfig(mem_fraction_static=values.mem_fraction_static,
                            chunked_prefill_size=values.chunked_prefill_size,
                            expandable_segments=values.expandable_segments)

    def backlog(self) -> tuple[list[str], str | None]:
        """The unit's recent journal (to know the engine's phase) and the cursor after it."""
        result = subprocess.run(["journalctl", "-u", self.config.unit, "-n", "3000", "-o", "short-iso",
                                 "--no-pager", "--show-cursor"], capture_output=True, text=True,
                                errors="replace", check=False, timeout=30)
        lines, cursor = [], None
        for line in result.stdout.splitlines():
            if line.startswith("-- cursor: "):
                cursor = line.removeprefix("-- cursor: ").strip()
            elif not line.startswith("-- "):
                lines.append(line)
        return lines, cursor or journal.cursor(self.config.unit)


def _main_start_epoch(unit: str) -> float | None:
    """When the unit's main process started, in epoch seconds (from the monotonic clock, to the µs)."""
    out = subprocess.run(["systemctl", "show", unit, "--property=ExecMainStartTimestampMonotonic"],
                         capture_output=True, text=True, check=False, timeout=10).stdout
    try:
        monotonic_us = int(out.strip().split("=", 1)[1])
    except (IndexError, ValueError):
        return None
    if monotonic_us == 0:
        return None
    return time.time() - (time.monotonic() - monotonic_us / 1e6)


class Prober(threading.Thread):
    """Probe /health_generate every `probe_interval_s` into a `HangDetector` (off the main loop,
    so a slow probe never delays reading the journal)."""

    def __init__(self, config: NodeConfig, detector: policy.HangDetector, active: Callable[[], bool]):
        super().__init__(daemon=True, name="guard-prober")
        self.config = config
        self.detector = detector
        self.active = active
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    def run(self) -> None:
        url = self.config.engine_url.rstrip("/") + "/health_generate"
        while not self.stopping.wait(self.config.guard.probe_interval_s):
            if not self.active():
                with self.lock:
                    self.detector.reset()
                continue
            try:
                response = httpx.get(url, timeout=self.config.guard.probe_timeout_s)
                ok, error = response.status_code == 200, f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                ok, error = False, f"{type(exc).__name__}: {exc}"
            with self.lock:
                self.detector.record(ok, time.monotonic(), None if ok else error)


class Heartbeat(threading.Thread):
    def __init__(self, guard: Guard):
        super().__init__(daemon=True, name="guard-heartbeat")
        self.guard = guard
        self.stopping = threading.Event()

    def run(self) -> None:
        while True:
            try:
                self.guard.heartbeat()
            except OSError:  # a full or read-only state folder: `opsctl status` will say the guard is silent
                pass
            if self.stopping.wait(HEARTBEAT_S):
                return


class Watcher:
    """The loop around a `Guard` on a real node."""

    def __init__(self, config: NodeConfig, guard: Guard | None = None, node: SystemNode | None = None):
        self.config = config
        self.node = node or SystemNode(config)
        self.store = GuardStore.for_config(config)
        self.guard = guard or Guard(config, self.node, self.store)
        self.detector = policy.HangDetector(config.guard.hang_timeout_s)
        self.busy_reported = False
        self.stopping = threading.Event()
        self._unit_active = False
        self.stopped_run: str | None = None  # the unit's run (InvocationID) that systemd stopped on request
        self.prober = Prober(config, self.detector, lambda: self._unit_active)
        self._resync()

    def _resync(self) -> None:
        """Start reading the journal from now, with the scanner primed on the engine's recent start."""
        if getattr(self, "follower", None) is not None:
            self.follower.close()
        backlog, cursor = self.node.backlog()
        hint = self.node.config_hint()
        self.scanner = oom.OomScanner(hint)
        for line in backlog:
            self.scanner.feed(line)
        self.scanner.flush()
        self.follower = journal.JournalFollower(self.config.unit, cursor)
        self.fatal_at: float | None = None
        self.fatal_wall: float | None = None
        self.fatal_line: str | None = None
        self.incidents: list[oom.Incident] = []
        unit = self.node.unit()
        self.restarts = unit.restarts
        with self.prober.lock:
            self.detector.reset()
            self.detector.hang_timeout_s = policy.hang_timeout(self.config.guard.hang_timeout_s,
                                                               hint.chunked_prefill_size)

    def run(self) -> None:
        self.store.audit("guard-started", pid=os.getpid(), limits=dataclasses.asdict(self.config.guard))
        heartbeat = Heartbeat(self.guard)
        heartbeat.start()
        try:
            self.guard.resume_pending()
            self._resync()
            self._loop()
        finally:
            heartbeat.stopping.set()

    def _loop(self) -> None:
        self.prober.start()
        standing_by = None
        idle = False  # paused or stopped: the journal is not followed for deaths
        try:
            while not self.stopping.is_set():
                now = time.monotonic()
                state = self.store.load()
                if (reason := unalerted_damage(state)) is not None:
                    self.guard.stop(reason, None)  # the alert; the damaged file is kept aside
                    continue
                lines = self.follower.new_lines()
                unit = self.node.unit()
                self._unit_active = unit.active_state == "active"
                if held(state) is not None:
                    idle = True
                    self.restarts = unit.restarts
                    time.sleep(TICK_S)
                    continue
                if idle:
                    # Back to watching: the engine may have started (or died) meanwhile, and the
                    # scanner saw none of it; without a resync it would still believe the engine is
                    # in the start that failed, and file the next serving OOM as a startup failure.
                    idle = False
                    self._resync()
                    continue
                holder = self.node.lock_holder()
                if holder:
                    if standing_by != holder:
                        self.store.audit("standing-by", why=f"an engine change is in progress: {holder}")
                    standing_by = holder
                    time.sleep(TICK_S)
                    continue
                if standing_by:
                    standing_by = None
                    self._resync()
                    continue
                try:
                    self._tick(lines, unit, now)
                except click.ClickException as error:  # e.g. a tuned value in an env file that is not a number
                    self.guard.stop(f"the guard cannot judge the engine: {error.message}", None)
                except Exception as error:  # a bug of ours: stop acting, and say so, rather than die unheard
                    traceback.print_exc()  # (into the guard's journal)
                    self.guard.stop(f"the guard failed while judging the engine ({type(error).__name__}: "
                                    f"{error}); its traceback is in the guard's journal", None)
                time.sleep(TICK_S)
        finally:
            self.prober.stopping.set()
            self.follower.close()

    def _tick(self, lines: list[str], unit: UnitState, now: float) -> None:
        if any(oom.scheduler_working(line) for line in lines):
            with self.prober.lock:
                self.detector.progress(now)
        for line in lines:
            if self.fatal_at is None and any(marker in line for marker in FATAL_MARKERS):
                self.fatal_at, self.fatal_wall, self.fatal_line = now, time.time(), line
            self.incidents.extend(self.scanner.feed(line))
        # (a busy engine logs KV-pool retractions by the thousand between deaths; a death is
        # judged from the incidents around it)
        del self.incidents[:-INCIDENTS_KEPT]
        died = (unit.dead and unit.invocation != self.stopped_run) or unit.restarts > self.restarts
        if died and self.fatal_at is None:
            self.fatal_at, self.fatal_wall, self.fatal_line = now, time.time(), f"unit {unit.sub_state}"
        if self.fatal_at is not None:
            complete = any(i.engine_killed or i.kind == "killed" for i in self.incidents)
            if complete or now - self.fatal_at >= CLASSIFY_GRACE_S:
                if self.node.stop_requested(unit):
                    # an operator's `systemctl stop`: whatever the engine logged or exited with on its
                    # way down, systemd does not restart this run, and neither does the guard
                    self.stopped_run = unit.invocation
                    self.store.audit("stopped-on-request", invocation=unit.invocation,
                                     unit_state=f"{unit.active_state}/{unit.sub_state}", result=unit.result,
                                     exit_status=unit.exit_status, first_fatal_line=self.fatal_line,
                                     why="systemd stopped the engine on request (a stop job); not a death, the "
                                         "guard leaves it stopped")
                    self._resync()
                    return
                self.incidents.extend(self.scanner.flush())
                death = death_from(self.incidents)
                seen = {"first_fatal_line": self.fatal_line, "first_fatal_at": self.fatal_wall,
                        "decided_after_s": round(now - self.fatal_at, 3), "unit_state": unit.sub_state,
                        "incidents": [f"{i.kind} ({i.classification})" for i in self.incidents]}
                self.guard.on_death(death, seen)
                self._resync()
            return
        if unit.active_state == "active" and unit.sub_state == "running":
            with self.prober.lock:
                hung = self.detector.hung(now)
                busy = self.detector.failing(now) and not hung  # failing probes held off by batches
                error = self.detector.last_error
                since = self.detector.failing_since
            if busy and not self.busy_reported:
                # once per episode: the operator sees why a failing probe was not acted on
                self.store.audit("busy-not-hung", why=f"/health_generate failing for {now - since:.0f} s ({error}), "
                                                      "but the scheduler still logs batches")
            self.busy_reported = busy
            if hung:
                death = policy.Death(policy.HANG, "hang", f"/health_generate failing for {now - since:.0f} s "
                                                          f"({error})")
                self.guard.on_death(death, {"unit_state": unit.sub_state, "health_generate_error": error})
                self._resync()
                return
            if self.detector.failing_since is None and (unit.uptime_s or 0) > 1:
                self.guard.observe_serving()
