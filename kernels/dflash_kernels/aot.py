"""Ahead-of-time build of the verify-attention kernels, on a machine with no GPU.

    python -m dflash_kernels.aot --arch 120 --arch 90 --out DIR [--heads 8] [--batch-pad 8]
                                 [--triton-cache CACHE --check]

For every arch it runs ``triton.compile(ASTSource(...), target=GPUTarget("cuda", arch, 32))`` on
the split kernel (per pool and kv_indices dtype) and the merge kernels for each head count
(DIR/sm_<arch>/verify_split_h<heads>.cubin, ...) and on the plan kernel and the plugin's
draft-block mask kernel for each batch bucket (verify_plan_b<pad>.cubin; the bucket BS_PAD is the
power of two >= the batch size, at least 2, that the launcher passes), plus .ptx beside each, and
writes DIR/manifest.json (archs, triton version, kernel names, constexpr configs, launch options,
shared memory).
The production image's build stage calls exactly this.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.compiler.compiler import make_backend
from triton.runtime.cache import triton_key

from . import _draft_mask

# the package re-exports the function verify_attention, which hides the module of that name
va = importlib.import_module(".verify_attention", __package__)

# Pointer and scalar types of each kernel's runtime arguments, in order (the constexprs are
# given apart). Index tensors are int32 (the plugin makes SGLang's indptrs int32), but for the
# pool slots, kv_indices, which SGLang's Triton backend passes as int64: INDEX_TYPES.
_PLAN_SIG = {"KV_INDPTR": "*i32", "PLAN": "*i32", "BATCH": "i32", "NUM_SPLITS": "i32"}
_SPLIT_SIG = {
    "Q": "*bf16", "K_EXT": "*bf16", "KV": "*bf16", "KV_INDICES": "*i32", "KV_INDPTR": "*i32",
    "QO_INDPTR": "*i32", "TREE_MASK": "*i32", "PLAN": "*i32", "PART_O": "*fp32", "PART_LSE": "*fp32",
    "qk_scale": "fp32",
    "stride_qt": "i32", "stride_qh": "i32", "stride_kext": "i32", "stride_kv": "i32",
    "stride_mask": "i32", "stride_mask_req": "i32", "rows_max": "i32", "NUM_SPLITS": "i32", "BATCH": "i32",
}
# the split kernels that read scaled pools take the pool's scales (va.takes_scales)
_SCALES_SIG = {"k_scale": "fp32", "v_scale": "fp32"}
# Pool dtypes the split kernel is built for: name suffix -> Triton's pointer type, on the archs that
# take fp8 pools (va.fp8_capable); an arch's one config reads them all.
KV_POOL_TYPES = {"": "*bf16", "_fp8e4m3": "*fp8e4nv", "_fp8e5m2": "*fp8e5"}


# kv_indices types the split kernel is built for: name suffix -> Triton's pointer type
INDEX_TYPES = {"": "*i32", "_i64": "*i64"}
# the plugin's mask kernel for DDTree's trees (SGLang's custom mask, bytes; DFlash's chains need
# none); it does not specialise on alignment, so no divisibility is assumed
_TREE_MASK_SIG = {"custom_mask": "*u8", "mask_indptr": "*i64", "qo_indptr": "*i32", "kv_indptr": "*i32",
                  "out": "*i32", "batch": "i32"}


def pool_types(arch: int) -> dict[str, str]:
    """The entries of KV_POOL_TYPES this arch runs."""
    fp8 = va.fp8_capable(arch // 10, arch % 10)
    return {k: v for k, v in KV_POOL_TYPES.items() if v == "*bf16" or fp8}
_MERGE_SIG = {
    "PART_O": "*fp32", "PART_LSE": "*fp32", "PLAN": "*i32", "KV_INDPTR": "*i32", "QO_INDPTR": "*i32",
    "OUT": "*bf16", "LSE": "*fp32",
    "stride_ot": "i32", "stride_oh": "i32", "stride_lt": "i32", "stride_lh": "i32", "rows_max": "i32", "NUM_SPLITS": "i32", "BATCH": "i32",
}


# Arguments the JIT would specialise as multiples of 16 at run time (torch allocations are
# 16-byte aligned; 576- and 512-wide rows): the AOT build must assume the same, or its loads
# are not vectorised and it is not the code that runs.
_DIV16 = {"Q", "K_EXT", "KV", "KV_INDICES", "KV_INDPTR", "QO_INDPTR", "TREE_MASK", "PLAN", "PART_O",
          "PART_LSE", "OUT", "LSE", "stride_qt", "stride_qh", "stride_kext", "stride_kv",
          "stride_ot", "stride_oh"}


# kernels that depend on the batch bucket alone (built once per bucket, not per head count)
_BUCKET_KERNELS = ("verify_plan", "draft_mask")
# The plan kernel's batch buckets: the launcher pads the batch to the next power of two (>= 2);
# SGLang's DFlash runs at most 48 requests.
BS_PADS = (2, 4, 8, 16, 32, 64, 128)


def _config(arch: int) -> va.VerifyConfig:
    """The config the launcher runs at arch for every pool (with the Gluon kernels, which this
    build always compiles)."""
    return va.CONFIGS[va.config_key(arch // 10)]


def kernel_specs(arch: int, heads: int, bs_pad: int = 8):
    """(name, fn, signature, constexprs, options) of every kernel the launcher runs at one arch,
    head count and batch bucket: plan and draft mask (per batch bucket), split (per pool and
    index dtype) and merge."""
    plans = [("verify_plan", *_with_sig(va.plan_kernel(_config(arch), bs_pad), _PLAN_SIG)), *_draft_mask_specs(bs_pad)]
    # every tile the launcher may pick (merge_tile), with and without the LSE output (SGLang's
    # verify call asks for none)
    cfg = _config(arch)
    merge_sig = {**_MERGE_SIG, "PART_O": partial_type(cfg)}
    merges = [(merge_name(tile, lse), *_with_sig(va.merge_kernel(heads, lse, tile, cfg), merge_sig))
              for tile in va.merge_tiles(cfg) for lse in (True, False)]
    splits = [("verify_split" + suffix + idx_suffix, *_split_spec(arch, heads, kv_type, idx_type))
              for suffix, kv_type in pool_types(arch).items() for idx_suffix, idx_type in INDEX_TYPES.items()]
    return [*plans, *splits, *merges]


def merge_name(tile: va.MergeTile, write_lse: bool) -> str:
    """The build's name of the merge kernel for one tile."""
    return f"verify_merge{'' if write_lse else '_nolse'}_d{tile.block_d}c{tile.chunk}s{tile.stages}"


