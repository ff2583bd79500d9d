"""The engine unit as systemd sees it (`systemctl show`), and actions on it."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from datetime import datetime, timezone

# The MESSAGE_IDs of PID 1's journal entries about a unit's stop jobs (systemd's catalog: "A stop
# job for unit @UNIT@ has begun execution" / "... has finished"); INVOCATION_ID names the run.
STOP_JOB_BEGAN = "de5b426a63be47a7b6ac3eaac82e2f6f"
STOP_JOB_FINISHED = "9d1aaa27d60140bd96365438aad20286"

_PROPERTIES = ["ActiveState", "SubState", "NRestarts", "ActiveEnterTimestamp", "ExecMainStartTimestamp",
               "MainPID", "ExecMainStatus", "Result", "UnitFileState", "LoadState", "InvocationID", "Job"]


@dataclasses.dataclass
class UnitState:
    name: str
    load_state: str
    active_state: str
    sub_state: str
    result: str
    restarts: int
    main_pid: int
    exit_status: int
    enabled: str
    active_since: datetime | None
    invocation: str = ""  # systemd's ID of the unit's current run: a new one each start
    job: str = ""  # the ID of a job queued or running on the unit (a start, a stop, a restart); "" when none

    @property
    def settled(self) -> bool:
        """No job is queued or running on the unit, so its state is final. While a restart job
        runs, a stop step that fails (`docker stop` of a container already gone, a stop timeout)
        shows the old run "failed" for a moment before the job starts the new run."""
        return not self.job

    @property
    def dead(self) -> bool:
        """The current run died and nothing is starting another yet: waiting for its auto-restart
        (RestartSec), or failed for good. (A run that a stop job ended can be "failed" too, with no
        restart to come: `stop_requested` tells it apart.)"""
        return self.settled and (self.sub_state in ("auto-restart", "failed") or self.active_state == "failed")

    @property
    def uptime_s(self) -> float | None:
        if self.active_state != "active" or self.active_since is None:
            return None
        return (datetime.now(timezone.utc) - self.active_since).total_seconds()


def _parse_timestamp(text: str) -> datetime | None:
    # systemd prints e.g. "Sun 2026-11-29 13:40:01 UTC"; empty or "n/a" when never active.
    parts = text.split()
    if len(parts) < 3:
        return None
    try:
        stamp = datetime.strptime(" ".join(parts[1:3]), "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return None
    return stamp.replace(tzinfo=timezone.utc) if parts[3:4] == ["UTC"] else stamp.astimezone(timezone.utc)


def unit_state(unit: str) -> UnitState:
    """Read the unit's state; raises FileNotFoundError where there is no systemctl."""
    out = subprocess.run(["systemctl", "show", unit, "--no-pager", *(f"--property={p}" for p in _PROPERTIES)],
                         capture_output=True, text=True, check=False, timeout=10).stdout
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def number(key: str) -> int:
        try:
            return int(props.get(key, "0") or 0)
        except ValueError:
            return 0

    return UnitState(
        name=unit,
        load_state=props.get("LoadState", "unknown"),
        active_state=props.get("ActiveState", "unknown"),
        sub_state=props.get("SubState", "unknown"),
        result=props.get("Result", ""),
        restarts=number("NRestarts"),
        main_pid=number("MainPID"),
        exit_status=number("ExecMainStatus"),
        enabled=props.get("UnitFileState", ""),
        active_since=_parse_timestamp(props.get("ActiveEnterTimestamp", "")),
        invocation=props.get("InvocationID", ""),
        job=props.get("Job", ""),
    )


def stop_requested(unit: UnitState, timeout_s: float = 10.0) -> bool:
    """Whether systemd ended the unit's current run on request, by a stop job (`systemctl stop`,
    or a stop that systemd propagates, from docker.service for one), rather than the run dying.

    The unit's state cannot tell: a stop that outlasts `docker stop`'s grace (SGLang waits for its
    running requests) kills the container, `docker run` exits 137, and the unit ends "failed" like
    a death of unknown cause; a kernel OOM kill also exits 137. The journal can: PID 1 logs, for the
    run (INVOCATION_ID), "Stopping ..." as a stop job begins on a running unit, and "Stopped ..." as
    a stop job finishes (its JOB_TYPE "stop"; "restart" for a restart job, which stops the run but
    wants a new one). False where the journal cannot say (no journalctl, a timeout, a run with no
    id): the run is then taken for dead, so that no death is hidden.
    """
    if not unit.invocation:
        return False
    command = ["journalctl", "--no-pager", "-o", "json", "--output-fields=MESSAGE_ID,JOB_TYPE", "_PID=1",
               f"UNIT={unit.name}", f"INVOCATION_ID={unit.invocation}",
               f"MESSAGE_ID={STOP_JOB_BEGAN}", f"MESSAGE_ID={STOP_JOB_FINISHED}"]  # (the same field: either)
    try:
        out = subprocess.run(command, capture_output=True, text=True, errors="replace", check=False,
                             timeout=timeout_s).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    began, finished = False, None
    for line in out.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        if record.get("MESSAGE_ID") == STOP_JOB_BEGAN:
            began = True
        elif record.get("MESSAGE_ID") == STOP_JOB_FINISHED:
            finished = record.get("JOB_TYPE")
    # (a stop job that began on the run but whose end journald has not written yet: a stop too)
    return finished == "stop" if finished is not None else began
