"""Ask the real SGLang 0.5.23 parser (in .venv-sglang) about argv lists.

The project venv cannot import SGLang, so each call runs one subprocess with
the SGLang venv's interpreter (see _driver.py) for a whole batch of requests.
Build the venv with scripts/sglang-real-env.sh.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
VENV_DIR = Path(os.environ.get("SGLANG_REAL_VENV", REPO_ROOT / ".venv-sglang"))
PYTHON = VENV_DIR / "bin" / "python"
DRIVER = Path(__file__).with_name("_driver.py")
STAMP = VENV_DIR / ".sglang-real-complete"


def available() -> bool:
    return PYTHON.exists() and STAMP.exists()


def _run(
    requests: list[dict[str, Any]], timeout: float = 300, env: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [str(PYTHON), str(DRIVER)],
        input=json.dumps(requests),
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})},
    )
    if proc.returncode != 0:
        raise RuntimeError(f"sglang driver failed ({proc.returncode}): {proc.stderr[-4000:]}")
    return json.loads(proc.stdout)


def parse_many(argvs: Sequence[Sequence[str]], env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """For each argv: {"ok": True, "namespace": {...}, "launch_command", "repr"}
    or {"ok": False, "exit_code": 2, "error": "sglang serve: error: ..."}."""
    return _run([{"op": "parse", "argv": list(a)} for a in argvs], env=env)


def parse(argv: Sequence[str]) -> dict[str, Any]:
    return parse_many([argv])[0]


def memory_defaults(argv: Sequence[str], gpu_mem_mib: float, mla: bool = True) -> dict[str, Any]:
    """Real handle_gpu_memory_settings() for a GPU of gpu_mem_mib: the default
    mem_fraction_static / chunked_prefill_size / decode graph max_bs that
    SGLang resolves when the flags are absent. The checkpoint-derived model
    config is replaced by a stand-in (attention arch + not multimodal)."""
    return _run([{"op": "memory_defaults", "argv": list(argv), "gpu_mem_mib": gpu_mem_mib, "mla": mla}])[0]


def memory_defaults_many(
    cases: Sequence[tuple[Sequence[str], float]], mla: bool = True
) -> list[dict[str, Any]]:
    """memory_defaults() for many (argv, gpu_mem_mib) cases in one subprocess."""
    return _run([{"op": "memory_defaults", "argv": list(a), "gpu_mem_mib": g, "mla": mla} for a, g in cases])


def version() -> str:
    return _run([{"op": "version"}])[0]["version"]
