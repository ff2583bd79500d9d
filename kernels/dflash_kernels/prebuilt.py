"""Does the launcher find the image's prebuilt binaries, or would Triton's JIT compile again?

The image's build stage compiles the kernels ahead of time (``aot.py --triton-cache``) into a
Triton cache folder, and the runtime points TRITON_CACHE_DIR at it. Triton's JIT then looks a
launch up under a key made of the kernel source, the argument types and specialisations, the
options and the target; a launch whose key differs from every prebuilt one compiles at first use
(seconds, inside the server's start) and writes a new entry. This module runs the real launcher
(``verify_attention``) on CPU tensors with a compile-only stand-in for Triton's CUDA driver: it
reports the target's architecture, "launches" nothing, and Triton's compilation listener says for
every kernel whether it came from the cache.

    python -m dflash_kernels.aot --arch 120 --out DIR --triton-cache CACHE --check
    TRITON_CACHE_DIR=CACHE python -m dflash_kernels.prebuilt --arch 120 --arch 90   # the same check
    TRITON_CACHE_DIR=CACHE python -m dflash_kernels.prebuilt                        # on a GPU, launching

The second form is what the production image runs in its runtime stage, with the runtime's own
Triton (SGLang's): a Triton whose cache keys differ from the build stage's, or whose Gluon does
not compile these kernels, fails the build there instead of compiling at a server's first verify.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from collections.abc import Iterator

import torch
import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import compiler as triton_compiler
from triton.runtime.driver import driver

from . import _draft_mask

va = importlib.import_module(".verify_attention", __package__)

# Shared memory per block (bytes) and threads per block the stand-in reports, by architecture.
_MAX_SHARED = {90: 232448, 120: 101376}
# The launches SGLang's verify makes: batch sizes whose plan buckets differ, with and without LSE,
# for each pool dtype (--kv-cache-dtype auto, fp8_e4m3, fp8_e5m2).
CHECK_BATCHES = (1, 3, 8, 48)


class _CompileOnlyUtils:
    def __init__(self, arch: int):
        self.arch = arch

    def get_device_properties(self, device):
        return {"max_shared_mem": _MAX_SHARED.get(self.arch, 101376), "multiprocessor_count": 1}

    def load_binary(self, name, kernel, shared, device):
        return None, None, 0, 0, 1024  # module, function, registers, spills, max threads


class CompileOnlyDriver:
    """Triton's view of a GPU of `arch` whose kernel launches do nothing."""

    def __init__(self, arch: int):
        self.target = GPUTarget("cuda", arch, 32)
        self.utils = _CompileOnlyUtils(arch)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target

    def get_active_torch_device(self):
        return torch.device("cpu")

    def launcher_cls(self, src, metadata):
        return lambda *args, **kwargs: None


