"""Random verify-attention problems shared by the tests: fresh inputs on every call."""
from __future__ import annotations

import importlib
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

import torch

va = importlib.import_module("dflash_kernels.verify_attention")

SM_SCALE = 1.0 / math.sqrt(192)  # DeepSeek V3 / Kimi K2: 1/sqrt(128 + 64)
# The seeds of this test's cases, fresh each run; conftest.py prints them beside a failure, so
# make_case(..., seed=S) gives the failing inputs again.
SEEDS_USED: list[int] = []


def make_case(lens, ts, heads, mask="chain", page_size=1, idx_dtype=torch.int32, device="cuda",
              seed=None, pool_extra=4096, max_q_len=None, kv_dtype=torch.bfloat16):
    """lens: prefix length per request; ts: draft tokens per request. The pool (of kv_dtype)
    holds the prefixes at scattered slots (page_size 1: a random permutation; page_size P:
    random pages, tokens contiguous inside a page) and random rows elsewhere."""
    seed = seed if seed is not None else int.from_bytes(os.urandom(4), "little")
    SEEDS_USED.append(seed)
    gen = torch.Generator().manual_seed(seed)
    n_pages = sum(math.ceil(L / page_size) for L in lens) + pool_extra // page_size + 1
    pool = n_pages * page_size
    kv = torch.randn(pool, va.D_LATENT, generator=gen).to(kv_dtype)
    perm = torch.randperm(n_pages, generator=gen)
    idx, p0 = [], 0
    for L in lens:
        np_ = math.ceil(L / page_size)
        pages = perm[p0:p0 + np_]
        p0 += np_
        tok = (pages[:, None] * page_size + torch.arange(page_size)[None, :]).reshape(-1)[:L]
        idx.append(tok)
    kv_indices = torch.cat(idx).to(idx_dtype) if idx else torch.zeros(0, dtype=idx_dtype)
    kv_indptr = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32)
    qo_indptr = torch.tensor([0] + list(torch.tensor(ts).cumsum(0).tolist()), dtype=torch.int32)
    n = sum(ts)
    q = torch.randn(n, heads, va.D_LATENT, generator=gen).to(torch.bfloat16)
    k_ext = torch.randn(n, va.D_LATENT, generator=gen).to(torch.bfloat16)
    blocks = []
    for t in ts:
        if mask == "chain":
            blocks.append(va.chain_tree_mask(t))
        else:
            blocks.append(va.tree_mask_from_parents(va.random_tree_parents(t, gen)))
    mq = max_q_len or max(ts)
    tree = va.pack_tree_masks(blocks, mq)
    d = dict(q=q, k_extend=k_ext, kv_cache=kv, kv_indices=kv_indices, kv_indptr=kv_indptr,
             qo_indptr=qo_indptr, tree_mask=tree)
    d = {k: v.to(device) for k, v in d.items()}
    d["blocks"] = [b.to(device) for b in blocks]
    d["max_q_len"] = mq
    return d


def sglang_custom_mask(case):
    """The same mask in SGLang's layout: per request a flat bool t x (L + t), prefix all True."""
    qo = case["qo_indptr"].tolist()
    kvp = case["kv_indptr"].tolist()
    parts, ptr = [], [0]
    for b, blk in enumerate(case["blocks"]):
        t = qo[b + 1] - qo[b]
        L = kvp[b + 1] - kvp[b]
        full = torch.ones(t, L + t, dtype=torch.bool, device=blk.device)
        full[:, L:] = blk
        parts.append(full.reshape(-1))
        ptr.append(ptr[-1] + t * (L + t))
    return torch.cat(parts), torch.tensor(ptr, dtype=torch.int64, device=case["qo_indptr"].device)


def random_custom_mask(qo_indptr, kv_indptr):
    """A flat bool mask in SGLang's layout (per request t x (L + t), row-major) with random bits
    everywhere, the prefix columns too (the kernels read only the draft columns), and its int64
    mask_indptr."""
    qo = qo_indptr.tolist()
    kv = kv_indptr.tolist()
    sizes = [(qo[b + 1] - qo[b]) * (kv[b + 1] - kv[b] + qo[b + 1] - qo[b]) for b in range(len(qo) - 1)]
    mask = torch.rand(sum(sizes), device=qo_indptr.device) < 0.5
    return mask, torch.tensor([0, *itertools.accumulate(sizes)], dtype=torch.int64, device=qo_indptr.device)


