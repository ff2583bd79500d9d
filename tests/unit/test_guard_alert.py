"""The guard's alert: a journal entry with a stable MESSAGE_ID, and the command hook."""

import socket

from opsctl.config import GuardConfig
from opsctl.guard import alert


def test_journal_entry_carries_the_stable_id(tmp_path):
    path = str(tmp_path / "journal.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    try:
        sent = alert.raise_alert(GuardConfig(), "budget spent", {"last_good": None}, socket_path=path)
        fields = dict(line.split("=", 1) for line in server.recv(65536).decode().splitlines())
    finally:
        server.close()
    # the id operators search for (journalctl MESSAGE_ID=..., docs/operations.md): it never changes
    assert fields["MESSAGE_ID"] == "5f0c8d1b3e2a4c6f9a7b8e1d2c3f4a50" == sent["id"]
    assert fields["PRIORITY"] == "2" and fields["SYSLOG_IDENTIFIER"] == "opsctl-guard"
    assert fields["MESSAGE"].startswith("OPSCTL-GUARD-STOPPED: the guard stopped acting: budget spent")
    assert sent["delivery_errors"] == {}


def test_command_hook_gets_the_alert_on_stdin(tmp_path):
    out = tmp_path / "alert.json"
    limits = GuardConfig(command_hook=f"cat > {out}")
    sent = alert.raise_alert(limits, "ladder exhausted", {}, socket_path=str(tmp_path / "none"))
    assert '"reason": "ladder exhausted"' in out.read_text()
    assert "command" not in sent["delivery_errors"]


def test_failing_hooks_are_reported_not_raised(tmp_path):
    limits = GuardConfig(command_hook="exit 3", webhook_url="http://127.0.0.1:9/hook")
    sent = alert.raise_alert(limits, "x", {}, socket_path=str(tmp_path / "none"))
    assert sent["delivery_errors"]["command"].startswith("command hook exited 3")
    assert sent["delivery_errors"]["webhook"].startswith("webhook http://127.0.0.1:9/hook")


def test_no_journal_and_no_logger_is_a_delivery_error_not_a_crash(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no `logger` to fall back on
    sent = alert.raise_alert(GuardConfig(), "x", {}, socket_path=str(tmp_path / "none"))
    assert sent["delivery_errors"]["journal"].startswith("journal: ")
    assert "logger: FileNotFoundError" in sent["delivery_errors"]["journal"]
