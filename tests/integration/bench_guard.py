"""Benchmark (not a test): how fast the guard reacts to the seed's OOM on the lab node `dflash-guard`.

    .venv/bin/python tests/integration/bench_guard.py [RUNS]

Needs the node provisioned as the drills provision it (guardlab.provision). For each run: reset to
the seed's config, send the seed's prompts, then read the journal's own timestamps (µs) and the
audit log. Figures per run:
  react  = the guard's first action (its `decision` record) - the journal entry of the OOM line;
  repair = the `outcome ok` record - the OOM line - the engine's own start time (`start_seconds`),
           i.e. what the guard adds to a bare restart. Goals: react < 2 s, repair < 5 s.
"""

import statistics
import sys
import time
from pathlib import Path

from guardlab import NODE_NAME, journal_epoch, records, reset, seed_crash, wait_record
from labnode import LabNode


def main(runs: int) -> None:
    node = LabNode(NODE_NAME, Path("/tmp"))
    react, repair = [], []
    for run in range(runs):
        since = reset(node)
        started = time.time()
        seed_crash(node, base=100 + 10 * run)
        outcome = wait_record(node, since, lambda r: r["event"] == "outcome", timeout=90)
        decision = next(r for r in records(node)[since:] if r["event"] == "decision")
        oom_at = journal_epoch(node, "CUDA out of memory", started)
        assert oom_at is not None and outcome["outcome"] == "ok", outcome
        react.append(decision["epoch"] - oom_at)
        repair.append(outcome["epoch"] - oom_at - outcome["start_seconds"])
        print(f"run {run + 1}: react {react[-1]:.3f} s, repair {repair[-1]:.3f} s "
              f"(engine start {outcome['start_seconds']} s, rung {decision['rung']})")
    print(f"react:  median {statistics.median(react):.3f} s, max {max(react):.3f} s (goal < 2 s)")
    print(f"repair: median {statistics.median(repair):.3f} s, max {max(repair):.3f} s (goal < 5 s)")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
