"""opsctl's files on the node: atomic writes and the append-only history of changes."""

from __future__ import annotations

import getpass
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any


def atomic_write(path: Path, text: str, mode: int = 0o644) -> None:
    """Replace `path` with `text` so readers see the old or the new file, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    # The rename itself must reach the disk too, or a crash can bring the old file back. Past the
    # rename the new file is what every reader sees: a failed fsync of the folder (a failing disk)
    # is said, not raised, since a caller would take an error for "the old file is in force".
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as error:
        logging.getLogger(__name__).warning("%s is written, but its folder could not be synced (%s): a crash "
                                            "before the disk catches up may bring the previous file back",
                                            path, error.strerror or error)


def actor() -> str:
    """Who acts: the guard names itself; a person is named by login (through sudo too)."""
    return os.environ.get("OPSCTL_ACTOR") or os.environ.get("SUDO_USER") or getpass.getuser()


def append_record(path: Path, record: dict[str, Any]) -> dict[str, Any]:
    """Append one JSON line and fsync it: the history survives opsctl being killed right after."""
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "epoch": time.time(), **record}
    with open(path, "a") as handle:
        handle.write(json.dumps(record, default=str) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    return record


def read_records(path: Path) -> list[dict[str, Any]]:
    """All records; a torn last line (killed mid-write) is skipped, not fatal."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records
