"""How long the split and merge take for each chunk the plan could cut a batch into: the tool
that set PLAN_FIT_PCT (RESULTS.md, session 23). Run it on a new card (the RTX PRO 6000 has 188
SMs, not 132) to check that stretch there:

    python kernels/bench/plan_chunks.py 8x32768:16,1024+50000+200000:16,48x1024:16 sm90,sm120

For each batch (N x L or L1+L2+..., then :t) it times, in graph replay, the launcher as shipped
(its plan kernel included), then split + merge with the plan written from the host for each
candidate chunk: the plan's base chunk and the smallest chunks that fit the grid's columns
(num_splits), a few more, or half the batch more. A candidate's output must match the shipped
plan's within the bf16 bound.
"""
from __future__ import annotations

import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_verify as bv  # noqa: E402  (puts the package and the tests folder on sys.path)
from cases import SM_SCALE, make_case  # noqa: E402

va = bv.va
HEADS = 8


def host_plan(lens, num_splits, chunk):
    """The plan kernel's output for a given chunk (see _verify_plan_kernel)."""
    batch, slots = len(lens), num_splits + len(lens)
    plan = torch.zeros(va.workspace_shape(batch, 1, 1, num_splits)[2], dtype=torch.int32)
    plan[:slots, 0] = batch  # unused slot
    p = 0
    for i, length in enumerate(lens):
        n = -(-length // chunk)
        plan[slots + i, :2] = torch.tensor([p, n])
        for k in range(n):
            plan[p, :3] = torch.tensor([i, k * chunk, min(length, (k + 1) * chunk)])
            p += 1
    return plan, p


def slices(lens, chunk):
    return sum(-(-length // chunk) for length in lens)


class _NoLaunch:
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def time_batch(cfg, lens, t):
    batch = len(lens)
    n_sets = max(1, min(8, math.ceil(256e6 / bv.work(lens, t, HEADS)[0])))
    cases = [make_case(lens, [t] * batch, HEADS, mask="tree" if t > 16 else "chain", pool_extra=1024)
             for _ in range(n_sets)]
    _, ns, _ = va.plan(cases[0]["q"], batch, t, None, cfg)
    bn = cfg.block_n
    chunk0 = max(math.ceil(sum(lens) / ns), cfg.min_chunk)
    chunk0 = math.ceil(chunk0 / bn) * bn
    candidates = {chunk0}
    for columns in (ns, ns + 2, ns + 4, ns + batch // 2):
        chunk = chunk0
        while slices(lens, chunk) > columns and chunk < max(lens):
            chunk += bn
        candidates.add(chunk)
    ws = va.alloc_workspace(batch, HEADS, t, ns, "cuda")
    outs = [torch.empty(c["q"].shape[0], HEADS, va.D_NOPE, dtype=torch.bfloat16, device="cuda") for c in cases]
    step = [0]

    def call():
        i = step[0] % n_sets
        step[0] += 1
        c = cases[i]
        va.verify_attention(c["q"], c["k_extend"], c["kv_cache"], c["kv_indices"], c["kv_indptr"], c["qo_indptr"],
                            c["tree_mask"], SM_SCALE, out=outs[i], workspace=ws, max_q_len=t, num_splits=ns,
                            config=cfg)

    def run_all():
        step[0] = 0
        for _ in range(n_sets):
            call()
        torch.cuda.synchronize()
        return [o.float() for o in outs]

    shipped = run_all()
    step[0] = 0
    cells = [f"shipped plan {bv.graph_ms(call) * 1e3:.1f} us"]
    plan_kernel = va.plan_kernel
    try:
        va.plan_kernel = lambda *args, **kwargs: (_NoLaunch(), {}, {})  # the host's plan stays in the workspace
        for chunk in sorted(candidates):
            plan, used = host_plan(lens, ns, chunk)
            ws[2].copy_(plan.to(ws[2].device))
            err = max(((o - r).abs().max() / r.abs().max()).item() for o, r in zip(run_all(), shipped, strict=True))
            step[0] = 0
            us = bv.graph_ms(call) * 1e3
            cells.append(f"chunk {chunk} ({used} slices) {us:.1f} us" + ("" if err < 2e-2 else f" WRONG {err:.2g}"))
    finally:
        va.plan_kernel = plan_kernel
    return ns, cells


def parse_batch(spec):
    lens, t = spec.split(":")
    if "x" in lens:
        n, length = lens.split("x")
        return [int(length)] * int(n), int(t)
    return [int(x) for x in lens.split("+")], int(t)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(bv.triton.__version__, torch.__version__, torch.cuda.get_device_name(), flush=True)
    for name in sys.argv[2].split(","):
        for spec in sys.argv[1].split(","):
            lens, t = parse_batch(spec)
            ns, cells = time_batch(va.CONFIGS[name], lens, t)
            print(f"{name} {spec} (num_splits {ns}): " + " | ".join(cells), flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
