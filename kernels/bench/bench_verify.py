"""Verify attention: ours next to SGLang's Triton verify path (extend_attention_fwd with a tree mask),
same inputs, one run, on one GPU.

    PEER_DIR=.peer python kernels/bench/bench_verify.py [--sweep] [--quick] [--kv-dtype fp8_e4m3]
                                                        [--config triton] [--kv-indices int64]

Per point (bs requests, h heads, t draft tokens each, prefix L_b, page_size 1 scattered slots):
  bytes = sum_b (L_b * 576 * s + t * 576 * 2)  each latent row read once, s = 2 (bf16 pool) or
                                               1 (fp8 pool); draft latents bf16 (q, out: < 1%)
  flops = sum_b 2 * t * h * (L_b + t) * (576 + 512)   Q.K^T over 576 + P.V over 512
  floor = max(bytes / copy_bw, flops / mm_rate), both ceilings measured in this run
          (copy_bw: device-to-device copy, bytes read + written; mm_rate: 8192^3 bf16 matmul).
Writes $OUT/bench_verify.json (when OUT is set) and prints the table last; `--table-from JSON`
prints a saved run's table again (no GPU). "ours % floor" is the eager call's share of the floor,
"graph % floor" that of one call in graph replay, as SGLang runs the verify step.
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import json
import math
import os
import sys

import torch
import triton

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
va = importlib.import_module("dflash_kernels.verify_attention")
from cases import SM_SCALE, load_peer, make_case, run_peer  # noqa: E402

DK, DV = 576, 512
# --kv-dtype: the pool's torch dtype; an fp8 pool gets scales (SGLang's k/v descale) on both sides
KV_DTYPES = {"bf16": torch.bfloat16, "fp8_e4m3": torch.float8_e4m3fn}
# --kv-indices: int32 (the tests' default) or int64 (what SGLang's Triton backend passes)
INDEX_DTYPES = {"int32": torch.int32, "int64": torch.int64}
FP8_SCALES = dict(k_scale=0.5, v_scale=0.5)
# --config: the plan's own choice for the card and pool, sm_90's Triton-language config (its
# fallback without Gluon, and its fp8 path before session 8: one run can set either beside the
# other), sm_120's config, or sm_120's Triton-language fallbacks without Gluon for bf16 and fp8
# pools (on sm_90 with DISABLE_MMA_V3=1, the mma.sync code sm_120 runs; sweep_verify.py says why)
CONFIG_CHOICES = {"auto": None, "triton": va.SM90_TRITON, "sm120": va.CONFIGS["sm120"],
                  "sm120_triton": va.SM120_TRITON, "sm120_triton_fp8": va.SM120_TRITON_FP8}


def ceilings():
    x = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = triton.testing.do_bench(lambda: y.copy_(x), warmup=50, rep=300, return_mode="median")
    bw = 2 * x.numel() / (ms * 1e-3)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = triton.testing.do_bench(lambda: a @ b, warmup=50, rep=300, return_mode="median")
    return bw, 2 * 8192**3 / (ms * 1e-3)


def work(lens, t, h, kv_dtype=torch.bfloat16):
    byt = sum(L * DK * kv_dtype.itemsize + t * DK * 2 for L in lens)
    fl = sum(2 * t * h * (L + t) * (DK + DV) for L in lens)
    return byt, fl


def graph_ms(f):
    """Median time of f captured once in a CUDA graph and replayed: what SGLang's captured
    decode step would see."""
    f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        f()
    return triton.testing.do_bench(g.replay, warmup=25, rep=200, return_mode="median")


def _scales(kv_dtype):
    return {} if kv_dtype == torch.bfloat16 else FP8_SCALES


def time_ours(lens, t, h, variant=None, sets=None, merge_only=False, phases=False, kv_dtype=torch.bfloat16,
              idx_dtype=torch.int32):
    """Median time of one verify call; rotates input sets so small problems do not sit in L2.
    Returns (eager ms, graph ms, splits) and, with merge_only, the eager time of the merge alone;
    with phases, a dict of graph times of the plan and split kernels alone and the merge alone."""
    cfg = variant
    byt, _ = work(lens, t, h, kv_dtype)
    n_sets = sets or max(1, min(8, math.ceil(256e6 / byt)))
    cases = [make_case(lens, [t] * len(lens), h, mask="tree" if t > 16 else "chain",
                       pool_extra=1024, kv_dtype=kv_dtype, idx_dtype=idx_dtype) for _ in range(n_sets)]
    c0 = cases[0]
    scales = _scales(kv_dtype)
    _, ns, _ = va.plan(c0["q"], len(lens), t, None, cfg)
    ws = va.alloc_workspace(len(lens), h, t, ns, "cuda", config=cfg)
    outs = [torch.empty(c["q"].shape[0], h, DV, dtype=torch.bfloat16, device="cuda") for c in cases]
    it = [0]

    def f(_phases=("split", "merge")):
        i = it[0] % n_sets
        it[0] += 1
        c = cases[i]
        va.verify_attention(c["q"], c["k_extend"], c["kv_cache"], c["kv_indices"], c["kv_indptr"],
                            c["qo_indptr"], c["tree_mask"], SM_SCALE, out=outs[i], workspace=ws,
                            max_q_len=t, num_splits=ns, config=cfg, _phases=_phases, **scales)

    ms = triton.testing.do_bench(f, warmup=25, rep=200, return_mode="median")
    it[0] = 0
    ms_g = graph_ms(f)
    if phases:
        it[0] = 0
        split_ms = graph_ms(lambda: f(("split",)))
        it[0] = 0
        merge_ms = graph_ms(lambda: f(("merge",)))
        return ms, ms_g, ns, dict(plan_split_us=split_ms * 1e3, merge_us=merge_ms * 1e3)
    if merge_only:
        it[0] = 0
        ms_m = triton.testing.do_bench(lambda: f(("merge",)), warmup=25, rep=100, return_mode="median")
        return ms, ms_g, ns, ms_m
    return ms, ms_g, ns


def time_peer(peer, lens, t, h, kv_dtype=torch.bfloat16, idx_dtype=torch.int32):
    c = make_case(lens, [t] * len(lens), h, mask="tree" if t > 16 else "chain", pool_extra=1024, kv_dtype=kv_dtype,
                  idx_dtype=idx_dtype)
    out = torch.empty(c["q"].shape[0], h, DV, dtype=torch.bfloat16, device="cuda")
    scales = _scales(kv_dtype)
    run_peer(peer, c, out, **scales)  # compile
    return triton.testing.do_bench(lambda: run_peer(peer, c, out, **scales), warmup=25, rep=200,
                                   return_mode="median")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true", help="time several configs at 128k first")
    ap.add_argument("--quick", action="store_true", help="fewer lengths")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--kv-dtype", choices=sorted(KV_DTYPES), default="bf16",
                    help="the pool's dtype (fp8: scaled)")
    ap.add_argument("--kv-indices", choices=sorted(INDEX_DTYPES), default="int32",
                    help="kv_indices dtype (SGLang's Triton backend passes int64)")
    ap.add_argument("--config", choices=sorted(CONFIG_CHOICES), default="auto",
                    help="split kernel config for the table (auto: the plan's choice; triton: sm_90's "
                         "Triton-language config, SM90_TRITON, its fallback without Gluon; sm120: "
                         "CONFIGS['sm120']; sm120_triton, sm120_triton_fp8: its fallbacks)")
    ap.add_argument("--table-from", metavar="JSON", help="print the table of a saved run (its bench_verify.json) "
                                                           "and exit; needs no GPU")
    a = ap.parse_args()
    if a.table_from:
        with open(a.table_from) as f:
            print(render_table(json.load(f)))
        return
    kv_dtype = KV_DTYPES[a.kv_dtype]
    idx_dtype = INDEX_DTYPES[a.kv_indices]
    if a.sweep and kv_dtype != torch.bfloat16:
        ap.error("--sweep times the bf16 configs; leave it out with --kv-dtype fp8_e4m3")
    if a.sweep and a.config != "auto":
        ap.error("--sweep chooses the table's config itself; leave out --config")

    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    bw, mm = ceilings()
    head = dict(device=torch.cuda.get_device_name(), sms=props.multi_processor_count,
                date=datetime.date.today().isoformat(), triton=triton.__version__,
                torch=torch.__version__, copy_bw_TBs=bw / 1e12, mm_TFLOPs=mm / 1e12, kv_dtype=a.kv_dtype,
                kv_indices=a.kv_indices, config=a.config)
    print(json.dumps(head))
    peer = None if a.no_peer else load_peer()
    result = dict(head=head, sweep=[], rows=[])

    tried = []
    if a.sweep:
        V = va.VerifyConfig
        # the best Triton-language config, the lock-step Gluon kernel and the shipped
        # warp-specialised one (sweep_verify.py holds every variant tried, with a correctness
        # check each)
        variants = [V(64, 64, 8, 2, 64, True), V(64, 64, 8, 1, 64, gluon=True), va.CONFIGS["sm90"]]
        for t in (16, 64):
            for v in variants:
                try:
                    ms, ms_g, ns, ms_m = time_ours([131072], t, 8, v, sets=1, merge_only=True)
                except Exception as e:  # a config that does not fit: report and go on
                    print(f"sweep t={t} {v}: failed {type(e).__name__}: {str(e)[:200]}")
                    continue
                byt, fl = work([131072], t, 8)
                floor = max(byt / bw, fl / mm) * 1e3
                r = dict(t=t, cfg=str(v), splits=ns, us=ms * 1e3, us_graph=ms_g * 1e3,
                         merge_us=ms_m * 1e3, pct=100 * floor / ms)
                result["sweep"].append(r)
                tried.append((t, ms_g, v))  # chosen by graph replay, as SGLang runs verify
                print(f"sweep t={t:3d} {v} splits={ns}: {ms*1e3:8.1f} us "
                      f"(graph {ms_g*1e3:8.1f}, merge alone {ms_m*1e3:6.1f})  {r['pct']:5.1f}% of floor", flush=True)

    Ls = [1024, 8192, 32768, 131072, 200000] if a.quick else \
        [1024, 4096, 8192, 16384, 32768, 65536, 131072, 200000]
    points = [([L], t) for t in (16, 64) for L in Ls]
    mix = [1024, 3000, 8192, 20000, 50000, 100000, 131072, 200000]
    points += [(mix, 16), (mix, 64), ([32768] * 8, 16)]
    best = {}
    for t, ms, v in tried:
        if t not in best or ms * 1e3 < best[t][0]:
            best[t] = (ms * 1e3, v)
    for t, (us, v) in best.items():
        print(f"table uses for t={t}: {v} ({us:.1f} us graph at 128k)")
    result["table_variants"] = {t: str(v) for t, (us, v) in best.items()}
    for lens, t in points:
        h = 8
        cfg = best[t][1] if t in best else CONFIG_CHOICES[a.config]
        ms, ms_g, ns = time_ours(lens, t, h, cfg, kv_dtype=kv_dtype, idx_dtype=idx_dtype)
        pms = time_peer(peer, lens, t, h, kv_dtype, idx_dtype) if peer is not None else float("nan")
        byt, fl = work(lens, t, h, kv_dtype)
        floor = max(byt / bw, fl / mm) * 1e3
        r = dict(bs=len(lens), lens=lens, t=t, h=h, splits=ns, ours_us=ms * 1e3,
                 ours_graph_us=ms_g * 1e3, peer_us=pms * 1e3, floor_us=floor * 1e3,
                 bound="memory" if byt / bw > fl / mm else "compute",
                 ours_GBs=byt / (ms * 1e-3) / 1e9, ours_TFLOPs=fl / (ms * 1e-3) / 1e12,
                 ours_pct_floor=100 * floor / ms, peer_pct_floor=100 * floor / pms,
                 speedup=pms / ms)
        result["rows"].append(r)
        print(f"bs={len(lens)} t={t} L={max(lens)}: ours {ms*1e3:.1f} us, peer {pms*1e3:.1f} us", flush=True)

    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "bench_verify.json"), "w") as f:
            json.dump(result, f, indent=1)
    print("\n" + render_table(result))


def render_table(result) -> str:
    """The results table of a run (its bench_verify.json): eager calls side by side (time,
    speedup, GB/s, TFLOP/s, share of the floor), and our call in graph replay with its share of
    the floor, the figure that counts for SGLang, which captures the verify step in a graph."""
    head = result["head"]
    lines = [f"{head['device']}  copy {head['copy_bw_TBs']:.2f} TB/s  matmul {head['mm_TFLOPs']:.0f} TFLOP/s  "
             f"triton {head['triton']}  torch {head['torch']}  {head['date']}",
             "| bs | L (max) | t | ours us | graph us | peer us | speedup | GB/s | TFLOP/s | floor us | bound "
             "| ours % floor | graph % floor | peer % floor |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        L = r["lens"][0] if r["bs"] == 1 else f"mix {max(r['lens'])}" if len(set(r["lens"])) > 1 else f"{r['lens'][0]} x{r['bs']}"
        graph_pct = 100 * r["floor_us"] / r["ours_graph_us"]
        lines.append(f"| {r['bs']} | {L} | {r['t']} | {r['ours_us']:.1f} | {r['ours_graph_us']:.1f} | {r['peer_us']:.0f} | "
                     f"{r['speedup']:.0f}x | {r['ours_GBs']:.0f} | {r['ours_TFLOPs']:.0f} | {r['floor_us']:.1f} | "
                     f"{r['bound']} | {r['ours_pct_floor']:.1f}% | {graph_pct:.1f}% | {r['peer_pct_floor']:.2f}% |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
