"""SGLang's log line prefixes, written line by line with a flush (journald sees each as it happens)."""

from __future__ import annotations

import sys
import time


def _stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())


def emit(message: str, rank: int | None = None, stream=None) -> None:
    """Print ``[YYYY-MM-DD HH:MM:SS TPn] message`` (launcher lines: no TP part).

    A multi-line message (a traceback) is written as SGLang's logger writes it:
    the prefix on the first line only.
    """
    out = stream or sys.stdout
    tp = f" TP{rank}" if rank is not None else ""
    out.write(f"[{_stamp()}{tp}] {message}\n")
    out.flush()


def ranks(message_for_rank, tp_size: int) -> None:
    """Log one line per TP rank, as SGLang's per-rank model-runner lines appear."""
    for r in range(tp_size):
        emit(message_for_rank(r), rank=r)
