"""The lab engine (images/engine-sim/sglang_sim) as `opsctl bench` meets it: a running simulator
with the seed's flags, and what its timing model says a point should measure.

Shared by test_bench_sim.py (what the benchmark must get right on any machine) and
bench_sim_accuracy.py (how close it comes to the model on this one, printed, not asserted).
BENCH_SIM_DIR points at another copy of the simulator (default: images/engine-sim).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SIM_DIR = Path(os.environ.get("BENCH_SIM_DIR") or ROOT / "images" / "engine-sim")
HAVE_SIM = (SIM_DIR / "sglang_sim" / "timing.py").exists()
if HAVE_SIM:
    sys.path.insert(0, str(SIM_DIR))
    from sglang_sim import timing
    from sglang_sim.process import SimProcess
else:  # (the tests skip; the benchmark says so)
    timing = None
    SimProcess = object

# Accuracy runs: step times must be long against the event loop's ~1 ms timer granularity
# and the per-chunk HTTP cost, or those, not the model, are what gets measured.
ACCURACY_TIME_FACTOR = 0.25
# Behaviour runs (cache, crash, resume): only the order of events matters.
FAST_TIME_FACTOR = 0.01
# The seed's server: Kimi K2.6, TP8, DFlash (accept length 1 unless SGLANG_SIM_ACCEPT_LENGTH).
SEED_FLAGS = ["--model-path", "moonshotai/Kimi-K2.6", "--tp", "8", "--speculative-algorithm", "DFLASH",
              "--speculative-draft-model-path", "z-lab/Kimi-K2.6-DFlash"]
# The seed's fixed config, without CUDA-graph capture (31 model seconds of start-up a run does not need).
ACCURACY_FLAGS = ["--mem-fraction-static", "0.93", "--chunked-prefill-size", "4096", "--disable-cuda-graph"]
ACCURACY_ENV = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
CHUNK = 4096


class Sim(SimProcess):
    """The seed's server at a time factor, with no weight-load wait; healthy when constructed
    (stopped again if it never gets there)."""

    def __init__(self, tmp: Path, flags: list[str], time_factor: float, env: dict | None = None) -> None:
        super().__init__([*SEED_FLAGS, *flags], tmp,
                         {"SGLANG_SIM_TIME_FACTOR": str(time_factor), "SGLANG_SIM_LOAD_SECONDS": "0", **(env or {})})
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def journal_excerpt(self) -> str:
        lines = self.output().splitlines()
        start = next(
            (i for i, line in enumerate(lines) if "Scheduler hit an exception" in line),
            max(0, len(lines) - 15),
        )
        return "\n".join(lines[start : start + 40])


def truth(prompt_tokens: int, gen: int, factor: float, chunk: int = CHUNK) -> dict:
    """TTFT, mean step time and decode rate the simulator's model gives, in wall seconds
    (accept length 1: one token a step)."""
    steps = [timing.decode_step_seconds(prompt_tokens + 1 + i) for i in range(gen - 1)]
    return {
        "ttft_s": timing.prefill_seconds(prompt_tokens, 0, chunk) * factor,
        "step_ms": sum(steps) / len(steps) * factor * 1e3,
        "decode_tok_s": (gen - 1) / (sum(steps) * factor),
    }
