"""The engine unit as systemd sees it (`systemctl show`), and actions on it."""

from __future__ import annotations

import dataclasses
import subprocess
from datetime import datetime, timezone

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
        (RestartSec), or failed for good."""
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
