"""The guard's files in the state folder: its state file and its append-only audit log.

- `guard-state.json`: what the guard is doing (watching, acting, stopped), the step in flight,
  the remediations of the last hour (the budget), the last config that served, the alert.
  Written atomically under `guard-state.lock`, by the daemon and by `opsctl guard pause|resume`.
- `guard-audit.jsonl`: one JSON line per decision, fsynced (`state.append_record`): what the
  guard saw, what it changed, from what to what, the outcome.

Crash consistency: a step is first written to the state file (`pending`, phase `decided`, the
budget charged), then to the audit log; the restart itself happens after both. A guard killed
at any point finds the step in its state file on start, appends the audit records the kill cut
off (marked `recovered`), and finishes that step, neither taking it twice nor skipping it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from filelock import FileLock

from opsctl.config import NodeConfig
from opsctl.overrides import TunedValues
from opsctl.state import actor, append_record, atomic_write, read_records

STATE_FILE = "guard-state.json"
AUDIT_FILE = "guard-audit.jsonl"
LOCK_FILE = "guard-state.lock"

# Guard states (the `status` field).
WATCHING = "watching"
ACTING = "acting"
STOPPED = "stopped"  # budget or ladder exhausted, or an unknown cause repeated: needs `resume`


def empty_state() -> dict[str, Any]:
    return {
        "status": WATCHING,
        "paused": None,  # {"by", "reason", "at"} while paused
        "stopped": None,  # {"reason", "at", "alert_id"} once stopped
        "pending": None,  # the step in flight: {"id", "phase", "step", "death", "from", "to", ...}
        "remediations": [],  # epoch of each remediation (the budget)
        "blind_restarts": [],  # epoch of each as-is restart for an unknown cause or a hang
        "failed": [],  # configs a step tried that did not come up (the ladder passes over them)
        "last_good": None,  # {"values", "at"}: the last config seen serving
        "last_step": None,  # summary of the last finished step
        "next_id": 1,
        "heartbeat": None,  # epoch of the daemon's last loop, and its pid
        "pid": None,
    }


DAMAGED = "_damaged"  # in a loaded state only, never written: the file could not be read


def damaged_state(state_file: Path, error: Exception) -> dict[str, Any]:
    """What an unreadable state file stands for: a stopped guard. The pause, the stop and the
    spent budget it held are unknown, so the guard must not act until a person has looked."""
    reason = (f"{state_file} is damaged ({error}); the guard acts again after `opsctl guard resume`, "
              "once someone has checked the engine")
    return empty_state() | {"status": STOPPED, DAMAGED: str(error),
                            "stopped": {"reason": reason, "at": time.time(), "alert_id": None, "damaged": True}}


def unalerted_damage(state: dict[str, Any]) -> str | None:
    """The reason of a stop that a damaged state file made and no alert has announced yet."""
    stopped = state["stopped"]
    if state["status"] == STOPPED and stopped and stopped.get("damaged") and stopped.get("alert_id") is None:
        return stopped["reason"]
    return None


def held(state: dict[str, Any]) -> str | None:
    """Why the guard must not act (paused or stopped), from its state, or None."""
    if state["paused"]:
        return f"the guard was paused by {state['paused'].get('by', '?')}: {state['paused'].get('reason', '')}"
    if state["status"] == STOPPED:
        return "the guard was stopped"
    return None


def values_dict(values: TunedValues | None) -> dict[str, Any] | None:
    return None if values is None else dataclasses.asdict(values)


def values_from(data: dict[str, Any] | None) -> TunedValues | None:
    return None if data is None else TunedValues(**data)


class GuardStore:
    def __init__(self, state_dir: Path):
        self.state_dir = Path(state_dir)
        self.state_file = self.state_dir / STATE_FILE
        self.audit_file = self.state_dir / AUDIT_FILE
        self._lock = FileLock(str(self.state_dir / LOCK_FILE))

    @classmethod
    def for_config(cls, config: NodeConfig) -> GuardStore:
        return cls(config.state_dir)

    def load(self) -> dict[str, Any]:
        state = empty_state()
        if self.state_file.exists():
            try:
                saved = json.loads(self.state_file.read_text())
                if not isinstance(saved, dict):
                    raise ValueError(f"a JSON {type(saved).__name__}, not an object")
            except ValueError as error:  # (JSONDecodeError too) atomic writes: someone else broke it
                return damaged_state(self.state_file, error)
            state.update(saved)
        return state

    @contextlib.contextmanager
    def update(self) -> Iterator[dict[str, Any]]:
        """Read, change and write the state file under its lock (the daemon and the CLI share it).
        A damaged file is kept aside, not overwritten, and the move is audited."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with self._lock:
            state = self.load()
            damaged = state.pop(DAMAGED, None)
            if damaged is not None:
                kept = self.state_file.with_name(f"{STATE_FILE}.damaged-{time.strftime('%Y%m%dT%H%M%S')}")
                self.state_file.replace(kept)
                state["stopped"]["damaged"] = str(kept)
                self.audit("state-file-damaged", error=damaged, kept=str(kept))
            yield state
            atomic_write(self.state_file, json.dumps(state, indent=1, sort_keys=True) + "\n", mode=0o644)

    def audit(self, event: str, **fields: Any) -> dict[str, Any]:
        # A line torn by a kill mid-write must not swallow the next record: end it first.
        if self.audit_file.exists() and self.audit_file.stat().st_size:
            with open(self.audit_file, "rb+") as handle:
                handle.seek(-1, 2)
                if handle.read(1) != b"\n":
                    handle.write(b"\n")
        return append_record(self.audit_file, {"event": event, "actor": actor(), **fields})

    def records(self) -> list[dict[str, Any]]:
        return read_records(self.audit_file)

    # -- operator controls ----------------------------------------------------------------------
    def pause(self, reason: str) -> bool:
        with self.update() as state:
            already = state["paused"] is not None
            if not already:
                state["paused"] = {"by": actor(), "reason": reason, "at": time.time()}
        if not already:
            self.audit("paused", reason=reason)
        return not already

    def resume(self, reason: str, pause_only: bool = False) -> dict[str, Any]:
        """Lift a pause and a stop; a new hour of budget starts (a person looked). With
        `pause_only` (a rollout that paused the guard for its own restarts), only the pause.

        A resume after a stop starts afresh: a step the stop cut short (the guard failed in the
        middle of it) is dropped and audited, never finished later. Before, it stayed in the state
        file, and the guard's next start replayed it on whatever the engine ran by then, uncharged."""
        dropped = None
        with self.update() as state:
            before = {"paused": state["paused"], "stopped": None if pause_only else state["stopped"]}
            state["paused"] = None
            if not pause_only:
                if state["status"] == STOPPED:
                    state["status"] = WATCHING
                    # (only a stopped guard's: a guard that is acting, or was killed while acting,
                    # finishes its step, or `resume_pending` drops it)
                    dropped, state["pending"] = state["pending"], None
                    if dropped:
                        state["last_step"] = {"id": dropped["id"], "rung": dropped["rung"], "outcome": "dropped",
                                              "from": dropped["from"], "to": dropped["to"], "at": time.time()}
                state["stopped"] = None
                state["remediations"], state["blind_restarts"], state["failed"] = [], [], []
        if dropped:
            self.audit("outcome", step_id=dropped["id"], outcome="dropped", to=dropped["to"], phase=dropped["phase"],
                       why="the guard was stopped in the middle of this step; `guard resume` starts afresh, "
                           "the step is not finished")
        self.audit("resumed", reason=reason, pause_only=pause_only, **before)
        return before


