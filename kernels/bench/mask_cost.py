"""What packing DDTree's tree mask costs a verify step: the plugin packs it in every layer.

    python kernels/bench/mask_cost.py [--layers 61] [--batches 1,8,48] [--draft-tokens 16] [--prefix 32768]

For DDTree's trees (SGLang's flat custom mask), `layers` packings are captured in one CUDA graph,
as SGLang captures a whole verify step, once with the torch ops (`pack_custom_mask`) and once
with the plugin's kernel (`_draft_mask.py`); the replay's median time is printed per step and
per layer. (DFlash's chains cost nothing here: every call reads one draft block built once,
`sglang_plugin.shared_draft_block`.)
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import triton

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_verify as bv  # noqa: E402,F401  (puts the package and the tests folder on sys.path)
from cases import random_custom_mask  # noqa: E402
from dflash_kernels import sglang_plugin  # noqa: E402
from dflash_kernels.verify_attention import pack_custom_mask  # noqa: E402


def step_us(pack, layers: int) -> float:
    """Median replay time of a graph of `layers` calls of pack, us."""
    pack()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(layers):
            pack()
    return triton.testing.do_bench(graph.replay, warmup=10, rep=200, return_mode="median") * 1e3


def packings(bs: int, t: int, prefix: int) -> dict:
    """kind -> (torch ops, the plugin's kernel) packing the tree mask of bs requests of t draft tokens."""
    qo = torch.arange(0, (bs + 1) * t, t, dtype=torch.int32, device="cuda")
    kv = torch.arange(0, (bs + 1) * prefix, prefix, dtype=torch.int32, device="cuda")
    n_tok = bs * t
    custom, mask_indptr = random_custom_mask(qo, kv)
    return {
        "tree": (lambda: pack_custom_mask(custom, mask_indptr, qo, kv, t, num_tokens=n_tok),
                 lambda: sglang_plugin.packed_custom_mask(custom, mask_indptr, qo, kv, n_tok, t)),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=61, help="attention layers a verify step (Kimi K2.6: 61)")
    ap.add_argument("--batches", default="1,8,48")
    ap.add_argument("--draft-tokens", type=int, default=16)
    ap.add_argument("--prefix", type=int, default=32768, help="prefix tokens a request (the custom mask's width)")
    a = ap.parse_args()
    t = a.draft_tokens
    print(f"{torch.cuda.get_device_name()}, {a.layers} layers a step, t = {t}, prefix {a.prefix} a request")
    print(f"{'mask':6s} {'bs':>4s} {'torch ops, us a step':>22s} {'kernel, us a step':>19s} {'kernel, us a layer':>19s}")
    for bs in (int(b) for b in a.batches.split(",")):
        for kind, (torch_ops, kernel) in packings(bs, t, a.prefix).items():
            assert torch.equal(torch_ops(), kernel()), kind
            slow, fast = step_us(torch_ops, a.layers), step_us(kernel, a.layers)
            print(f"{kind:6s} {bs:4d} {slow:22.1f} {fast:19.1f} {fast / a.layers:19.2f}")


if __name__ == "__main__":
    main()
