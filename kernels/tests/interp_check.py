"""Runs the real Triton kernels on the CPU through Triton's interpreter and prints, as JSON, how
far they land from the float32 reference. Started by test_interpreter.py in a fresh process,
because TRITON_INTERPRET must be set before the kernels are defined.

    TRITON_INTERPRET=1 python interp_check.py '{"lens": [40], "ts": [3], "heads": 2, ...}'
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
from cases import SM_SCALE, make_case, rel_err  # noqa: E402

va = importlib.import_module("dflash_kernels.verify_attention")

spec = json.loads(sys.argv[1])
cfg = va.VerifyConfig(**spec["config"])
case = make_case(spec["lens"], spec["ts"], spec["heads"], mask=spec.get("mask", "tree"), device="cpu",
                 page_size=spec.get("page_size", 1), pool_extra=64)
n, h = case["q"].shape[:2]
out = torch.full((n, h, 512), float("nan"), dtype=torch.bfloat16)
lse = torch.full((n, h), float("nan"))
va.verify_attention(case["q"], case["k_extend"], case["kv_cache"], case["kv_indices"], case["kv_indptr"],
                    case["qo_indptr"], case["tree_mask"], SM_SCALE, out=out, lse=lse,
                    max_q_len=case["max_q_len"], num_splits=spec.get("num_splits"), config=cfg)
ref_o, ref_lse = va.reference_verify_attention(case["q"], case["k_extend"], case["kv_cache"], case["kv_indices"],
                                               case["kv_indptr"], case["qo_indptr"], case["blocks"], SM_SCALE)
print(json.dumps({"nan": bool(torch.isnan(out).any() or torch.isnan(lse).any()),
                  "rel_err": rel_err(out, ref_o), "lse_err": float((lse - ref_lse).abs().max())}))
