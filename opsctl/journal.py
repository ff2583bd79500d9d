"""Follow the engine unit's journal while it starts: new lines as they are written."""

from __future__ import annotations

import dataclasses
import json
import queue
import shutil
import subprocess
import threading
from datetime import datetime


def cursor(unit: str) -> str | None:
    """The journal's current position for `unit`, so a follower sees only what comes after."""
    result = subprocess.run(["journalctl", "-u", unit, "-n", "0", "--show-cursor", "--no-pager", "-o", "cat"],
                            capture_output=True, text=True, check=False, timeout=10)
    for line in result.stdout.splitlines():
        if line.startswith("-- cursor: "):
            return line.removeprefix("-- cursor: ").strip()
    return None


def tail(unit: str, lines: int, timeout_s: float = 10.0) -> list[str]:
    """The last `lines` of the unit's journal (short-iso), or [] where there is no journal to read."""
    if shutil.which("journalctl") is None:
        return []
    result = subprocess.run(["journalctl", "-u", unit, "-n", str(lines), "-o", "short-iso", "--no-pager"],
                            capture_output=True, text=True, errors="replace", check=False, timeout=timeout_s)
    if result.returncode != 0:
        return []
    return [line for line in result.stdout.splitlines() if not line.startswith("-- ")]


def run_start(invocation: str, until: str, max_lines: int = 20_000, timeout_s: float = 10.0) -> list[str]:
    """The first lines of one run of a unit (systemd's InvocationID), short-iso, up to the first
    that contains `until` (the engine's ready line) or max_lines: a run's start, however long the
    run has logged since. [] where there is no journal to read."""
    if not invocation or shutil.which("journalctl") is None:
        return []
    command = ["journalctl", f"_SYSTEMD_INVOCATION_ID={invocation}", "-o", "short-iso", "--no-pager"]
    lines: list[str] = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                          errors="replace") as process:  # (closes the pipe and waits on the way out)
        timer = threading.Timer(timeout_s, process.kill)
        timer.start()
        try:
            assert process.stdout is not None
            for line in process.stdout:
                if line.startswith("-- "):
                    continue
                lines.append(line.rstrip("\n"))
                if until in line or len(lines) >= max_lines:
                    break
        finally:
            timer.cancel()
            process.kill()
    return lines


def excerpt(unit: str, lines: int = 30) -> str | None:
    """The end of the unit's journal as one text, or None where there is none."""
    return "\n".join(tail(unit, lines)) or None


@dataclasses.dataclass(frozen=True)
class Entry:
    """One journal entry: its line as `journalctl -o short-iso` prints it (the format the OOM
    analyzer reads), and the run of the unit it belongs to."""

    text: str
    invocation: str  # systemd's InvocationID of the unit's run ("" where journald names none)


def _field(record: dict, name: str) -> str:
    """A field's text. journald's JSON gives a value that is not UTF-8 as a list of byte values,
    a field set twice as a list of values, and (without --all) a value over 4 KB as null."""
    value = record.get(name)
    if value is None:
        return ""
    if isinstance(value, list):
        if all(isinstance(item, int) for item in value):
            return bytes(value).decode("utf-8", errors="replace")
        return " ".join(_field({name: item}, name) for item in value)
    return str(value)


def entry_from_json(line: str) -> Entry:
    """An `-o json` record as an Entry. The engine's own lines carry the run in
    _SYSTEMD_INVOCATION_ID (journald attaches it to the unit's stdout); systemd's lines about
    the unit ("Stopping ...", "Main process exited ...") in INVOCATION_ID."""
    record = json.loads(line)
    stamp = datetime.fromtimestamp(int(_field(record, "__REALTIME_TIMESTAMP") or 0) / 1e6).astimezone()
    ident = _field(record, "SYSLOG_IDENTIFIER") or _field(record, "_COMM")
    pid = _field(record, "SYSLOG_PID") or _field(record, "_PID")
    text = (f"{stamp.strftime('%Y-%m-%dT%H:%M:%S%z')} {_field(record, '_HOSTNAME')} "
            f"{ident}{f'[{pid}]' if pid else ''}: {_field(record, 'MESSAGE')}")
    return Entry(text, _field(record, "INVOCATION_ID") or _field(record, "_SYSTEMD_INVOCATION_ID"))


class JournalFollower:
    """`journalctl -f` of one unit from a cursor, read by a thread into a queue."""

    def __init__(self, unit: str, after_cursor: str | None):
        # --all: SGLang's server_args line alone is over the 4 KB that JSON output gives otherwise
        command = ["journalctl", "-u", unit, "-f", "-o", "json", "--all", "--no-pager"]
        command += ["--after-cursor", after_cursor] if after_cursor else ["-n", "0"]
        # (its own session: a hangup of opsctl's terminal, which a restart outlives, or a Ctrl-C
        # meant for opsctl, must not end the follower while the start is still followed)
        self._process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
                                         text=True, errors="replace")
        self._entries: queue.Queue[Entry] = queue.Queue()
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            try:
                self._entries.put(entry_from_json(line))
            except (ValueError, TypeError):  # a record cut off by a dying journalctl
                continue

    def new_entries(self) -> list[Entry]:
        entries = []
        while True:
            try:
                entries.append(self._entries.get_nowait())
            except queue.Empty:
                return entries

    def new_lines(self) -> list[str]:
        return [entry.text for entry in self.new_entries()]

    def close(self) -> None:
        self._process.terminate()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()

    def __enter__(self) -> JournalFollower:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
