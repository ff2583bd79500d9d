"""Host-side cost of one verify_attention call (launcher + three launches), per config: wall time
of many back-to-back calls at a small problem, without synchronising, next to the do_bench
(eager) and graph-replay medians of the same call.

    python kernels/bench/host_overhead.py [VARIANT ...]      (default: n64s2 gluon-n64 gluon-ws)

With PROFILE=1, a cProfile of the last variant's calls at the last length follows (where the
host time goes: the launcher's checks, Triton's dispatch, the driver).
"""
import cProfile
import os
import pstats
import sys
import time

import torch
import triton

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import sweep_verify as sv  # noqa: E402
from cases import SM_SCALE, make_case  # noqa: E402

va = sv.va
for L in (1024, 8192):
    c = make_case([L], [16], 8, mask="chain", pool_extra=1024)
    for name in sys.argv[1:] or ("n64s2", "gluon-n64", "gluon-ws"):
        cfg = sv.VARIANTS[name]
        _, ns, _ = va.plan(c["q"], 1, 16, None, cfg)
        ws = va.alloc_workspace(1, 8, 16, ns, "cuda")
        out = torch.empty(16, 8, 512, dtype=torch.bfloat16, device="cuda")

        def f(c=c, out=out, ws=ws, ns=ns, cfg=cfg):  # bind this iteration's problem
            va.verify_attention(c["q"], c["k_extend"], c["kv_cache"], c["kv_indices"], c["kv_indptr"],
                                c["qo_indptr"], c["tree_mask"], SM_SCALE, out=out, workspace=ws,
                                max_q_len=16, num_splits=ns, config=cfg)
        for _ in range(20):
            f()
        torch.cuda.synchronize()
        n = 300
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        ms = triton.testing.do_bench(f, warmup=25, rep=200, return_mode="median")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            f()
        ms_g = triton.testing.do_bench(g.replay, warmup=25, rep=200, return_mode="median")
        print(f"L={L} {name:10s} host {1e6 * (t1 - t0) / n:6.1f} us/call (with drain {1e6 * (t2 - t0) / n:6.1f}), "
              f"do_bench eager {ms * 1e3:6.1f} us, graph {ms_g * 1e3:6.1f} us", flush=True)

if os.environ.get("PROFILE"):
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(300):
        f()
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)
