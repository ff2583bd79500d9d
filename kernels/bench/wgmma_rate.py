"""The tensor core's rate for the wgmma shapes the sm_90 split kernel issues, alone on the card.

    python kernels/bench/wgmma_rate.py [--iters 4096]

The split kernel's S is m64n32k16 (36 a 32-latent tile) and its P.V m64nNk16 with N 128 and 256.
Here every SM runs CTAS programs of one warpgroup each, and each issues chains of CHAIN wgmma
m64nNk16 into one accumulator (A from registers, "rs", or shared memory, "ss"; B from shared
memory), waiting once a chain. The figure is the achieved TFLOP/s: if a small N does not reach
the rate of a large one, fewer and wider S instructions (64 latents a wgmma) would pay.
"""
from __future__ import annotations

import argparse
import json

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

_cta_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier  # (renamed in 3.8)


@gluon.jit
def _wgmma_chain_kernel(OUT, ITERS: gl.constexpr, N: gl.constexpr, K: gl.constexpr, RS: gl.constexpr,
                        CHAIN: gl.constexpr):
    SH: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    ACC_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, N, 16])
    FILL: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    a_s = gl.allocate_shared_memory(gl.bfloat16, [64, K], SH)
    b_s = gl.allocate_shared_memory(gl.bfloat16, [N, K], SH)
    a_s.store(gl.full([64, K], 0.01, gl.bfloat16, FILL))
    b_s.store(gl.full([N, K], 0.01, gl.bfloat16, FILL))
    fence_async_shared()
    _cta_barrier()
    if RS:
        a = a_s.load(gl.DotOperandLayout(operand_index=0, parent=ACC_L, k_width=2))
    else:
        a = a_s
    acc = gl.zeros([64, N], gl.float32, ACC_L)
    for _ in range(ITERS):
        for _c in gl.static_range(CHAIN):
            acc = warpgroup_mma(a, b_s.permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=[acc])
    rows = gl.arange(0, 64, layout=gl.SliceLayout(1, ACC_L))
    gl.store(OUT + gl.program_id(0) * 64 + rows, gl.sum(acc, 1))


def rate_tflops(n, rs, ctas_per_sm, iters, chain=9, k=64):
    """Achieved TFLOP/s of every SM running ctas_per_sm programs of chained m64n{n}k16 wgmma."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    grid = sms * ctas_per_sm
    out = torch.empty(grid * 64, device="cuda", dtype=torch.float32)

    def run():
        _wgmma_chain_kernel[(grid,)](out, iters, n, k, rs, chain, num_warps=4)

    run()
    ms = triton.testing.do_bench(run, warmup=5, rep=50, return_mode="median")
    flops = grid * iters * chain * 2 * 64 * n * k
    return flops / (ms * 1e-3) / 1e12


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=2048)
    a = ap.parse_args()
    print(json.dumps(dict(device=torch.cuda.get_device_name(), triton=triton.__version__)), flush=True)
    print("| N | A operand | programs an SM | TFLOP/s |")
    print("|---|---|---|---|")
    for ctas in (1, 2):
        for rs in (True, False):
            for n in (32, 64, 128, 256):
                print(f"| {n} | {'registers' if rs else 'shared memory'} | {ctas} | "
                      f"{rate_tflops(n, rs, ctas, a.iters):.0f} |", flush=True)


if __name__ == "__main__":
    main()
