"""Config sweep for the split kernel: correctness against the float32 reference, then timing at
long context, for every variant given, in one run on the GPU machine.

    python kernels/bench/sweep_verify.py [--variants NAME,NAME...] [--points 131072:16,131072:64,...]

Each variant is checked first (fresh random inputs, output poisoned with NaN; a variant that
fails the check is reported and not timed), then timed with bench_verify.time_ours (median of
do_bench on eager calls, and the same call captured in a CUDA graph and replayed).
Writes $OUT/sweep_verify.json when OUT is set; prints a table last.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_verify as bv  # noqa: E402  (puts the package and the tests folder on sys.path)
from cases import SM_SCALE, make_case, rel_err  # noqa: E402

va = bv.va
V = va.VerifyConfig

VARIANTS = {
    # the Triton-language split kernel on sm_90: session 1's shipped config, then deeper pipelines
    # with smaller tiles (session 2, run 1; all slower, RESULTS.md)
    "n64s2": V(64, 64, 8, 2, 64, True),
    "n32s3": V(64, 32, 8, 3, 64, True),
    "n32s4": V(64, 32, 8, 4, 64, True),
    "n32s4-noidx": V(64, 32, 8, 4, 64, False),
    "n16s4": V(64, 16, 8, 4, 64, True),
    "n16s6": V(64, 16, 8, 6, 64, True),
    # the lock-step Gluon split kernel (verify_gluon.py), sm_90's kernel in session 2
    "gluon-n64": V(64, 64, 8, 1, 64, False, gluon=True),
    # the warp-specialised Gluon kernel: S group, V group, loader; num_stages is its number of K
    # buffers (at least three, so the loader gets a lead: S_{j+1} is issued while tile j is held).
    # This is its layout of sessions 4-12 (the S group keeps 256 columns, Q in shared memory),
    # which fp8 pools ran until session 29; CONFIGS["sm90"] is gluon-ws-n64-now-b16 below
    "gluon-ws": V(64, 32, 4, 4, 64, False, gluon=True, warp_specialized=True),
    # session 8: the same with three K buffers (the room a separate fp8 staging buffer takes)
    "gluon-ws-s3": V(64, 32, 4, 3, 64, False, gluon=True, warp_specialized=True),
    # session 13: the S group keeps 128 output columns (the V group 384), and with q its S reads
    # Q's first 256 columns from registers (16 of its 36 wgmma take one operand from shared memory;
    # CONFIGS["sm90"] for bf16 pools), with qr the rope part too (20 of 36)
    "gluon-ws-c128": V(64, 32, 4, 4, 64, False, gluon=True, warp_specialized=True, s_cols=128),
    "gluon-ws-c128q": V(64, 32, 4, 4, 64, False, gluon=True, warp_specialized=True, s_cols=128, q_regs=1),
    "gluon-ws-c128qr": V(64, 32, 4, 4, 64, False, gluon=True, warp_specialized=True, s_cols=128, q_regs=2),
    # session 27: Q's columns 0..383 in registers (24 of S's 36 wgmma read one operand from shared
    # memory), the loader in 24 registers so that the S group gets 248
    "gluon-ws-c128q3": V(64, 32, 4, 4, 64, False, gluon=True, warp_specialized=True, s_cols=128, q_regs=3),
    # and P.V with P from registers (the V group reads P from shared memory once for both chains)
    "gluon-ws-c128q3p": V(64, 32, 4, 4, 64, False, gluon=True, warp_specialized=True, s_cols=128, q_regs=3,
                          p_regs=True),
    # S_j issued at the top of its own iteration (no S ahead): 32-latent tiles in 4 buffers, and
    # 64-latent tiles in the 2 buffers that then suffice (session 28)
    "gluon-ws-c128q3p-now": V(64, 32, 4, 4, 64, False, gluon=True, warp_specialized=True, s_cols=128, q_regs=3,
                              p_regs=True, s_ahead=False),
    # (P from registers does not build at 64 latents: the V group's wgmma serialise, C7512)
    "gluon-ws-n64q3-now": V(64, 64, 4, 2, 64, False, gluon=True, warp_specialized=True, s_cols=128, q_regs=3,
                            s_ahead=False),
    "gluon-ws-n64q1-now": V(64, 64, 4, 2, 64, False, gluon=True, warp_specialized=True, s_cols=128, q_regs=1,
                            s_ahead=False),
    "gluon-ws-n64-now": V(64, 64, 4, 2, 64, False, gluon=True, warp_specialized=True, s_ahead=False),
    # session 31: the same with bf16 partial outputs, staged through shared memory for whole-row stores
    # (CONFIGS["sm90"] since then)
    "gluon-ws-n64-now-b16": V(64, 64, 4, 2, 64, False, gluon=True, warp_specialized=True, s_ahead=False,
                              partials_bf16=True),
    # session 33: sm_90's config with programmatic dependent launch (VerifyConfig.pdl): the merge
    # launched as the split kernel's dependent (1), the split letting it launch once all its
    # programs run (2), the split launched as its predecessor's dependent too (3)
    **{f"sm90-pdl{level}": dataclasses.replace(va.CONFIGS["sm90"], pdl=level) for level in (1, 2, 3)},
    **{f"sm120-pdl{level}": dataclasses.replace(va.CONFIGS["sm120"], pdl=level) for level in (1, 2, 3)},
    # (session 38's level 1 with the merge released late in each split program, by its loader or
    # its S group, lost as level 2 does at t = 64 and on batches: commit a36a756, RESULTS.md)
    # session 38: sm_90's config with another merge tile at every point (columns x partials a
    # step, stages), for t = 64 below 32k (17 partials a row at 8k: the row tile's 3 steps of 8)
    **{f"sm90-mt{d}x{c}s{st}": dataclasses.replace(va.CONFIGS["sm90"], merge_tile=(d, c, st))
       for d, c, st in ((512, 8, 4), (512, 16, 2), (512, 32, 1), (256, 32, 1), (128, 32, 1), (256, 16, 2))},
    # session 9: sm_120's Triton-language kernel and configs that also build for sm_120a within its
    # 99 KB a block and without spills. Run with DISABLE_MMA_V3=1 (Triton's switch), sm_90 compiles
    # them to mma.sync (HMMA) with the shared memory and registers of the sm_120a build, so the
    # H200 times sm_120's code path, on another chip (without it, 64-row tiles become wgmma).
    # sm_120 holds 100 KB of shared memory an SM, so these run one program an SM there:
    # sm120-w2 (two programs an SM) is only possible on the H200.
    "sm120": va.CONFIGS["sm120"],
    # until session 31: its partial outputs in float32 (since then bf16, as sm_90's)
    "sm120-f32": dataclasses.replace(va.CONFIGS["sm120"], partials_bf16=False),
    "sm120-w2": V(32, 16, 4, 2, waves=2.0),
    "sm120-m32n16w8": V(32, 16, 8, 2),
    "sm120-m32n32w8": V(32, 32, 8, 2),
    "sm120-m32n32w8-idx": V(32, 32, 8, 2, idx_ahead=True),
    "sm120-m64n16w8": V(64, 16, 8, 2),
    "sm120-m16n32w4": V(16, 32, 4, 2),
    "sm120-m32n16w16-idx": V(32, 16, 16, 2, idx_ahead=True),
    "sm120-m16n32w8-idx": V(16, 32, 8, 2, idx_ahead=True),
    "sm120-m32n16w8-idx": V(32, 16, 8, 2, idx_ahead=True),
    # Triton lays both dots over [1, num_warps] warps: with 8 warps a 32-wide S is computed twice
    # and every warp reads all of Q (ncu, RESULTS.md session 9); 4 warps do neither, but spill
    # 96 bytes in the sm_120a build
    "sm120-m32n32w4": V(32, 32, 4, 2),
    "sm120-m32n32w4-idx": V(32, 32, 4, 2, idx_ahead=True),
    # the Gluon kernel over S^T for mma.sync GPUs (verify_mma2.py): Q in registers, 8 warps
    "sm120-mma2": V(32, 32, 8, 2, mma2=True),
    # session 12: the same as two teams of 4 warps and a loader, out of phase (verify_teams.py;
    # sm_120 ran it for bf16 pools in sessions 12-14, and runs sm120-mma2 for fp8 pools)
    "sm120-teams": V(32, 32, 8, 2, mma2=True, teams=True),
    # session 14: the teams' rope part held as one 128-byte line a latent, so that each 8 lanes
    # of the loader copy one line of the pool (verify_teams.py, ROPE_LINES)
    "sm120-teams-lines": V(32, 32, 8, 2, mma2=True, teams=True, rope_lines=True),
    # and the partial sums of S^T in an XOR layout that no store or load meets a bank twice in
    # (verify_teams.py, SUMS_XOR), alone and with the rope lines (CONFIGS["sm120"] since session 15)
    "sm120-teams-xor": V(32, 32, 8, 2, mma2=True, teams=True, sums_xor=True),
    "sm120-teams-lines-xor": V(32, 32, 8, 2, mma2=True, teams=True, rope_lines=True, sums_xor=True),
    # tiles small enough for two programs an SM on sm_120 too (under 50 KB and 32 K registers)
    "sm120-m16n16w4-w2": V(16, 16, 4, 2, waves=2.0),
    "sm120-m16n16w4s3-w2": V(16, 16, 4, 3, waves=2.0),
    # and for fp8 pools, within 99 KB with their fp8 staging (sm120_fp8 is SM120_TRITON_FP8, the
    # fallback without Gluon; sm_120 ran it for fp8 pools until session 10)
    "sm120_fp8": va.SM120_TRITON_FP8,
    "sm120_fp8-m16n32w8-idx": V(16, 32, 8, 2, idx_ahead=True),
    "sm120_fp8-m16n32w4-idx": V(16, 32, 4, 2, idx_ahead=True),
}
# Session 29's s_behind_pv (S_{j+1} issued right behind the S group's P_j.V_j, waited for with
# wgmma.wait_group) was 5% slower at 128k and removed; it is in commit 7a67839, its log in
# bench/results/h200_2026-12-04_s29_behind.log.
# Session 27's seesaw kernel (FlashMLA's schedule: two symmetric MMA groups, each computing S of
# every other tile and half of the output) was measured 7-11% slower at 128k and removed; it is in
# commit efdfb94 (verify_seesaw.py), its logs in bench/results/h200_2026-12-03_s27_*seesaw*.
# Variants measured in session 2 and then removed from the code because they lost (RESULTS.md,
# history 4d, 6a, 6b; their logs are in bench/results/h200_2026-11-29_s2_sweep*.log): "sp-*" (P
# shared through a global scratch in the Triton kernel), "gluon-n64-lazy" (lazy softmax
# rescaling) and "gluon-n64-chain" (S of the next tile issued behind P.V). "gluon-n64" is now
# version 6c; the sweep logs before _sweep5 ran version 5 (_sweep2) or 6.


def parse_points(text):
    """[(prefix lengths, t)] from "L:t,L1+L2+...:t,..." (a point of several lengths is a batch)."""
    return [(tuple(int(x) for x in p.split(":")[0].split("+")), int(p.split(":")[1])) for p in text.split(",")]


def check(cfg, kv_dtype=torch.bfloat16):
    """Largest output relative error and largest lse error over a few problems that exercise
    masks, slices and row blocks (the GPU tests' bounds: 1e-2 and 2e-3); an fp8 pool is scaled
    as bench_verify.py scales it."""
    worst, worst_lse = 0.0, 0.0
    scales = bv._scales(kv_dtype)
    for lens, ts, h, mask in (([0, 40_000, 333, 64], [64, 33, 16, 1], 8, "tree"),
                              ([131_072], [16], 8, "chain"),
                              ([33_000, 5], [16, 3], 16, "tree")):
        case = make_case(lens, ts, h, mask=mask, kv_dtype=kv_dtype)
        n = case["q"].shape[0]
        out = torch.full((n, h, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
        lse = torch.full((n, h), float("nan"), dtype=torch.float32, device="cuda")
        va.verify_attention(case["q"], case["k_extend"], case["kv_cache"], case["kv_indices"],
                            case["kv_indptr"], case["qo_indptr"], case["tree_mask"], SM_SCALE,
                            out=out, lse=lse, max_q_len=case["max_q_len"], config=cfg, **scales)
        ref_o, ref_lse = va.reference_verify_attention(
            case["q"], case["k_extend"], case["kv_cache"], case["kv_indices"], case["kv_indptr"],
            case["qo_indptr"], case["blocks"], SM_SCALE, **scales)
        if torch.isnan(out).any() or torch.isnan(lse).any():
            return float("nan"), float("nan")
        worst = max(worst, rel_err(out, ref_o))
        worst_lse = max(worst_lse, float((lse - ref_lse).abs().max()))
    return worst, worst_lse


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--points", default="131072:16,131072:64,32768:16", help="L:t or L1+L2+...:t, comma-separated")
    ap.add_argument("--phases", action="store_true",
                    help="also time plan + split alone and the merge alone (graph replay)")
    ap.add_argument("--kv-dtype", choices=sorted(bv.KV_DTYPES), default="bf16", help="the pool's dtype (fp8: scaled)")
    a = ap.parse_args()
    kv_dtype = bv.KV_DTYPES[a.kv_dtype]
    names = a.variants.split(",")
    # a point is L:t, or L1+L2+...:t for a batch of requests of those prefix lengths
    points = parse_points(a.points)
    torch.manual_seed(0)
    bw, mm = bv.ceilings()
    head = dict(device=torch.cuda.get_device_name(), copy_bw_TBs=bw / 1e12, mm_TFLOPs=mm / 1e12,
                triton=bv.triton.__version__, torch=torch.__version__, kv_dtype=a.kv_dtype)
    print(json.dumps(head), flush=True)
    rows = []
    for name in names:
        cfg = VARIANTS[name]
        t0 = time.time()
        try:
            err, err_lse = check(cfg, kv_dtype)
        except Exception as e:  # does not compile or does not fit: report and go on
            print(f"{name}: failed {type(e).__name__}: {str(e)[:300]}", flush=True)
            rows.append(dict(name=name, cfg=str(cfg), error=f"{type(e).__name__}: {str(e)[:300]}"))
            continue
        r = dict(name=name, cfg=str(cfg), err=err, err_lse=err_lse, times={})
        ok = err < 1e-2 and err_lse < 2e-3  # False for NaN too
        print(f"{name}: check {'ok' if ok else 'FAILED'} (rel err {err:.2e}, lse err {err_lse:.1e}, "
              f"{time.time() - t0:.0f} s)", flush=True)
        if ok:
            for lens, t in points:
                L = "+".join(map(str, lens))
                ms, ms_g, ns, *phase = bv.time_ours(list(lens), t, 8, cfg, sets=1, phases=a.phases, kv_dtype=kv_dtype)
                byt, fl = bv.work(lens, t, 8, kv_dtype)
                floor = max(byt / bw, fl / mm) * 1e6
                r["times"][f"{L}:{t}"] = dict(us=ms * 1e3, us_graph=ms_g * 1e3, splits=ns, floor_us=floor,
                                              **(phase[0] if phase else {}))
                split_merge = (f"; alone: plan + split {phase[0]['plan_split_us']:.1f}, merge "
                               f"{phase[0]['merge_us']:.1f}") if phase else ""
                print(f"  L={L} t={t}: {ms * 1e3:.1f} us (graph {ms_g * 1e3:.1f}{split_merge}), floor "
                      f"{floor:.1f} us, {100 * floor / (ms_g * 1e3):.1f}% of floor (graph)", flush=True)
        rows.append(r)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "sweep_verify.json"), "w") as f:
            json.dump(dict(head=head, rows=rows), f, indent=1)
    print(f"\n{head}")
    cols = [f"{'+'.join(map(str, lens))}:{t}" for lens, t in points]
    print("| variant | rel err | " + " | ".join(f"L={c.split(':')[0]} t={c.split(':')[1]} us (graph)" for c in cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    for r in rows:
        if "error" in r:
            print(f"| {r['name']} | {r['error'][:60]} |" + " |" * len(cols))
            continue
        cells = [f"{r['times'][c]['us']:.1f} ({r['times'][c]['us_graph']:.1f})" if c in r["times"] else "-" for c in cols]
        print(f"| {r['name']} | {r['err']:.2e} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
