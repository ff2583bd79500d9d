"""Fixtures for the engine simulator: import path and a simulator subprocess on a free port."""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
import time

import httpx
import pytest

SIM_ROOT = pathlib.Path(__file__).resolve().parents[2] / "images" / "engine-sim"
if str(SIM_ROOT) not in sys.path:
    sys.path.insert(0, str(SIM_ROOT))

BASE_FLAGS = [
    "--model-path",
    "/models/Kimi-K2.6",
    "--tp",
    "8",
    "--context-length",
    "200000",
    "--speculative-algorithm",
    "DFLASH",
    "--speculative-draft-model-path",
    "/models/dflash-draft",
    "--speculative-num-draft-tokens",
    "16",
    "--attention-backend",
    "triton",
    "--host",
    "127.0.0.1",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Sim:
    """A running simulator: ``url``, ``proc``, ``output()`` (stdout+stderr so far)."""

    def __init__(self, flags, env, tmp_path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp_path / f"sim-{self.port}.log"
        self._log = open(self.log_path, "wb")
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_SIM_", "PYTORCH_"))}
        full_env.update({"PYTHONPATH": str(SIM_ROOT), "SGLANG_SIM_TIME_FACTOR": "0.002"})
        full_env.update(env)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sglang_sim", *flags, "--port", str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=full_env,
        )

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    def wait_ready(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"simulator exited {self.proc.returncode}:\n{self.output()}")
            if "The server is fired up and ready to roll!" in self.output():
                return
            time.sleep(0.02)
        raise AssertionError(f"simulator not ready:\n{self.output()}")

    def wait_exit(self, timeout: float = 15.0) -> int:
        return self.proc.wait(timeout=timeout)

    def client(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30.0, **kw)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)
        self._log.close()


@pytest.fixture
def start_sim(tmp_path):
    """Start a simulator: ``start_sim(extra_flags, env=..., ready=True)``."""
    sims = []

    def start(extra=(), env=None, ready=True, base=True):
        flags = (BASE_FLAGS if base else []) + list(extra)
        sim = Sim(flags, env or {}, tmp_path)
        sims.append(sim)
        if ready:
            sim.wait_ready()
        return sim

    yield start
    for sim in sims:
        sim.stop()


def words(n: int, tag: str) -> str:
    """A prompt of exactly n tokens (one per word), unique per tag."""
    return " ".join(f"{tag}{i}" for i in range(n))
