"""Runs the plan kernel on the CPU through Triton's interpreter for each batch given and prints,
as JSON, the plan it wrote. Started by test_plan.py in a fresh process (TRITON_INTERPRET must be
set before the kernels are defined).

    TRITON_INTERPRET=1 python interp_plan.py '[{"lens": [40, 7], "num_splits": 4, "block_n": 32, "min_chunk": 64}]'
"""
import json
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1"
here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.dirname(here))

import interpreter_shim  # noqa: E402

interpreter_shim.install()

import importlib  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402

va = importlib.import_module("dflash_kernels.verify_attention")

plans = []
for case in json.loads(sys.argv[1]):
    lens, ns = case["lens"], case["num_splits"]
    batch = len(lens)
    cfg = va.VerifyConfig(block_m=16, block_n=case["block_n"], num_warps=4, num_stages=1,
                          min_chunk=case["min_chunk"])
    kv_indptr = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    plan = torch.full(va.workspace_shape(batch, 1, 1, ns)[2], -7, dtype=torch.int32)
    fn, const, opts = va.plan_kernel(cfg, triton.next_power_of_2(max(batch, 2)))
    fn[(1,)](kv_indptr, plan, batch, ns, **const, **opts)
    plans.append(plan.tolist())
print(json.dumps(plans))
