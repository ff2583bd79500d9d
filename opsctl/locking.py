"""One engine change at a time: `opsctl restart`, `overrides clear` and the guard share a lock."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import click
from filelock import FileLock, Timeout


@contextlib.contextmanager
def engine_lock(state_dir: Path, holder: str, wait_s: float = 0.0) -> Iterator[None]:
    """Hold the engine lock, or fail saying who holds it. The OS drops it if the holder dies."""
    state_dir.mkdir(parents=True, exist_ok=True)
    info = state_dir / "engine.lock.json"
    lock = FileLock(str(state_dir / "engine.lock"))
    try:
        lock.acquire(timeout=wait_s)
    except Timeout:
        who = info.read_text() if info.exists() else "unknown"
        raise click.ClickException(f"another engine change is in progress ({who}); wait for it to finish, "
                                   "or pass --wait-lock SECONDS to queue behind it") from None
    try:
        info.write_text(json.dumps({"holder": holder, "pid": os.getpid(), "since": time.strftime("%H:%M:%S")}))
        yield
    finally:
        info.unlink(missing_ok=True)
        lock.release()
