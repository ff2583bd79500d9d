"""Runs one verify-attention problem a few times so that a profiler can capture the split kernel:

    ncu --kernel-name regex:_verify_split --launch-skip 2 --launch-count 1 --clock-control none \
        --section SpeedOfLight ... python kernels/bench/profile_split.py [VARIANT] [L] [t] [POOL]

VARIANT is a name from sweep_verify.VARIANTS (default n64s2), or auto for the plan's choice;
POOL is bf16 (default) or fp8_e4m3 (with bench_verify's scales).
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_verify as bv  # noqa: E402
import sweep_verify as sv  # noqa: E402
from cases import SM_SCALE, make_case  # noqa: E402

name = sys.argv[1] if len(sys.argv) > 1 else "n64s2"
L = int(sys.argv[2]) if len(sys.argv) > 2 else 131072
t = int(sys.argv[3]) if len(sys.argv) > 3 else 16
kv_dtype = bv.KV_DTYPES[sys.argv[4] if len(sys.argv) > 4 else "bf16"]
cfg = None if name == "auto" else sv.VARIANTS[name]
c = make_case([L], [t], 8, mask="chain" if t <= 16 else "tree", pool_extra=1024, kv_dtype=kv_dtype)
out = torch.empty(c["q"].shape[0], 8, 512, dtype=torch.bfloat16, device="cuda")
for _ in range(4):
    sv.va.verify_attention(c["q"], c["k_extend"], c["kv_cache"], c["kv_indices"], c["kv_indptr"],
                           c["qo_indptr"], c["tree_mask"], SM_SCALE, out=out, max_q_len=t, config=cfg,
                           **bv._scales(kv_dtype))
torch.cuda.synchronize()
print(name, cfg, "done")
