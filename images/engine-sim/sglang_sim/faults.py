"""Fault knobs for drills (lab only): a JSON file re-read every 0.5 s, env vars, and POST /_sim/faults.

Keys: crash_at_start (bool), hang_health_generate (bool), hang_scheduler (bool),
slow_start_seconds (number), crash_after_seconds (number),
crash_kind ("illegal_memory_access" | "nccl" | "oom"),
gpu_mem_gib (number: the memory the card reports at the next start, in place of
SGLANG_SIM_GPU_MEM_GIB; a node with a smaller card, or with its memory partly held elsewhere).
"""

from __future__ import annotations

import json
import os

KEYS = {
    "crash_at_start": bool,
    "hang_health_generate": bool,
    "hang_scheduler": bool,
    "slow_start_seconds": float,
    "crash_after_seconds": float,
    "crash_kind": str,
    "gpu_mem_gib": float,
}
CRASH_KINDS = ("illegal_memory_access", "nccl", "oom")


def _coerce(key: str, value):
    kind = KEYS[key]
    if value is None:
        return None
    if kind is bool:
        if isinstance(value, str):
            return value.strip().lower() in ("1", "true", "yes", "on")
        return bool(value)
    if kind is float:
        return float(value)
    value = str(value)
    if key == "crash_kind" and value not in CRASH_KINDS:
        raise ValueError(f"crash_kind must be one of {', '.join(CRASH_KINDS)}")
    return value


def clean(data: dict) -> dict:
    """Keep the known keys with their types; raise ValueError on a bad value."""
    if not isinstance(data, dict):
        raise ValueError("faults must be a JSON object")
    out = {}
    for key, value in data.items():
        if key in KEYS:
            out[key] = _coerce(key, value)
    return out


def from_env(environ: dict | None = None) -> dict:
    """SGLANG_SIM_FAULT_<KEY> variables, e.g. SGLANG_SIM_FAULT_CRASH_AT_START=1."""
    env = os.environ if environ is None else environ
    out = {}
    for key in KEYS:
        raw = env.get("SGLANG_SIM_FAULT_" + key.upper())
        if raw is not None and raw.strip() != "":
            try:
                out[key] = _coerce(key, raw)
            except ValueError:
                pass
    return out


class Faults:
    """The faults in force: env, then the file, then what POST /_sim/faults set."""

    def __init__(self, path: str | None, warn):
        self.path = path
        self.warn = warn
        self.env = from_env()
        self.file: dict = {}
        self.runtime: dict = {}
        self._last_error: str | None = None
        self.reload()

    def reload(self) -> None:
        """Re-read the faults file; a missing or malformed file keeps the simulator up."""
        if not self.path:
            return
        error = None
        try:
            with open(self.path, encoding="utf-8") as fh:
                text = fh.read()
            self.file = clean(json.loads(text)) if text.strip() else {}
        except FileNotFoundError:
            self.file = {}
            error = f"faults file {self.path} not found; no faults from it"
        except (OSError, ValueError) as exc:
            self.file = {}
            error = f"faults file {self.path} ignored: {exc}"
        if error and error != self._last_error:
            self.warn(error)
        self._last_error = error

    def merge(self, data: dict) -> dict:
        self.runtime.update(clean(data))
        return self.current()

    def current(self) -> dict:
        merged = {key: None for key in KEYS}
        for layer in (self.env, self.file, self.runtime):
            merged.update({k: v for k, v in layer.items() if v is not None})
        return merged

    def get(self, key: str):
        return self.current().get(key)
