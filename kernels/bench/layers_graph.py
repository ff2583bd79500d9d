"""Verify attention per layer inside one CUDA graph of several layers, beside one call per graph.

    python kernels/bench/layers_graph.py [--layers 8] [--points 1024:16,32768:16,131072:16,...]
                                         [--variant NAME] [--plugin]

SGLang captures a whole verify step (every layer) in one CUDA graph, so a layer's attention does
not pay a graph launch of its own. bench_verify.py times one call captured alone, which does
(about 5 us on the H200, RESULTS.md session 5). Here N calls, each with its own KV pool, query and
output (as N layers have; they share one workspace, as the SGLang plugin's calls do), are captured
in one graph; the replay's median time divided by N is the per-layer figure. Both figures are
printed, with the floor of bench_verify.py (both ceilings measured in this run).

With --plugin, each layer also calls the SGLang plugin's `MlaVerify` as SGLang's Triton backend
does (DFlash's chains: no custom mask, causal; every call reads the draft block the plugin built
once), beside the launcher with a mask packed beforehand.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_verify as bv  # noqa: E402  (puts the package and the tests folder on sys.path)
import sweep_verify  # noqa: E402
from cases import SM_SCALE, make_case  # noqa: E402
from dflash_kernels.sglang_plugin import MlaVerify  # noqa: E402

va = bv.va


def per_layer_us(lens, t, h, layers, cfg, form="launcher"):
    """(one call in its own graph, per layer in a graph of `layers` calls), us. form: "launcher"
    (verify_attention, mask packed beforehand) or "plugin" (MlaVerify, chains)."""
    chains = form != "launcher" or t <= 16
    cases = [make_case(lens, [t] * len(lens), h, mask="chain" if chains else "tree", pool_extra=1024)
             for _ in range(layers)]
    _, ns, _ = va.plan(cases[0]["q"], len(lens), t, None, cfg)
    ws = va.alloc_workspace(len(lens), h, t, ns, "cuda")
    outs = [torch.empty(c["q"].shape[0], h, 512, dtype=torch.bfloat16, device="cuda") for c in cases]
    plugin_call = MlaVerify()

    def call(i):
        c = cases[i]
        if form == "launcher":
            va.verify_attention(c["q"], c["k_extend"], c["kv_cache"], c["kv_indices"], c["kv_indptr"],
                                c["qo_indptr"], c["tree_mask"], SM_SCALE, out=outs[i], workspace=ws,
                                max_q_len=t, num_splits=ns, config=cfg)
            return
        n = c["q"].shape[0]
        k_buffer = c["kv_cache"].view(-1, 1, va.D_LATENT)  # SGLang's MLA pool, V a view of its rows
        k = c["k_extend"].view(n, 1, va.D_LATENT)
        served = plugin_call(c["q"], k, k, outs[i], k_buffer, k_buffer[..., :512], c["qo_indptr"], c["kv_indptr"],
                             c["kv_indices"], None, True, None, t, sm_scale=SM_SCALE, max_bs=len(lens))
        assert served, plugin_call.last_reason

    one = bv.graph_ms(lambda: call(0))
    for i in range(layers):  # compile and warm up outside the capture
        call(i)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(layers):
            call(i)
    many = triton.testing.do_bench(g.replay, warmup=10, rep=200, return_mode="median")
    return one * 1e3, many * 1e3 / layers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--points", default="1024:16,32768:16,65536:16,131072:16,200000:16,131072:64",
                    help="L:t or L1+L2+...:t, comma-separated")
    ap.add_argument("--variant", default=None, help="a sweep_verify.py variant (default: the plan's choice)")
    ap.add_argument("--plugin", action="store_true", help="also per layer through the SGLang plugin (chains)")
    a = ap.parse_args()
    cfg = sweep_verify.VARIANTS[a.variant] if a.variant else None
    torch.manual_seed(0)
    bw, mm = bv.ceilings()
    head = dict(device=torch.cuda.get_device_name(), copy_bw_TBs=bw / 1e12, mm_TFLOPs=mm / 1e12,
                layers=a.layers, variant=a.variant or "auto", triton=triton.__version__, torch=torch.__version__)
    print(json.dumps(head), flush=True)
    rows = []
    for lens, t in sweep_verify.parse_points(a.points):
        one, per = per_layer_us(lens, t, 8, a.layers, cfg)
        byt, fl = bv.work(lens, t, 8)
        floor = max(byt / bw, fl / mm) * 1e6
        rows.append(dict(lens=list(lens), t=t, one_call_graph_us=one, per_layer_us=per, floor_us=floor))
        print(f"L={'+'.join(map(str, lens))} t={t}: one call per graph {one:.1f} us, per layer in a graph of "
              f"{a.layers} {per:.1f} us, floor {floor:.1f} us ({100 * floor / per:.1f}% of it per layer)", flush=True)
        if a.plugin:
            rows[-1]["plugin_per_layer_us"] = per_layer_us(lens, t, 8, a.layers, cfg, "plugin")[1]
            print(f"  through the plugin (chains), per layer: {rows[-1]['plugin_per_layer_us']:.1f} us", flush=True)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "layers_graph.json"), "w") as f:
            json.dump(dict(head=head, rows=rows), f, indent=1)
    print(f"\n| L | t | one call per graph (us) | per layer, graph of {a.layers} (us) | floor (us) | % of floor per layer |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {'+'.join(map(str, r['lens']))} | {r['t']} | {r['one_call_graph_us']:.1f} | {r['per_layer_us']:.1f} | "
              f"{r['floor_us']:.1f} | {100 * r['floor_us'] / r['per_layer_us']:.1f}% |")


if __name__ == "__main__":
    main()
