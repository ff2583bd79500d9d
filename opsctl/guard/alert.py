"""The guard's alert when it stops: a journal entry with a stable MESSAGE_ID, a webhook, a command.

Find the entries with `journalctl MESSAGE_ID=<GUARD_STOPPED>` or `journalctl -t opsctl-guard -p crit`;
each message starts with the tag `OPSCTL-GUARD-STOPPED` for tools that grep syslog text.
The webhook gets the alert as a JSON POST; the command hook runs through the shell with the alert
as JSON on stdin and in `OPSCTL_GUARD_ALERT`. Each channel's failure is returned, never raised:
the guard records it in its audit log and carries on.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from typing import Any

import httpx

from opsctl.config import GuardConfig

SYSLOG_IDENTIFIER = "opsctl-guard"
# Stable identifiers (journal MESSAGE_ID, 128-bit hex) of the guard's alerts.
GUARD_STOPPED = "5f0c8d1b3e2a4c6f9a7b8e1d2c3f4a50"
TAG = "OPSCTL-GUARD-STOPPED"
JOURNAL_SOCKET = "/run/systemd/journal/socket"
PRIORITY_CRIT = 2


def journal_fields(message: str, fields: dict[str, Any]) -> bytes:
    """A journal native-protocol datagram (single-line values only: newlines become spaces)."""
    entries = {"MESSAGE": message, "MESSAGE_ID": GUARD_STOPPED, "PRIORITY": str(PRIORITY_CRIT),
               "SYSLOG_IDENTIFIER": SYSLOG_IDENTIFIER}
    entries.update({f"OPSCTL_GUARD_{key.upper()}": value for key, value in fields.items()})
    lines = [f"{key}={' '.join(str(value).splitlines())}" for key, value in entries.items()]
    return ("\n".join(lines) + "\n").encode()


def to_journal(message: str, fields: dict[str, Any], socket_path: str = JOURNAL_SOCKET) -> str | None:
    """Write the alert to the journal (native protocol; `logger` where there is no socket)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(journal_fields(message, fields), socket_path)
        return None
    except OSError as error:
        try:
            result = subprocess.run(["logger", "-t", SYSLOG_IDENTIFIER, "-p", "daemon.crit", message],
                                    capture_output=True, text=True, check=False, timeout=10)
        except (OSError, subprocess.TimeoutExpired) as logger_error:  # no logger, or it hangs
            return f"journal: {error}; logger: {type(logger_error).__name__}: {logger_error}"
        return None if result.returncode == 0 else f"journal: {error}; logger: {result.stderr.strip()}"


def to_webhook(url: str, alert: dict[str, Any], timeout_s: float = 5.0) -> str | None:
    try:
        response = httpx.post(url, json=alert, timeout=timeout_s)
    except httpx.HTTPError as error:
        return f"webhook {url}: {type(error).__name__}: {error}"
    return None if response.is_success else f"webhook {url}: HTTP {response.status_code}"


def to_command(command: str, alert: dict[str, Any], timeout_s: float = 30.0) -> str | None:
    text = json.dumps(alert, default=str)
    try:
        result = subprocess.run(command, shell=True, input=text, capture_output=True, text=True, check=False,
                                timeout=timeout_s, env={**os.environ, "OPSCTL_GUARD_ALERT": text})
    except subprocess.TimeoutExpired:
        return f"command hook timed out after {timeout_s:g} s"
    return None if result.returncode == 0 else f"command hook exited {result.returncode}: {result.stderr.strip()[:300]}"


def raise_alert(limits: GuardConfig, reason: str, details: dict[str, Any],
                socket_path: str = JOURNAL_SOCKET, situation: str = "") -> dict[str, Any]:
    """Send the alert on every configured channel; returns the alert with each channel's error (or None).

    `situation` says what the engine is doing as the guard stops (down or serving, on what), from
    the unit and the files: whoever is paged must not read "it serves" of an engine that is down."""
    message = (f"{TAG}: the guard stopped acting: {reason}. {situation + ' ' if situation else ''}"
               "Read `opsctl guard history`, fix the cause, then `opsctl guard resume`.")
    alert = {"id": GUARD_STOPPED, "tag": TAG, "message": message, "reason": reason, "situation": situation,
             **details}
    errors = {"journal": to_journal(message, {"reason": reason}, socket_path)}
    if limits.webhook_url:
        errors["webhook"] = to_webhook(limits.webhook_url, alert)
    if limits.command_hook:
        errors["command"] = to_command(limits.command_hook, alert)
    return {**alert, "delivery_errors": {k: v for k, v in errors.items() if v}}
