"""The merge kernel alone, timed in graph replay for several tiles (output columns x partials a
step, pipeline stages) and warp counts, over the points of the results table, for each arch's
config:

    python kernels/bench/merge_tiles.py [--configs sm90,sm120]

Each point runs the whole call once with the launcher's tile (merge_tile) to fill the partials
and its output, then times the merge alone per candidate and checks its output against that one
(the chunking changes only the order of the sums). The first candidate is what the launcher
picks today; a line per point names the fastest.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_verify as bv  # noqa: E402  (puts the package and the tests folder on sys.path)
import sweep_verify  # noqa: E402
from cases import make_case, rel_err  # noqa: E402
from fixed_costs import call  # noqa: E402

va = bv.va
MIX = [1024, 3000, 8192, 20000, 50000, 100000, 131072, 200000]
# (bs = 2 and 3: 34.5 and 23.7 partials a request with sm_90's 66 slices)
# (bs = 4 and 8 at t = 16: 18.3 and 10.1; t = 64: 17 at bs = 1, 9.5 at bs = 2, 3.9 on the mixed batch)
POINTS = [([1024], 16), ([32768], 16), ([131072], 16), ([1024], 64), ([131072], 64), ([32768] * 2, 64),
          ([131072] * 2, 16), ([131072] * 3, 16), ([32768] * 4, 16), ([8192] * 8, 16), (MIX, 16), (MIX, 64)]
# (block_d, chunk, stages, num_warps): the one-round-trip tiles (session 11), then pipelined ones
# (session 22)
CANDIDATES = [(64, 128, 1, 4), (64, 64, 1, 4), (128, 32, 1, 4), (64, 128, 1, 8), (128, 64, 1, 8), (256, 32, 1, 8),
              (512, 8, 4, 4), (512, 16, 3, 4), (512, 16, 3, 8), (256, 16, 3, 4), (256, 32, 3, 4), (128, 64, 2, 4),
              (64, 128, 2, 4), (128, 32, 2, 4), (128, 16, 3, 4), (128, 64, 2, 8)]


def point(cfg, lens, t, h=8):
    c = make_case(lens, [t] * len(lens), h, mask="tree" if t > 16 else "chain", pool_extra=1024)
    _, ns, _ = va.plan(c["q"], len(lens), t, None, cfg)
    ws = va.alloc_workspace(len(lens), h, t, ns, "cuda", config=cfg)
    n = c["q"].shape[0]
    ref = torch.empty(n, h, 512, dtype=torch.bfloat16, device="cuda")
    ref_lse = torch.empty(n, h, dtype=torch.float32, device="cuda")
    call(c, cfg, ws, ns, t, ref, lse=ref_lse)
    shipped = tuple(va.merge_tile(cfg, ns, len(lens))) + (va.MERGE_NUM_WARPS,)
    cands = [shipped] + [x for x in CANDIDATES if x != shipped]
    times = {}
    for bd, chunk, stages, warps in cands:
        va.MERGE_NUM_WARPS = warps
        cand_cfg = dataclasses.replace(cfg, merge_tile=va.MergeTile(bd, chunk, stages))
        out = torch.full_like(ref, float("nan"))
        lse = torch.full_like(ref_lse, float("nan"))
        call(c, cand_cfg, ws, ns, t, out, ("merge",), lse)
        err = rel_err(out, ref)
        ok = not torch.isnan(out).any() and err < 1e-3 and torch.allclose(lse, ref_lse, atol=1e-4, rtol=0)
        times[(bd, chunk, stages, warps)] = bv.graph_ms(
            lambda f=cand_cfg, o=out, x=lse: call(c, f, ws, ns, t, o, ("merge",), x)) * 1e3
        if not ok:
            print(f"   tile {bd}x{chunk}s{stages} w{warps}: WRONG (rel err {err:.2e})")
    va.MERGE_NUM_WARPS = shipped[3]
    best = min(times, key=times.get)
    name = f"bs={len(lens)} L={lens[0] if len(set(lens)) == 1 else 'mixed'} t={t} splits={ns}"
    print(f"{name}: shipped {_tag(shipped)} {times[shipped]:.1f} us, fastest {_tag(best)} {times[best]:.1f} us "
          "(graph replay, merge alone)")
    print("   " + ", ".join(f"{_tag(k)} {v:.1f}" for k, v in times.items()), flush=True)


def _tag(cand):
    bd, chunk, stages, warps = cand
    return f"{bd}x{chunk}s{stages}w{warps}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default="sm90,sm120", help="keys of CONFIGS or sweep_verify.py variants")
    a = ap.parse_args()
    print(torch.cuda.get_device_name(), flush=True)
    for key in a.configs.split(","):
        cfg = va.CONFIGS[key] if key in va.CONFIGS else sweep_verify.VARIANTS[key]
        print(f"== {key}: {cfg}", flush=True)
        for lens, t in POINTS:
            point(cfg, lens, t)


if __name__ == "__main__":
    main()
