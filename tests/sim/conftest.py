"""Fixtures for the engine simulator: import path and a simulator subprocess on a free port."""

from __future__ import annotations

import pathlib
import sys

import httpx
import pytest

SIM_ROOT = pathlib.Path(__file__).resolve().parents[2] / "images" / "engine-sim"
if str(SIM_ROOT) not in sys.path:
    sys.path.insert(0, str(SIM_ROOT))
from sglang_sim.process import SimProcess  # noqa: E402

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


class Sim(SimProcess):
    """A running simulator with the tests' defaults (time factor 0.002) and an HTTP client."""

    def __init__(self, flags, env, tmp_path):
        super().__init__(flags, tmp_path, {"SGLANG_SIM_TIME_FACTOR": "0.002", **env})

    def client(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30.0, **kw)


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