def summary(config: NodeConfig, now: float | None = None) -> dict[str, Any]:
    """The guard's state for `opsctl status` and `opsctl guard status` (reads files only)."""
    from opsctl.guard.policy import budget_left, in_last_hour  # late: policy imports config only

    now = time.time() if now is None else now
    store = GuardStore.for_config(config)
    if not store.state_file.exists():
        return {"state": "never-ran", "problem": None}
    state = store.load()
    heartbeat = state.get("heartbeat")
    alive = heartbeat is not None and now - heartbeat < max(30.0, 3 * config.guard.probe_interval_s)
    # a stop outranks a pause: it needs a person (`guard resume`), a pause only ends (a rollout's)
    shown = STOPPED if state["status"] == STOPPED else "paused" if state["paused"] else state["status"]
    if not alive and shown != STOPPED:
        shown = f"{shown} (not running)"
    problem = None
    if state["status"] == STOPPED:
        problem = f"guard stopped: {state['stopped']['reason'] if state['stopped'] else 'see opsctl guard history'}"
        if state["paused"]:
            problem += f" (also paused by {state['paused']['by']}: {state['paused']['reason']})"
    elif state["paused"]:
        problem = f"guard paused by {state['paused']['by']}: {state['paused']['reason']}"
    elif not alive:
        problem = "guard not running (no heartbeat)"
    return {
        "state": shown,
        "running": alive,
        "paused": state["paused"],
        "stopped": state["stopped"],
        "pending": state["pending"],
        "budget_left": budget_left(state["remediations"], now, config.guard),
        "remediations_last_hour": len(in_last_hour(state["remediations"], now)),
        "blind_restarts_last_hour": len(in_last_hour(state["blind_restarts"], now)),
        "last_good": state["last_good"],
        "last_step": state["last_step"],
        "problem": problem,
    }
