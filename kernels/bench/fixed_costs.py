"""Where the time of one verify call goes, in graph replay (how SGLang runs verify), on the GPU
machine:

    python kernels/bench/fixed_costs.py [--config sm90] [--lens 1024,131072] [--t 16]

1. Phases: graphs of a trivial kernel (the replay's own cost), of the plan kernel alone, of plan
   + split, of the merge alone and of the whole call. Each phase's cost is its graph time less
   the trivial graph's; what the whole call costs beyond the phases is the gaps between them.
2. Per-program cost: the whole call at 128k with the default split count, then with a half and
   a third of it (fewer programs, each with more tiles). If the split kernel were limited by a
   shared resource (L2 or DRAM bandwidth), fewer programs would each run faster and the time
   would grow less than the tiles per program; if each program is limited by its own latency
   chain, the time grows with the tiles per program.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_verify as bv  # noqa: E402  (puts the package and the tests folder on sys.path)
from cases import SM_SCALE, make_case  # noqa: E402

va = bv.va


def call(c, cfg, ws, ns, t, out, phases=("split", "merge"), lse=None):
    va.verify_attention(c["q"], c["k_extend"], c["kv_cache"], c["kv_indices"], c["kv_indptr"],
                        c["qo_indptr"], c["tree_mask"], SM_SCALE, out=out, lse=lse, workspace=ws, max_q_len=t,
                        num_splits=ns, config=cfg, _phases=phases)


def phases(cfg, L, t, h=8):
    c = make_case([L], [t], h, mask="chain" if t <= 16 else "tree", pool_extra=1024)
    _, ns, _ = va.plan(c["q"], 1, t, None, cfg)
    ws = va.alloc_workspace(1, h, t, ns, "cuda")
    out = torch.empty(c["q"].shape[0], h, 512, dtype=torch.bfloat16, device="cuda")
    tiny = torch.zeros(1, device="cuda")
    plan_fn, plan_const, plan_opts = va.plan_kernel(cfg, 2)
    us = {
        "replay": bv.graph_ms(lambda: tiny.add_(1.0)) * 1e3,
        "plan": bv.graph_ms(lambda: plan_fn[(1,)](c["kv_indptr"], ws[2], 1, ns, **plan_const, **plan_opts)) * 1e3,
        "plan+split": bv.graph_ms(lambda: call(c, cfg, ws, ns, t, out, ("split",))) * 1e3,
        "merge": bv.graph_ms(lambda: call(c, cfg, ws, ns, t, out, ("merge",))) * 1e3,
        "call": bv.graph_ms(lambda: call(c, cfg, ws, ns, t, out)) * 1e3,
    }
    base = us["replay"]
    net = dict(plan=us["plan"] - base, split=us["plan+split"] - us["plan"], merge=us["merge"] - base)
    net["gaps"] = us["call"] - base - sum(net.values())
    print(f"L={L} t={t} splits={ns}: graph us " + ", ".join(f"{k} {v:.1f}" for k, v in us.items()))
    print("   net of the replay: " + ", ".join(f"{k} {v:.1f}" for k, v in net.items()), flush=True)


def per_program(cfg, L, t, h=8):
    c = make_case([L], [t], h, mask="chain" if t <= 16 else "tree", pool_extra=1024)
    _, ns0, _ = va.plan(c["q"], 1, t, None, cfg)
    out = torch.empty(c["q"].shape[0], h, 512, dtype=torch.bfloat16, device="cuda")
    first = None
    for ns in (ns0, ns0 // 2, ns0 // 3):
        ws = va.alloc_workspace(1, h, t, ns, "cuda")
        ms = bv.graph_ms(lambda ws=ws, ns=ns: call(c, cfg, ws, ns, t, out))
        tiles = -(-L // ns // cfg.block_n)
        first = first or (ms, tiles)
        print(f"L={L} t={t} splits={ns}: {ms * 1e3:.1f} us, {tiles} tiles per program; time x"
              f"{ms / first[0]:.2f} for tiles x{tiles / first[1]:.2f}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="sm90", help="a key of CONFIGS")
    ap.add_argument("--lens", default="1024,131072")
    ap.add_argument("--t", type=int, default=16)
    a = ap.parse_args()
    cfg = va.CONFIGS[a.config]
    print(torch.cuda.get_device_name(), cfg, flush=True)
    for L in (int(x) for x in a.lens.split(",")):
        phases(cfg, L, a.t)
    per_program(cfg, 131072, a.t)


if __name__ == "__main__":
    main()
