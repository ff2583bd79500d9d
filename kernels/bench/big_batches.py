"""Large batches of short prefixes, the other end of what SGLang's DFlash serves (up to 48
requests at once): ours under both archs' configs (graph replay) beside SGLang's kernel (eager)
on the same inputs, in one run on the GPU machine:

    PEER_DIR=.peer python kernels/bench/big_batches.py

SGLang's grid is requests x heads, so here it is no longer 8 programs on a 132-SM chip and its
kernel comes closest to ours; these points check "never slower than the peer" where the margin
is smallest.
"""
from __future__ import annotations

import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_verify as bv  # noqa: E402  (puts the package and the tests folder on sys.path)

va = bv.va
HEADS = 8
# (prefix length of each request, requests, draft tokens)
POINTS = [(2048, 32, 16), (1024, 48, 16), (512, 48, 64), (4096, 48, 64), (8192, 16, 16)]


def main():
    torch.manual_seed(0)
    bw, mm = bv.ceilings()
    print(json.dumps(dict(device=torch.cuda.get_device_name(), triton=bv.triton.__version__, copy_TBs=bw / 1e12,
                          mm_TFLOPs=mm / 1e12)), flush=True)
    peer = bv.load_peer()
    if peer is None:
        sys.exit("SGLang's kernel not found: set PEER_DIR to the folder ../shared/peer-bench/fetch_peer.sh fills")
    print("| bs | L | t | sm_90 config graph us | sm_120 config graph us | SGLang eager us | SGLang / sm_90 | "
          "SGLang / sm_120 | floor us |")
    print("|---|---|---|---|---|---|---|---|---|")
    for length, batch, t in POINTS:
        lens = [length] * batch
        byt, fl = bv.work(lens, t, HEADS)
        floor_us = max(byt / bw, fl / mm) * 1e6
        _, g90, _ = bv.time_ours(lens, t, HEADS, va.CONFIGS["sm90"])
        _, g120, _ = bv.time_ours(lens, t, HEADS, va.CONFIGS["sm120"])
        p = bv.time_peer(peer, lens, t, HEADS)
        print(f"| {batch} | {length} | {t} | {g90 * 1e3:.1f} | {g120 * 1e3:.1f} | {p * 1e3:.1f} | {p / g90:.1f}x | "
              f"{p / g120:.1f}x | {floor_us:.1f} |", flush=True)


if __name__ == "__main__":
    main()