def _jit_kernels(arch: int) -> list:
    """The JIT functions the launcher calls for `arch`, for every pool it takes."""
    splits = {va.split_kernel(va.config_for_arch(arch // 10, arch % 10, kv), heads=8, fp8_pool=kv != torch.bfloat16)[0]
              for kv in _pool_dtypes(arch)}
    return [va._verify_plan_kernel, _draft_mask.tree_mask_kernel, *splits, va._verify_merge_kernel]


@contextlib.contextmanager
def compilations() -> Iterator[list[tuple[str, bool]]]:
    """Within: every Triton compile request is recorded as (kernel, found in the cache); a
    listener already in place still hears them."""
    events: list[tuple[str, bool]] = []
    previous = knobs.compilation.listener

    def listen(**kw):
        events.append((kw["src"].name, bool(kw["cache_hit"])))
        if previous is not None:
            previous(**kw)
    knobs.compilation.listener = listen
    try:
        yield events
    finally:
        knobs.compilation.listener = previous


@contextlib.contextmanager
def compile_only(arch: int) -> Iterator[list[tuple[str, bool]]]:
    """Within: Triton compiles for `arch` and launches nothing; yields the (kernel, cache hit) list."""
    previous_cpu = va._CPU_TENSORS_OK
    # The driver in force, or None when none was made yet (reset_active would make the default
    # one, which fails on a machine with no GPU).
    previous_driver = driver._active
    kernels = _jit_kernels(arch)
    for kernel in kernels:
        kernel.device_caches.clear()  # the JIT keeps the target and its kernels per device index
    triton_compiler.max_shared_mem.cache_clear()  # cached per device index too
    driver.set_active(CompileOnlyDriver(arch))
    va._CPU_TENSORS_OK = True
    try:
        with compilations() as events:
            yield events
    finally:
        driver.set_active(previous_driver)
        va._CPU_TENSORS_OK = previous_cpu
        for kernel in kernels:
            kernel.device_caches.clear()
        triton_compiler.max_shared_mem.cache_clear()


# The plugin's draft-block masks: DFlash's chains (causal, or all visible), DDTree's trees
MASK_KINDS = ("chain", "full", "tree")


def plugin_mask(kind: str, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, draft_tokens: int):
    """(packed mask, block_mask) as the plugin makes them on a GPU for a batch of `kind`: a tree
    packed by its kernel (sglang_plugin.packed_custom_mask, which off a GPU takes torch ops), or
    the chains' shared draft block."""
    from .sglang_plugin import shared_draft_block
    if kind != "tree":
        return shared_draft_block(draft_tokens, kind == "chain", qo_indptr.device), True
    batch = qo_indptr.shape[0] - 1
    size = draft_tokens * (draft_tokens + 1)  # each request's t x (L + t) block, with L = 1
    custom = torch.ones(batch * size, dtype=torch.bool, device=qo_indptr.device)
    mask_indptr = torch.arange(0, (batch + 1) * size, size, dtype=torch.int64, device=qo_indptr.device)
    return _draft_mask.tree_mask(custom, mask_indptr, qo_indptr, kv_indptr, int(qo_indptr[-1]), draft_tokens), False


def launch_like_sglang(arch: int, heads: int, batch: int, draft_tokens: int, with_lse: bool,
                       kv_dtype: torch.dtype = torch.bfloat16, index_dtype: torch.dtype = torch.int64,
                       mask_kind: str = "tree", device: str = "cpu") -> None:
    """One verify call as SGLang's plugin makes it: int32 indptrs, kv_indices of index_dtype
    (SGLang's Triton backend passes int64), bf16 draft latents, a pool of kv_dtype with scales
    when it is fp8, the draft-block mask of mask_kind as the plugin makes it (verify_mask), and the
    config the launcher picks for `arch`."""
    scale = 1.0 if kv_dtype == torch.bfloat16 else 0.5
    cfg = va.config_for_arch(arch // 10, arch % 10, kv_dtype)
    n_tok = batch * draft_tokens
    q = torch.zeros(n_tok, heads, va.D_LATENT, dtype=torch.bfloat16, device=device)
    pool = torch.zeros(64, va.D_LATENT, dtype=torch.bfloat16, device=device).to(kv_dtype)
    indptr = torch.arange(0, batch + 1, dtype=torch.int32, device=device)
    qo_indptr = torch.arange(0, n_tok + 1, draft_tokens, dtype=torch.int32, device=device)
    mask, block = plugin_mask(mask_kind, qo_indptr, indptr, draft_tokens)
    lse = torch.zeros(n_tok, heads, dtype=torch.float32, device=device) if with_lse else None
    va.verify_attention(q, torch.zeros(n_tok, va.D_LATENT, dtype=torch.bfloat16, device=device), pool,
                        torch.zeros(batch, dtype=index_dtype, device=device), indptr, qo_indptr, mask, 0.07,
                        lse=lse, max_q_len=draft_tokens, num_splits=132, config=cfg, k_scale=scale, v_scale=scale,
                        block_mask=block)


def check_cases(heads=(8, 16), batches=CHECK_BATCHES, draft_tokens=(16, 64), kv_dtypes=va.KV_DTYPES,
                index_dtypes=(torch.int64, torch.int32), mask_kinds=MASK_KINDS):
    return [(h, b, t, lse, kv, idx, mask) for h in heads for b in batches for t in draft_tokens
            for lse in (False, True) for kv in kv_dtypes for idx in index_dtypes for mask in mask_kinds]


def _misses(arch: int, case: tuple, events: list[tuple[str, bool]]) -> list[str]:
    h, batch, t, with_lse, kv_dtype, index_dtype, mask = case
    pool = str(kv_dtype).removeprefix("torch.")
    indices = str(index_dtype).removeprefix("torch.")
    return [f"sm_{arch} {name} (h={h}, batch={batch}, t={t}, lse={with_lse}, pool={pool}, kv_indices={indices}, "
            f"mask={mask})" for name, hit in events if not hit]


def _pool_dtypes(arch: int) -> tuple:
    """The pool dtypes the launcher takes on `arch`."""
    return tuple(d for d in va.KV_DTYPES if d == torch.bfloat16 or va.fp8_capable(arch // 10, arch % 10))


def cache_misses(arch: int, heads=(8, 16)) -> list[str]:
    """The launcher's kernels that Triton would compile for `arch` (empty: all prebuilt)."""
    misses = []
    for case in check_cases(heads, kv_dtypes=_pool_dtypes(arch)):
        with compile_only(arch) as events:
            launch_like_sglang(arch, *case)
        misses += _misses(arch, case, events)
    return misses


def gpu_cache_misses(heads=(8, 16)) -> tuple[int, list[str]]:
    """The same launches on this machine's GPU with the real driver (TRITON_CACHE_DIR set to a
    prebuilt cache): (kernels loaded, the ones Triton compiled instead)."""
    major, minor = torch.cuda.get_device_capability()
    arch = major * 10 + minor
    misses = []
    with compilations() as events:
        for case in check_cases(heads, kv_dtypes=_pool_dtypes(arch)):
            start = len(events)
            launch_like_sglang(arch, *case, device="cuda")
            misses += _misses(arch, case, events[start:])
        torch.cuda.synchronize()
    return len(events), misses


def check_cache(archs, heads=(8, 16)) -> int:
    """Compile-only: print every launcher call that would not find its prebuilt binary in
    Triton's cache folder (TRITON_CACHE_DIR); 0 when none, 1 otherwise."""
    misses = [miss for arch in archs for miss in cache_misses(arch, heads)]
    for miss in misses:
        print(f"MISS: {miss}", file=sys.stderr)
    if misses:
        print(f"{len(misses)} launcher call(s) would compile at first use instead of loading a prebuilt binary from "
              f"{knobs.cache.dir}: build the kernels with this Triton ({triton.__version__}; the image's TRITON_SPEC) "
              f"and this Python", file=sys.stderr)
        return 1
    print(f"every launcher call finds its prebuilt binary in {knobs.cache.dir}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, action="append",
                    help="check compile-only for this architecture (e.g. 120, 90), no GPU needed; "
                         "without it: launch on this machine's GPU")
    ap.add_argument("--heads", type=int, action="append", help="query heads per rank (default 8, 16)")
    a = ap.parse_args(argv)
    heads = tuple(a.heads or (8, 16))
    if a.arch:
        return check_cache(a.arch, heads)
    loaded, missed = gpu_cache_misses(heads)
    print(f"{loaded} kernel loads, {len(missed)} compiled instead of loaded from the prebuilt cache")
    for miss in missed:
        print("MISS:", miss)
    return 1 if missed or not loaded else 0


if __name__ == "__main__":
    sys.exit(main())
