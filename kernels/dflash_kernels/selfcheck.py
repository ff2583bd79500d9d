"""The verify kernel checked on the card it is about to serve, before it serves.

Why: the kernels are built without a GPU, and a wrong result raises nothing. A verify step
with wrong attention accepts or rejects the wrong draft tokens, and the server keeps answering.
sm_120's code has run only on an H200 so far (RESULTS.md). So when the SGLang plugin is
switched on, each server process first runs the kernel once on its own card, through the
launch a call it serves runs (MlaVerify._run) with SGLang's argument layout (a (pool, 1, 576)
pool, int64 kv_indices, DDTree's flat bool mask and DFlash's causal chains), on small random
inputs, and compares every output row with the float32 reference. On any failure SGLang's own
verify path stays in place and the log says why.

An operator can run the same check by hand on a node, in the engine image:

    python3 -m dflash_kernels.selfcheck --all-devices [--heads 8] [--kv-dtype bf16|fp8_e4m3]
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import math
import sys
import threading
import time
from dataclasses import dataclass

import torch
from dflash_kernels_startup import ENV

# (the package re-exports the function verify_attention, which hides the module's name)
va = importlib.import_module(".verify_attention", __package__)

# Per output row (one draft token and head) ||ours - ref|| / ||ref||. bf16 operands, bf16 P and
# a bf16 output put rows near 2e-3 (the tests bound the whole output at 1e-2); a wrong mask bit,
# scale or slice moves a row by far more than 2e-2.
ROW_TOL = 2e-2
# Prefix lengths of the checked batch: none (the draft block alone, where a wrong mask bit shows
# most), part of one tile, and prefixes cut into many slices (at 132-188 SMs). The last two, and
# the last alone, are checked as batches of their own too (`_check`).
DEFAULT_PREFIXES = (0, 37, 3000, 8000)
# A batch past 8 requests, with SGLang's graph-path dtypes (int64 qo_indptr, a uint8 mask): its
# plan and tree-mask kernels are other binaries (padded for 16 requests) that serve batches of
# 9 and more, and the graph runner hands the plugin these dtypes.
WIDE_PREFIXES = (5, 0, 40, 17, 300, 1, 64, 9, 120, 33, 2, 77)
SM_SCALE = 1.0 / math.sqrt(192)  # DeepSeek V3 / Kimi K2
# An fp8 pool's scales, far from 1 so that a scale applied twice, or not at all, fails.
FP8_SCALES = (0.37, 1.9)
KV_DTYPES = {"bf16": torch.bfloat16, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
# The check's kernels take milliseconds. One that hangs on a card it never ran on (a barrier
# protocol the hardware runs differently) cannot be stopped, but the process can say so before
# its start hangs behind it.
GPU_TIMEOUT_S = 30.0
# The whole check, compiles included (a few kernels, where the image's prebuilt ones do not serve).
CHECK_TIMEOUT_S = 300.0


@dataclass
class SelfCheck:
    passed: bool
    device: str  # name and compute capability
    kernel: str  # the split kernel the launcher chose for this card and pool
    heads: int
    kv_dtype: str
    worst_row_err: float  # largest per-row relative error (nan when the run failed)
    seconds: float
    detail: str = ""  # why it failed
    compiled: int = 0  # kernels Triton compiled for the check, none of them in its cache

    def line(self) -> str:
        verdict = "passed" if self.passed else "FAILED"
        text = (f"verify kernel self-check {verdict} on {self.device}: {self.kernel}, {self.heads} heads, "
                f"{self.kv_dtype} pool, worst row error {self.worst_row_err:.1e} (bound {ROW_TOL:.0e}), "
                f"{self.seconds:.2f} s")
        notes = [self.detail] if self.detail else []
        if self.compiled:  # (the image's prebuilt binaries did not serve: another card or Triton)
            notes.append(f"{self.compiled} kernel(s) compiled at first use, not prebuilt for this card and Triton")
        return "; ".join([text, *notes])


def random_case(prefixes, draft_len: int, heads: int, kv_dtype, device, gen: torch.Generator):
    """One batch in SGLang's layout: a pool holding the prefixes at scattered slots (and unused
    rows), int64 kv_indices, random trees per request as DDTree's flat bool mask (prefix columns
    random too: the kernel must not read them)."""
    pool = sum(prefixes) + 256
    kv = torch.randn(pool, va.D_LATENT, generator=gen).to(kv_dtype)
    perm = torch.randperm(pool, generator=gen)
    kv_indices = perm[:sum(prefixes)].to(torch.int64)
    n = draft_len * len(prefixes)
    q = torch.randn(n, heads, va.D_LATENT, generator=gen).to(torch.bfloat16)
    k_ext = torch.randn(n, va.D_LATENT, generator=gen).to(torch.bfloat16)
    trees = [va.tree_mask_from_parents(va.random_tree_parents(draft_len, gen)) for _ in prefixes]
    flat = []
    for L, tree in zip(prefixes, trees, strict=True):
        block = torch.rand(draft_len, L + draft_len, generator=gen) < 0.5
        block[:, L:] = tree
        flat.append(block.reshape(-1))
    sizes = [draft_len * (L + draft_len) for L in prefixes]
    case = dict(q=q, k_ext=k_ext, kv=kv, kv_indices=kv_indices,
                kv_indptr=torch.tensor([0, *torch.tensor(prefixes).cumsum(0).tolist()], dtype=torch.int32),
                qo_indptr=torch.arange(len(prefixes) + 1, dtype=torch.int32) * draft_len,
                custom_mask=torch.cat(flat),
                mask_indptr=torch.tensor([0, *torch.tensor(sizes).cumsum(0).tolist()], dtype=torch.int64))
    case = {k: v.to(device) for k, v in case.items()}
    case["trees"] = [tree.to(device) for tree in trees]
    return case


def row_errors(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """(tokens, heads) relative error of each output row; nan where ours is nan."""
    diff = (out.float() - ref.float()).norm(dim=-1)
    return diff / ref.float().norm(dim=-1).clamp_min(1e-30)


def wait_for_gpu(device: torch.device, timeout_s: float) -> None:
    """Wait at most timeout_s for the work queued on the current stream; TimeoutError if the GPU
    is still on it then."""
    if device.type != "cuda":
        return
    done = torch.cuda.Event()
    done.record()
    deadline = time.monotonic() + timeout_s
    while not done.query():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the kernel did not finish within {timeout_s:g} s (it hangs on this card); the GPU "
                               f"stays busy with it, so this start will hang: restart the engine with {ENV}=0")
        time.sleep(0.002)


def _go_on(abandoned: threading.Event | None) -> None:
    """Raise Abandoned once the check's caller gave up on it (after slow compiles, say): a check
    must not go on allocating and launching beside the server's start, its graph capture among it."""
    if abandoned is not None and abandoned.is_set():
        raise Abandoned("the check was abandoned at its time limit")


