"""Benchmark (not a test): how close `opsctl bench` comes to the lab engine's timing model on this
machine. The tests (test_bench_sim.py) check what holds on any machine; a busy one stretches the
figures here, so they are printed, with their goals, instead of asserted.

    .venv/bin/python tests/integration/bench_sim_accuracy.py

Per point of a sweep (1.4k-16k, 160 tokens, median of 3) and for 4 concurrent 8k streams:
  TTFT offset = measured TTFT - the model's prefill (the HTTP round trip and the prompt's parsing;
                goal: 0 to 15 ms, the same at every length);
  step, decode = measured against the model (goal: within 3%);
  queue gaps  = between the concurrent streams' first tokens, against one prefill (goal: within 10%).
"""

from __future__ import annotations

import itertools
import statistics
import sys
import tempfile
from pathlib import Path

from simbench import ACCURACY_ENV, ACCURACY_FLAGS, ACCURACY_TIME_FACTOR, HAVE_SIM, Sim, truth

from opsctl.bench.client import BenchClient
from opsctl.bench.runner import SweepSettings, run_concurrency, run_sweep

CONTEXTS, GEN = [1400, 4000, 11000, 16000], 160


def sweep(sim: Sim) -> None:
    with BenchClient(sim.url) as client:
        result = run_sweep(SweepSettings(contexts=CONTEXTS, gen=GEN, repeats=3), client)
    offsets = []
    print("point   TTFT offset   step vs model   decode vs model")
    for p in result.points:
        want = truth(int(p.prompt_tokens), GEN, ACCURACY_TIME_FACTOR)
        offsets.append(p.ttft_s - want["ttft_s"])
        print(f"{p.context_requested:>6}  {offsets[-1] * 1e3:8.1f} ms  {p.step_ms / want['step_ms'] - 1:+12.2%}"
              f"  {p.decode_tok_s / want['decode_tok_s'] - 1:+14.2%}")
    print(f"TTFT offsets spread {(max(offsets) - min(offsets)) * 1e3:.1f} ms (goal < 10 ms); "
          f"prefill fit r2 {result.fit['r2']:.4f}")


def concurrency(sim: Sim, context: int = 8000, streams: int = 4, gen: int = 120) -> None:
    with BenchClient(sim.url) as client:
        result = run_concurrency(client, context, streams, gen)
    want = truth(context, gen, ACCURACY_TIME_FACTOR)
    ttfts = sorted(s.ttft_s for s in result.samples)
    gaps = [later - earlier for earlier, later in itertools.pairwise(ttfts)]
    print(f"{streams} x {context}: queue gaps against one prefill "
          + ", ".join(f"{g / want['ttft_s'] - 1:+.1%}" for g in gaps)
          + f"; decode against the model, median {statistics.median(s.decode_tok_s for s in result.samples) / want['decode_tok_s'] - 1:+.2%}")


def main() -> int:
    if not HAVE_SIM:
        print("the lab engine (images/engine-sim/sglang_sim) is not here", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        sim = Sim(Path(tmp), ACCURACY_FLAGS, ACCURACY_TIME_FACTOR, ACCURACY_ENV)
        try:
            sweep(sim)
            concurrency(sim)
        finally:
            sim.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
