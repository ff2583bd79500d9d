"""Verify attention per layer inside one CUDA graph of several layers, beside one call per graph.

    python kernels/bench/layers_graph.py [--layers 8] [--points 1024:16,32768:16,131072:16,...]
                                         [--variant NAME[,NAME...] [--rounds N]] [--plugin]
                                         [--page-size P] [--kv-dtype bf16|fp8_e4m3]

SGLang captures a whole verify step (every layer) in one CUDA graph, so a layer's attention does
not pay a graph launch of its own. bench_verify.py times one call captured alone, which does
(about 5 us on the H200, RESULTS.md session 5). Here N calls, each with its own KV pool, query and
output (as N layers have; they share one workspace, as the SGLang plugin's calls do), are captured
in one graph; the replay's median time divided by N is the per-layer figure. Both figures are
printed, with the floor of bench_verify.py (both ceilings measured in this run).

Several variants are timed side by side at each point, in turn, --rounds times (an A/B whose
runs interleave, so a drift of the card's clocks reaches every variant alike).

--page-size P lays the pool out in random pages of P tokens, contiguous inside a page (the kernel
still reads one slot index per token, as for SGLang's page_size 1): beside the default (1, every
token anywhere) it shows what the scatter of the gathers costs.

With --plugin, each layer also calls the SGLang plugin's `MlaVerify` as SGLang's Triton backend
does, on the batch's tensors that every layer shares: DFlash's chains (no custom mask, causal;
every call reads the draft block the plugin built once) and DDTree's trees (SGLang's flat custom
mask). The first layer of the graph packs the mask and plans, the others reuse both; the same
calls with every layer packing and planning (the plugin before session 26) are timed beside them.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

import torch
import triton

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_verify as bv  # noqa: E402  (puts the package and the tests folder on sys.path)
import sweep_verify  # noqa: E402
from cases import SM_SCALE, make_case, sglang_custom_mask  # noqa: E402
from dflash_kernels.sglang_plugin import MlaVerify  # noqa: E402

va = bv.va


PLUGIN_FORMS = ("chains", "trees", "chains-every-layer", "trees-every-layer")


def per_layer_us(lens, t, h, layers, cfg, form="launcher", page_size=1, kv_dtype=torch.bfloat16):
    """(one call in its own graph, per layer in a graph of `layers` calls), us. form: "launcher"
    (verify_attention, mask packed beforehand) or one of PLUGIN_FORMS (MlaVerify on the batch's
    tensors that all layers share: chains without a custom mask, trees as SGLang's custom mask;
    "-every-layer": each layer packs and plans, as the plugin did before it shared them)."""
    chains = form.startswith("chains") or (form == "launcher" and t <= 16)
    cases = [make_case(lens, [t] * len(lens), h, mask="chain" if chains else "tree", pool_extra=1024,
                       page_size=page_size, kv_dtype=kv_dtype)
             for _ in range(layers)]
    custom = (None, None)
    if form != "launcher":  # one batch, a pool per layer (the pools are alike in size)
        cases[0]["qo_indptr"] = cases[0]["qo_indptr"].long()  # SGLang's Triton backend's dtype
        for c in cases[1:]:
            c.update({k: cases[0][k] for k in ("kv_indices", "kv_indptr", "qo_indptr", "blocks")})
        if not chains:
            custom = sglang_custom_mask(cases[0])
    _, ns, _ = va.plan(cases[0]["q"], len(lens), t, None, cfg, kv_dtype=kv_dtype)
    ws = va.alloc_workspace(len(lens), h, t, ns, "cuda", config=cfg)
    outs = [torch.empty(c["q"].shape[0], h, 512, dtype=torch.bfloat16, device="cuda") for c in cases]
    plugin_call = MlaVerify()
    scales = {} if kv_dtype == torch.bfloat16 else dict(k_scale=0.5, v_scale=2.0)

    def call(i):
        c = cases[i]
        if form == "launcher":
            va.verify_attention(c["q"], c["k_extend"], c["kv_cache"], c["kv_indices"], c["kv_indptr"],
                                c["qo_indptr"], c["tree_mask"], SM_SCALE, out=outs[i], workspace=ws, **scales,
                                max_q_len=t, num_splits=ns, config=cfg)
            return
        n = c["q"].shape[0]
        k_buffer = c["kv_cache"].view(-1, 1, va.D_LATENT)  # SGLang's MLA pool, V a view of its rows
        k = c["k_extend"].view(n, 1, va.D_LATENT)
        if form.endswith("-every-layer"):
            plugin_call.new_forward()  # (this layer packs and plans)
        served = plugin_call(c["q"], k, k, outs[i], k_buffer, k_buffer[..., :512], c["qo_indptr"], c["kv_indptr"],
                             c["kv_indices"], custom[0], chains, custom[1], t, sm_scale=SM_SCALE, max_bs=len(lens))
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
    ap.add_argument("--variant", default=None,
                    help="sweep_verify.py variants, comma-separated (default: the plan's choice)")
    ap.add_argument("--rounds", type=int, default=1, help="runs of every variant at each point, interleaved")
    ap.add_argument("--plugin", action="store_true", help="also per layer through the SGLang plugin (chains, trees)")
    ap.add_argument("--kv-dtype", choices=sorted(bv.KV_DTYPES), default="bf16", help="the pools' dtype (launcher only)")
    ap.add_argument("--page-size", type=int, default=1,
                    help="the pool's layout: random pages of this many contiguous tokens (default 1: scattered)")
    a = ap.parse_args()
    names = a.variant.split(",") if a.variant else ["auto"]
    unknown = [n for n in names if n != "auto" and n not in sweep_verify.VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s) {unknown}: see VARIANTS in sweep_verify.py")
    if a.plugin and (len(names) > 1 or a.rounds > 1):
        ap.error("--plugin runs the plugin's own config whatever the variant: use it with one variant and one round")
    torch.manual_seed(0)
    bw, mm = bv.ceilings()
    head = dict(device=torch.cuda.get_device_name(), copy_bw_TBs=bw / 1e12, mm_TFLOPs=mm / 1e12,
                layers=a.layers, page_size=a.page_size, kv_dtype=a.kv_dtype, variant=a.variant or "auto", triton=triton.__version__, torch=torch.__version__)
    print(json.dumps(head), flush=True)
    rows = []
    for (lens, t), _, name in itertools.product(sweep_verify.parse_points(a.points), range(a.rounds), names):
        cfg = sweep_verify.VARIANTS[name] if name != "auto" else None
        one, per = per_layer_us(lens, t, 8, a.layers, cfg, page_size=a.page_size, kv_dtype=bv.KV_DTYPES[a.kv_dtype])
        byt, fl = bv.work(lens, t, 8)
        floor = max(byt / bw, fl / mm) * 1e6
        rows.append(dict(variant=name, lens=list(lens), t=t, one_call_graph_us=one, per_layer_us=per, floor_us=floor))
        print(f"{name} L={'+'.join(map(str, lens))} t={t}: one call per graph {one:.1f} us, per layer in a graph of "
              f"{a.layers} {per:.1f} us, floor {floor:.1f} us ({100 * floor / per:.1f}% of it per layer)", flush=True)
        if a.plugin:
            plugin = rows[-1]["plugin_per_layer_us"] = {
                form: per_layer_us(lens, t, 8, a.layers, cfg, form, a.page_size)[1] for form in PLUGIN_FORMS}
            print("  through the plugin, per layer: " + ", ".join(
                f"{kind} {plugin[kind]:.1f} us ({plugin[kind + '-every-layer']:.1f} when every layer packs and plans)"
                for kind in ("chains", "trees")), flush=True)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "layers_graph.json"), "w") as f:
            json.dump(dict(head=head, rows=rows), f, indent=1)
    print(f"\n| variant | L | t | one call per graph (us) | per layer, graph of {a.layers} (us) | floor (us) | "
          "% of floor per layer |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['variant']} | {'+'.join(map(str, r['lens']))} | {r['t']} | {r['one_call_graph_us']:.1f} | "
              f"{r['per_layer_us']:.1f} | {r['floor_us']:.1f} | {100 * r['floor_us'] / r['per_layer_us']:.1f}% |")


if __name__ == "__main__":
    main()