def _draft_mask_specs(bs_pad: int):
    """The tree-mask kernel for one batch bucket, for each word count (compiled with Triton's
    default launch options, as the plugin launches it)."""
    return [(f"draft_mask_w{words}_tree", _draft_mask.tree_mask_kernel, _TREE_MASK_SIG,
             _draft_mask.tree_mask_constexprs(bs_pad, 32 * words), {})
            for words in _draft_mask.PREBUILT_WORDS]


def _split_spec(arch: int, heads: int, kv_type: str, idx_type: str):
    """(fn, signature, constexprs, options) of the split kernel the launcher runs for a pool of
    kv_type and kv_indices of idx_type."""
    cfg = _config(arch)
    fn, const, opts = va.split_kernel(cfg, heads, fp8_pool=kv_type != "*bf16")
    return fn, split_signature(fn, kv_type, idx_type, partial_type(cfg)), const, opts


def partial_type(cfg: va.VerifyConfig) -> str:
    """The signature type of a config's partial outputs (va.partial_dtype)."""
    return "*bf16" if cfg.partials_bf16 else "*fp32"


def split_signature(fn, kv_type: str = "*bf16", idx_type: str = "*i32", part_type: str = "*fp32") -> dict:
    """Runtime argument types of split kernel fn for a pool of kv_type, kv_indices of idx_type and
    partial outputs of part_type."""
    return {**_SPLIT_SIG, "KV": kv_type, "KV_INDICES": idx_type, "PART_O": part_type,
            **(_SCALES_SIG if va.takes_scales(fn) else {})}


def _with_sig(spec, signature):
    fn, const, opts = spec
    return fn, signature, const, opts