PEER_FILES = ("decode_attention.py", "extend_attention.py", "score_mod.py")


def peer_dir() -> str | None:
    """SGLang's Triton attention kernels (the peer), as a folder holding its `sglang` package: PEER_DIR
    if set; else `.peer` at the repository root (what fetch_peer.sh makes); else the same files
    unpacked from the wheel that SGLANG_WHEEL names (scripts/test.sh sets it, so CI checks against
    SGLang's own kernel through the interpreter); else None."""
    here = os.path.dirname(os.path.abspath(__file__))
    if "PEER_DIR" in os.environ:
        peer = os.environ["PEER_DIR"]
    elif os.path.isdir(os.path.join(here, "..", "..", ".peer", "sglang")):
        peer = os.path.join(here, "..", "..", ".peer")
    elif os.environ.get("SGLANG_WHEEL"):
        peer = unpack_peer(os.environ["SGLANG_WHEEL"])
    else:
        return None
    return peer if os.path.isdir(os.path.join(peer, "sglang")) else None


def unpack_peer(wheel: str) -> str:
    """The peer's three files out of SGLang's wheel, into a folder of the temp dir named after the
    wheel (made once, whole or not at all: unpacked beside it, then renamed), with empty package
    __init__ files in place of SGLang's, which import its runtime."""
    dest = os.path.join(tempfile.gettempdir(), "dflash-peer-" + os.path.basename(wheel).removesuffix(".whl"))
    if os.path.isdir(dest):
        return dest
    attention = "sglang/kernels/ops/attention"
    staging = tempfile.mkdtemp(dir=os.path.dirname(dest))
    with zipfile.ZipFile(wheel) as z:
        for name in PEER_FILES:
            z.extract(f"{attention}/{name}", staging)
    parts = attention.split("/")
    for depth in range(1, len(parts) + 1):
        open(os.path.join(staging, *parts[:depth], "__init__.py"), "w").close()
    try:
        os.rename(staging, dest)
    except OSError:  # another process unpacked it first
        shutil.rmtree(staging)
    return dest


def load_peer():
    """SGLang's extend_attention_fwd: from the peer folder (peer_dir) with stand-ins for the two
    runtime modules it imports (sglang_stand_ins.py), else from an installed SGLang (the engine
    image, where bench/bench_verify.py then times the card's own SGLang kernel), else None."""
    peer = peer_dir()
    if peer is None:
        try:
            from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
        except ImportError:
            return None
        return extend_attention_fwd
    if peer not in sys.path:
        sys.path.insert(0, peer)
    import sglang_stand_ins  # noqa: E402  (beside this file)
    sglang_stand_ins.install()
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
    return extend_attention_fwd


def run_peer(fn, case, out, k_scale=1.0, v_scale=1.0):
    """SGLang target-verify call: prefix through kv_indices, draft latents beside it; the pool's
    scales as SGLang's k_descale / v_descale."""
    custom_mask, mask_indptr = sglang_custom_mask(case)
    kv = case["kv_cache"].reshape(-1, 1, va.D_LATENT)
    ke = case["k_extend"].reshape(-1, 1, va.D_LATENT)
    fn(case["q"], ke, ke[..., :va.D_NOPE], out, kv, kv[..., :va.D_NOPE], case["qo_indptr"],
       case["kv_indptr"], case["kv_indices"], custom_mask, False, mask_indptr, case["max_q_len"],
       k_scale, v_scale, sm_scale=SM_SCALE, skip_prefix_custom_mask=True)
    return out


def run_interpreted(script: str, *args: str) -> str:
    """stdout of tests/<script> run by Triton's CPU interpreter in a fresh process (TRITON_INTERPRET
    must be set before the kernels are defined); fails the test with its stderr when it fails."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), script), *args],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def interpreted_json(script: str, spec):
    """What tests/<script> prints last, as JSON, when run by the interpreter on spec (as JSON)."""
    result = json.loads(run_interpreted(script, json.dumps(spec)).strip().splitlines()[-1])
    if isinstance(result, dict):  # the cases the script made, for conftest's report of a failure
        SEEDS_USED.extend(result.pop("seeds", []))
    return result


def rel_err(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())
