"""The packed draft-block mask of requests without a custom mask (DFlash's chains), in one kernel:
bit j of word w of token row r is column 32 w + j of r's request's draft block (verify_attention's
layout, `_pack_bits`)."""
import triton
import triton.language as tl


@triton.jit
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