def _one_run(case, draft_len: int, chains: bool, scales, serve, timeout_s: float, graph_dtypes: bool = False,
             abandoned: threading.Event | None = None) -> float:
    """Worst row error of one call (DDTree's custom mask, or DFlash's chains: causal, no mask);
    `graph_dtypes`: qo_indptr as int64 and the mask as uint8, as SGLang's CUDA graph runner has them."""
    n, heads = case["q"].shape[:2]
    kb = case["kv"].reshape(-1, 1, va.D_LATENT)
    out = torch.full((n, heads, va.D_NOPE), float("nan"), dtype=torch.bfloat16, device=case["q"].device)
    mask, mask_indptr = (None, None) if chains else (case["custom_mask"], case["mask_indptr"])
    qo_indptr = case["qo_indptr"]
    if graph_dtypes:
        qo_indptr = qo_indptr.to(torch.int64)
        mask = None if mask is None else mask.to(torch.uint8)
    serve(case["q"], case["k_ext"].reshape(n, 1, va.D_LATENT), out, kb, qo_indptr, case["kv_indptr"],
          case["kv_indices"], mask, chains, mask_indptr, draft_len, SM_SCALE, *scales)
    wait_for_gpu(out.device, timeout_s)  # before the reference, whose host syncs would wait forever
    _go_on(abandoned)  # (the reference is GPU work too)
    blocks = [va.chain_tree_mask(draft_len, case["q"].device) if chains else tree for tree in case["trees"]]
    ref, _ = va.reference_verify_attention(case["q"], case["k_ext"], case["kv"], case["kv_indices"], case["kv_indptr"],
                                           case["qo_indptr"], blocks, SM_SCALE, *scales)
    errors = row_errors(out, ref)
    return float("nan") if torch.isnan(errors).any() else float(errors.max())


