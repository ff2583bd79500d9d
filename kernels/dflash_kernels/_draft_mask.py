"""The packed draft-block mask of requests without a custom mask (DFlash's chains), in one kernel:
bit j of word w of token row r is column 32 w + j of r's request's draft block (verify_attention's
layout, `_pack_bits`)."""
import torch
import triton
import triton.language as tl

# Mask words (32 draft columns each) the ahead-of-time build compiles the kernel for: draft blocks
# of up to 64 tokens; a longer block compiles at first use.
PREBUILT_WORDS = (1, 2)


# batch is not specialised (Triton would key batch = 1 and multiples of 16 apart), so one
# binary a (WORDS, BS_PAD, CAUSAL) serves every batch of its bucket
@triton.jit(do_not_specialize=["batch"])
def chain_mask_kernel(qo_indptr, out, batch, WORDS: tl.constexpr, BS_PAD: tl.constexpr, CAUSAL: tl.constexpr):
    """One program a token row: find its request, then write its WORDS mask words."""
    row = tl.program_id(0)
    requests = tl.arange(0, BS_PAD)
    ends = tl.load(qo_indptr + 1 + requests, mask=requests < batch, other=2**30)
    b = tl.sum((ends <= row).to(tl.int32))  # the requests that end at or before this row
    start = tl.load(qo_indptr + b)
    t = tl.load(qo_indptr + b + 1) - start
    i = row - start
    bit = tl.arange(0, 32)
    for w in tl.static_range(WORDS):
        column = w * 32 + bit
        visible = column < t
        if CAUSAL:
            visible = visible & (column <= i)
        # distinct bits: their sum is their OR (bit 31 makes the int32 negative, as _pack_bits does)
        tl.store(out + row * WORDS + w, tl.sum(visible.to(tl.int32) << bit))


def chain_mask_constexprs(batch: int, max_q_len: int, causal: bool) -> dict:
    """The kernel's constexprs for one launch; the AOT build compiles the same ones."""
    return dict(WORDS=-(-max_q_len // 32), BS_PAD=triton.next_power_of_2(max(batch, 2)), CAUSAL=bool(causal))


def chain_mask(qo_indptr: torch.Tensor, num_tokens: int, max_q_len: int, causal: bool) -> torch.Tensor:
    """(num_tokens, ceil(max_q_len / 32)) int32 mask words of the requests of int32 qo_indptr."""
    batch = qo_indptr.shape[0] - 1
    const = chain_mask_constexprs(batch, max_q_len, causal)
    out = torch.empty(num_tokens, const["WORDS"], dtype=torch.int32, device=qo_indptr.device)
    chain_mask_kernel[(num_tokens,)](qo_indptr, out, batch, **const)
    return out
