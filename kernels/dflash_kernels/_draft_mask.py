"""SGLang's custom mask (DDTree's trees) packed for the kernel, in one small kernel a verify
call: bit j of word w of token row r is column 32 w + j of r's request's draft block
(verify_attention's layout, `_pack_bits`).

SGLang's verify calls the attention backend once a layer (61 in Kimi K2.6) with the same mask;
as torch ops in every layer (some twenty launches) its packing cost 1.7-2.7 ms a step on the
H200, as this kernel in every layer 60-100 us (RESULTS.md, session 15). The plugin now packs it
in a forward's first layer only (`sglang_plugin.ForwardPass`, session 26). Requests without a custom
mask (DFlash's chains) need no kernel: they share one draft block built once
(`sglang_plugin.shared_draft_block`, RESULTS.md session 25).

The kernel does not specialise on its pointers' alignment (byte gathers gain nothing from it),
so one prebuilt binary serves any tensor SGLang passes.
"""
from __future__ import annotations

import triton
import triton.language as tl

try:
    import torch
except ImportError:  # the ahead-of-time build (aot.py) needs only the kernels and constexprs
    torch = None

# Mask words (32 draft columns each) the ahead-of-time build compiles the kernel for: draft blocks
# of up to 64 tokens; a longer block compiles at first use.
PREBUILT_WORDS = (1, 2)


# batch is not specialised (Triton would key batch = 1 and multiples of 16 apart), so one
# binary a (WORDS, BS_PAD) serves every batch of its bucket
@triton.jit(do_not_specialize=["batch"],
            do_not_specialize_on_alignment=["custom_mask", "mask_indptr", "qo_indptr", "kv_indptr", "out"])
def tree_mask_kernel(custom_mask, mask_indptr, qo_indptr, kv_indptr, out, batch,
                     WORDS: tl.constexpr, BS_PAD: tl.constexpr):
    """One program a token row: its request b, then the draft columns of its row of b's block in
    SGLang's custom mask (bytes; b's block is t_b x (L_b + t_b), row-major from mask_indptr[b])."""
    row = tl.program_id(0)
    requests = tl.arange(0, BS_PAD)
    ends = tl.load(qo_indptr + 1 + requests, mask=requests < batch, other=2**30)
    b = tl.minimum(tl.sum((ends <= row).to(tl.int32)), batch - 1)
    start = tl.load(qo_indptr + b)
    t = tl.load(qo_indptr + b + 1) - start
    i = row - start
    prefix = (tl.load(kv_indptr + b + 1) - tl.load(kv_indptr + b)).to(tl.int64)
    first = tl.load(mask_indptr + b).to(tl.int64) + i.to(tl.int64) * (prefix + t) + prefix
    bit = tl.arange(0, 32)
    for w in tl.static_range(WORDS):
        column = w * 32 + bit
        inside = (column < t) & (i < t)
        visible = (tl.load(custom_mask + first + column, mask=inside, other=0) != 0) & inside
        tl.store(out + row * WORDS + w, tl.sum(visible.to(tl.int32) << bit))


def tree_mask_constexprs(batch: int, max_q_len: int) -> dict:
    """The tree kernel's constexprs for one launch; the AOT build compiles the same ones."""
    return dict(WORDS=-(-max_q_len // 32), BS_PAD=triton.next_power_of_2(max(batch, 2)))


def tree_mask(custom_mask: torch.Tensor, mask_indptr: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
              num_tokens: int, max_q_len: int) -> torch.Tensor:
    """verify_attention.pack_custom_mask in one kernel: int32 qo_indptr and kv_indptr, int64
    mask_indptr, a flat bool (or uint8) custom_mask; (num_tokens, ceil(max_q_len / 32)) int32."""
    batch = qo_indptr.shape[0] - 1
    const = tree_mask_constexprs(batch, max_q_len)
    out = torch.empty(num_tokens, const["WORDS"], dtype=torch.int32, device=qo_indptr.device)
    if mask_indptr.dtype != torch.int64:
        mask_indptr = mask_indptr.to(torch.int64)
    if num_tokens:
        flat = custom_mask.reshape(-1)
        tree_mask_kernel[(num_tokens,)](flat.view(torch.uint8) if flat.dtype == torch.bool else flat,
                                        mask_indptr, qo_indptr, kv_indptr, out, batch, **const)
    return out
