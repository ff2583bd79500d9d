"""One engine change at a time: `opsctl restart`, `overrides clear` and the guard share a lock.

The lock is an flock, so the OS drops it when its holder dies. Beside it, an info file says who
holds it (for messages and for the guard, which stands by while a change runs); the info file
of a holder killed before it could remove the file is recognised as stale by the holder's pid
and that process's start time (the pid may have been reused since)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import click
from filelock import FileLock, Timeout

from opsctl.state import atomic_write

INFO_FILE = "engine.lock.json"


def _process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat, field 22), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # fields after the command name, which may hold spaces


def holder(state_dir: Path, other_than: int | None = None) -> str | None:
    """Who holds the engine lock, from its info file: None when nobody does, the process that
    wrote the file is gone (or its pid now belongs to another process), or it is `other_than`."""
    try:
        data = json.loads((Path(state_dir) / INFO_FILE).read_text())
        pid = int(data["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    started = _process_start(pid)
    if pid == other_than or started is None or ("pid_start" in data and data["pid_start"] != started):
        return None
    return f"{data.get('holder', '?')} (pid {pid}, since {data.get('since', '?')})"


def _unusable(state_dir: Path, error: OSError) -> click.ClickException:
    return click.ClickException(f"cannot take the engine lock in {state_dir} ({error.strerror or error}): is its "
                                "filesystem full or read-only? Nothing was changed; free space there (or remount it "
                                "read-write) and retry")


@contextlib.contextmanager
def engine_lock(state_dir: Path, holder_name: str, wait_s: float = 0.0) -> Iterator[None]:
    """Hold the engine lock, or fail saying who holds it."""
    info = state_dir / INFO_FILE
    lock = FileLock(str(state_dir / "engine.lock"))
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        lock.acquire(timeout=wait_s)
    except PermissionError as error:  # the state folder is root's
        raise click.ClickException(f"cannot take the engine lock in {state_dir} ({error.strerror}): engine changes "
                                   "need root on the node (sudo opsctl ...); nothing was changed") from None
    except Timeout:
        raise click.ClickException(f"another engine change is in progress ({holder(state_dir) or 'unknown'}); wait "
                                   "for it to finish, or pass --wait-lock SECONDS to queue behind it") from None
    except OSError as error:  # a full or read-only filesystem (disk errors remount it read-only)
        raise _unusable(state_dir, error) from None
    try:
        try:
            atomic_write(info, json.dumps({"holder": holder_name, "pid": os.getpid(),
                                           "pid_start": _process_start(os.getpid()), "since": time.strftime("%H:%M:%S")}))
        except OSError as error:
            raise _unusable(state_dir, error) from None
        yield
    finally:
        info.unlink(missing_ok=True)
        lock.release()