def jit_attrs(fn, signature, constexprs, arch: int) -> dict:
    """The argument attributes Triton's JIT compiles (and keys its cache with) for a launch of fn
    whose arguments are as the launcher passes them: the _DIV16 ones multiples of 16, any other
    pointer not (the mask kernels do not specialise on alignment), ints and floats plain. The
    JIT's own packing makes them, as its rules differ between releases (3.8 keys each constexpr
    with an empty entry, 3.6 does not), so that a launch finds the binary built here."""
    backend = make_backend(GPUTarget("cuda", arch, 32))
    specialization, bound = [], {}
    for name in fn.arg_names:
        if name in constexprs:
            specialization.append(("constexpr", None))
            bound[name] = constexprs[name]
        else:
            kind = signature[name]
            specialization.append((kind, "D" if name in _DIV16 else "" if kind.startswith("*") else None))
            bound[name] = None
    return fn._pack_args(backend, {}, bound, specialization, None)[3]


def compile_one(fn, signature, constexprs, arch: int, options: dict):
    sig = dict(signature)
    for k in constexprs:
        sig[k] = "constexpr"
    attrs = jit_attrs(fn, signature, constexprs, arch)
    src_cls = ASTSource
    if getattr(fn, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource
        src_cls = GluonASTSource
    src = src_cls(fn=fn, signature=sig, constexprs=dict(constexprs), attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)


def build(archs, out_dir: str, heads=(8, 16), bs_pads=BS_PADS, triton_cache: str | None = None) -> dict:
    """Compile every kernel for every arch and head count into out_dir; return the manifest.

    With ``triton_cache`` the compiled kernels also land in that Triton cache folder, under the
    keys Triton's JIT computes for the launcher's calls: point TRITON_CACHE_DIR at it (the image
    does) and the first verify call loads these binaries instead of compiling (``prebuilt.py``
    checks that the keys match).
    """
    if triton_cache:
        knobs.cache.dir = triton_cache
    os.makedirs(out_dir, exist_ok=True)
    # triton_key: what Triton's cache keys start with (its version, sources and compiled library,
    # which differs per Python build): a runtime whose key differs compiles instead of loading.
    manifest = {"triton_version": triton.__version__, "triton_key": triton_key(),
                "python": sys.version.split()[0], "archs": list(archs), "kernels": []}
    for arch in archs:
        sub = os.path.join(out_dir, f"sm_{arch}")
        os.makedirs(sub, exist_ok=True)
        jobs = []
        for h in heads:
            for name, fn, sig, const, opts in kernel_specs(arch, h):
                if not name.startswith(_BUCKET_KERNELS):
                    jobs.append((f"{name}_h{h}", fn, sig, const, opts, name))
        for bp in bs_pads:
            for name, fn, sig, const, opts in kernel_specs(arch, heads[0], bp):
                if name.startswith(_BUCKET_KERNELS):
                    jobs.append((f"{name}_b{bp}", fn, sig, const, opts, name))
        for stem, fn, sig, const, opts, name in jobs:
            k = compile_one(fn, sig, const, arch, opts)
            cubin = os.path.join(sub, stem + ".cubin")
            with open(cubin, "wb") as f:
                f.write(k.asm["cubin"])
            with open(os.path.join(sub, stem + ".ptx"), "w") as f:
                f.write(k.asm["ptx"])
            md = k.metadata
            manifest["kernels"].append({
                "name": name, "symbol": md.name, "arch": arch, "target": f"sm_{arch}",
                "cubin": os.path.relpath(cubin, out_dir), "constexprs": const,
                "num_warps": md.num_warps, "num_stages": md.num_stages, "shared_bytes": md.shared,
            })
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, action="append", required=True, help="e.g. 120 or 90")
    ap.add_argument("--out", required=True)
    ap.add_argument("--heads", type=int, action="append", help="query heads per rank (default 8, 16)")
    ap.add_argument("--batch-pad", type=int, action="append", help="batch buckets (default 2 4 ... 128)")
    ap.add_argument("--triton-cache", help="also fill this Triton cache folder (TRITON_CACHE_DIR at run time)")
    ap.add_argument("--check", action="store_true",
                    help="then run the launcher's calls compile-only and fail unless every one finds its binary")
    a = ap.parse_args(argv)
    heads = tuple(a.heads or (8, 16))
    m = build(a.arch, a.out, heads, tuple(a.batch_pad or BS_PADS), a.triton_cache)
    for k in m["kernels"]:
        print(f"{k['cubin']:44s} shared {k['shared_bytes']:6d} B")
    if a.check:
        if not a.triton_cache:
            ap.error("--check needs --triton-cache")
        from . import prebuilt
        return prebuilt.check_cache(a.arch, heads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
