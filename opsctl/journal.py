"""Follow the engine unit's journal while it starts: new lines as they are written."""

from __future__ import annotations

import queue
import shutil
import subprocess
import threading


def cursor(unit: str) -> str | None:
    """The journal's current position for `unit`, so a follower sees only what comes after."""
    result = subprocess.run(["journalctl", "-u", unit, "-n", "0", "--show-cursor", "--no-pager", "-o", "cat"],
                            capture_output=True, text=True, check=False, timeout=10)
    for line in result.stdout.splitlines():
        if line.startswith("-- cursor: "):
            return line.removeprefix("-- cursor: ").strip()
    return None


def tail(unit: str, lines: int) -> list[str]:
    """The last `lines` of the unit's journal (short-iso), or [] where there is no journal to read."""
    if shutil.which("journalctl") is None:
        return []
    result = subprocess.run(["journalctl", "-u", unit, "-n", str(lines), "-o", "short-iso", "--no-pager"],
                            capture_output=True, text=True, errors="replace", check=False, timeout=10)
    if result.returncode != 0:
        return []
    return [line for line in result.stdout.splitlines() if not line.startswith("-- ")]


def excerpt(unit: str, lines: int = 30) -> str | None:
    """The end of the unit's journal as one text, or None where there is none."""
    return "\n".join(tail(unit, lines)) or None


class JournalFollower:
    """`journalctl -f` of one unit from a cursor, read by a thread into a queue.

    Lines keep journalctl's short-iso prefix, the format the OOM analyzer reads.
    """

    def __init__(self, unit: str, after_cursor: str | None):
        command = ["journalctl", "-u", unit, "-f", "-o", "short-iso", "--no-pager"]
        command += ["--after-cursor", after_cursor] if after_cursor else ["-n", "0"]
        self._process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                         text=True, errors="replace")
        self._lines: queue.Queue[str] = queue.Queue()
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self._lines.put(line.rstrip("\n"))

    def new_lines(self) -> list[str]:
        lines = []
        while True:
            try:
                lines.append(self._lines.get_nowait())
            except queue.Empty:
                return lines

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