def resolve_device(device) -> torch.device:
    """`device` as a torch.device with its index ("cuda" is the current GPU)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _device_name(device: torch.device) -> str:
    if device.type != "cuda":
        return str(device)
    p = torch.cuda.get_device_properties(device)
    return f"{p.name} (sm_{p.major}{p.minor})"


class Abandoned(Exception):
    """The check ran past its time limit and its caller went on: it stops at its next call."""


def _check(device, heads, kv_dtype, draft_len, prefixes, wide, gen, serve, timeout_s,
           abandoned: threading.Event | None = None) -> tuple[float, str, str]:
    """(worst row error, the split kernel's name, why it failed or "") of the check on `device`."""
    fp8 = kv_dtype != torch.bfloat16
    scales = FP8_SCALES if fp8 else (1.0, 1.0)
    q_probe = torch.empty(1, heads, va.D_LATENT, device=device, dtype=torch.bfloat16)
    cfg = va.plan(q_probe, len(prefixes), draft_len, kv_dtype=kv_dtype)[0]
    kernel = va.split_kernel(cfg, heads, fp8)[0].__name__
    # The batch, then its last two requests, then its last one alone: a lone request runs another
    # path (no plan kernel; the merge counts its slices itself) and each batch size may take
    # another merge tile, and the lone request is the latency-critical call.
    runs = [(subset, False) for subset in dict.fromkeys((tuple(prefixes), tuple(prefixes[-2:]), tuple(prefixes[-1:])))]
    runs += [(tuple(wide), True)] if wide else []
    errors = []
    for subset, graph_dtypes in runs:
        _go_on(abandoned)
        case = random_case(subset, draft_len, heads, kv_dtype, device, gen)
        # DDTree's custom mask, then DFlash's chains; a NaN in any fails (max() would drop it)
        for chains in (False, True):
            _go_on(abandoned)
            errors.append(_one_run(case, draft_len, chains, scales, serve, timeout_s, graph_dtypes, abandoned))
    if any(math.isnan(e) for e in errors):
        return float("nan"), kernel, "rows left unwritten or NaN"
    worst = max(errors)
    return worst, kernel, "rows differ from the float32 reference" if worst >= ROW_TOL else ""


def run(device, heads: int, kv_dtype=torch.bfloat16, draft_len: int = 16, prefixes=DEFAULT_PREFIXES,
        seed: int | None = None, serve=None, timeout_s: float = GPU_TIMEOUT_S, wide=WIDE_PREFIXES,
        check_timeout_s: float = CHECK_TIMEOUT_S) -> SelfCheck:
    """Run the plugin's launch on `device` and compare each output row with the reference. Never
    raises and never waits longer than check_timeout_s: the result says what went wrong. `serve`
    stands in for the plugin's launch in tests (default: a fresh MlaVerify's)."""
    from .prebuilt import compilations
    from .sglang_plugin import MlaVerify
    device = resolve_device(device)
    dtype_name = next((k for k, v in KV_DTYPES.items() if v == kv_dtype), str(kv_dtype))
    gen = torch.Generator().manual_seed(seed if seed is not None else int(time.time_ns() % 2**31))
    start = time.perf_counter()
    result = {"worst": float("nan"), "kernel": "?", "detail": "", "hung": False, "compiled": 0}
    abandoned = threading.Event()

    def body():
        try:
            # Triton launches on the current device: make it this one (--all-devices, and a thread
            # starts on device 0)
            with (torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext(),
                  compilations() as compiles):
                result["worst"], result["kernel"], result["detail"] = _check(
                    device, heads, kv_dtype, draft_len, prefixes, wide, gen, serve or MlaVerify()._run, timeout_s,
                    abandoned)
            result["compiled"] = sum(1 for _name, cache_hit in compiles if not cache_hit)
        except Abandoned:
            return  # (the verdict is already the timeout's)
        except Exception as error:  # noqa: BLE001 - any failure is a verdict, not a crash of the server
            result["detail"] = f"{type(error).__name__}: {error}"
            result["hung"] = isinstance(error, TimeoutError)
        # The check's memory (its pool, the workspace and the reference's float32 copies, ~100 MB
        # at the peak) goes back to the driver: the server runs after its KV pool was sized, in the
        # headroom the operator tuned mem-fraction-static for. (Not behind a hung kernel: freeing
        # device memory waits for the device.)
        if device.type == "cuda" and not result["hung"]:
            torch.cuda.empty_cache()

    # In a thread, because a hung kernel can also block a launch (loading a kernel's module may
    # wait for the device), where no deadline of the check's own would run.
    worker = threading.Thread(target=body, name="dflash-selfcheck", daemon=True)
    worker.start()
    worker.join(check_timeout_s)
    if worker.is_alive():
        abandoned.set()
        result["detail"] = (f"TimeoutError: the check did not finish within {check_timeout_s:g} s (a kernel hangs or "
                            f"blocks on this card), so this start will hang: restart the engine with {ENV}=0")
    return SelfCheck(passed=not result["detail"], device=_device_name(device), kernel=result["kernel"], heads=heads,
                     kv_dtype=dtype_name, worst_row_err=result["worst"], seconds=time.perf_counter() - start,
                     detail=result["detail"], compiled=result["compiled"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Check the verify kernel on this machine's GPUs against the float32 "
                                             "reference, as the SGLang plugin does before it serves.")
    ap.add_argument("--heads", type=int, default=8, help="attention heads per GPU (Kimi K2 at TP8: 8)")
    ap.add_argument("--kv-dtype", choices=sorted(KV_DTYPES), default="bf16", help="the pool's dtype (--kv-cache-dtype)")
    ap.add_argument("--draft-len", type=int, default=16, help="draft tokens per request")
    ap.add_argument("--device", default="cuda", help="torch device (default: the current GPU)")
    ap.add_argument("--all-devices", action="store_true", help="check every visible GPU")
    a = ap.parse_args(argv)
    if a.all_devices:
        if not torch.cuda.is_available():
            print("no CUDA device is visible (run the container with --gpus all)", file=sys.stderr)
            return 2
        devices = [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    else:
        devices = [a.device]
    results = [run(d, a.heads, KV_DTYPES[a.kv_dtype], a.draft_len) for d in devices]
    for d, r in zip(devices, results, strict=True):
        print(f"{d}: {r.line()}")
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
