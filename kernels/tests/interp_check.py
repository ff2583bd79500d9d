"""Runs the real Triton kernels on the CPU through Triton's interpreter and prints, as JSON, how
far they land from the float32 reference; with "peer": true in the spec, SGLang's own
extend_attention_fwd too (from the peer folder), on the same inputs. Given a list of batches
instead, it runs the plan kernel alone and prints the plan it wrote for each (test_plan.py).
Started by the tests in a fresh process, because TRITON_INTERPRET must be set before the kernels
are defined.

    TRITON_INTERPRET=1 python interp_check.py '{"lens": [40], "ts": [3], "heads": 2, ...}'
    TRITON_INTERPRET=1 python interp_check.py '[{"lens": [40, 7], "num_splits": 4, "block_n": 32, "min_chunk": 64}]'
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
from cases import SEEDS_USED, SM_SCALE, load_peer, make_case, rel_err, run_peer  # noqa: E402

va = importlib.import_module("dflash_kernels.verify_attention")


def written_plan(lens, num_splits, block_n, min_chunk):
    """The plan kernel's output for one batch (the rows of the workspace's plan)."""
    cfg = va.VerifyConfig(block_m=16, block_n=block_n, num_warps=4, num_stages=1, min_chunk=min_chunk)
    kv_indptr = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    plan = torch.full(va.workspace_shape(len(lens), 1, 1, num_splits)[2], -7, dtype=torch.int32)
    fn, const, opts = va.plan_kernel(cfg, triton.next_power_of_2(max(len(lens), 2)))
    fn[(1,)](kv_indptr, plan, len(lens), num_splits, **const, **opts)
    return plan.tolist()


spec = json.loads(sys.argv[1])
if isinstance(spec, list):
    print(json.dumps([written_plan(**batch) for batch in spec]))
    sys.exit(0)
cfg = va.VerifyConfig(**spec["config"])
if "split_block_n" in spec:
    # the split kernel tiles by another BLOCK_N than the plan's cfg.block_n, as sm_90's fp8 pools
    # did (sessions 28-29), over slices cut by the plan (a batch only: a single request's programs
    # cut slices by their own BLOCK_N, and the merge counts them by the config's)
    real_split_kernel = va.split_kernel

    def split_kernel_other_tiles(*args, **kwargs):
        fn, const, opts = real_split_kernel(*args, **kwargs)
        return fn, {**const, "BLOCK_N": spec["split_block_n"]}, opts

    va.split_kernel = split_kernel_other_tiles
if spec.get("partials_bf16"):
    # bf16 partial outputs, sm_90's workspace since session 31 (its split kernel is Gluon, which the
    # interpreter does not run): the Triton split kernel stores into whatever the workspace holds,
    # and the merge reads them as words of two columns
    va.partial_dtype = lambda cfg: torch.bfloat16
case = make_case(spec["lens"], spec["ts"], spec["heads"], mask=spec.get("mask", "tree"), device="cpu",
                 page_size=spec.get("page_size", 1), pool_extra=64, max_q_len=spec.get("max_q_len"),
                 kv_dtype=getattr(torch, spec.get("kv_dtype", "bfloat16")))
scales = dict(k_scale=spec.get("k_scale", 1.0), v_scale=spec.get("v_scale", 1.0))
n, h = case["q"].shape[:2]
out = torch.full((n, h, 512), float("nan"), dtype=torch.bfloat16)
lse = torch.full((n, h), float("nan"))
# "block_mask": the chains as one shared draft block (draft_block_mask), as the SGLang plugin
# passes DFlash's, instead of a row per token
block = spec.get("block_mask", False)
mask = va.draft_block_mask(case["max_q_len"], causal=True) if block else case["tree_mask"]
workspace = guard = None
if spec.get("max_q_len"):
    # the workspace as the front of larger buffers whose tail holds a sentinel: a partial stored
    # past the workspace's end lands there
    shapes = va.workspace_shape(len(spec["ts"]), h, case["max_q_len"], spec["num_splits"])
    guard = [torch.full((s[0] + 2, *s[1:]), 1234.0, dtype=dtype) for s, dtype in
             zip(shapes, (va.partial_dtype(cfg), torch.float32), strict=False)]
    workspace = (guard[0][:shapes[0][0]], guard[1][:shapes[1][0]], torch.zeros(shapes[2], dtype=torch.int32))
if spec.get("poison_workspace"):
    # every partial and lse NaN before the call: a slot the merge read that its request does not
    # own would show (a weight of zero does not drop a NaN)
    shapes = va.workspace_shape(len(spec["ts"]), h, case["max_q_len"], spec["num_splits"])
    workspace = (torch.full(shapes[0], float("nan"), dtype=va.partial_dtype(cfg)),
                 torch.full(shapes[1], float("nan")), torch.zeros(shapes[2], dtype=torch.int32))
va.verify_attention(case["q"], case["k_extend"], case["kv_cache"], case["kv_indices"], case["kv_indptr"],
                    case["qo_indptr"], mask, SM_SCALE, out=out, lse=lse, max_q_len=case["max_q_len"],
                    num_splits=spec.get("num_splits"), config=cfg, block_mask=block, workspace=workspace, **scales)
ref_o, ref_lse = va.reference_verify_attention(case["q"], case["k_extend"], case["kv_cache"], case["kv_indices"],
                                               case["kv_indptr"], case["qo_indptr"], case["blocks"], SM_SCALE,
                                               **scales)
result = {"nan": bool(torch.isnan(out).any() or torch.isnan(lse).any()),
          "rel_err": rel_err(out, ref_o), "lse_err": float((lse - ref_lse).abs().max())}
if spec.get("max_q_len"):
    # a call whose max_q_len is below a request's draft length: which tokens were left unwritten,
    # and how far the written ones land
    unwritten = torch.isnan(out.float()).flatten(1).any(1)
    written = ~unwritten
    result.update(unwritten_tokens=unwritten.nonzero().flatten().tolist(),
                  rel_err_written=rel_err(out[written], ref_o[written]),
                  stored_past_the_workspace=any(bool((g[len(w):] != 1234.0).any()) for g, w in zip(guard, workspace[:2], strict=True)))
if spec.get("peer"):
    theirs = run_peer(load_peer(), case, torch.full_like(out, float("nan")), **scales)
    result.update(peer_nan=bool(torch.isnan(theirs).any()), peer_rel_err=rel_err(theirs, ref_o),
                  ours_vs_peer=rel_err(out, theirs))
result["seeds"] = SEEDS_USED  # (the test's process reports them beside a failure)
print(json.dumps(result))
