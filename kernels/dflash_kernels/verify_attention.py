"""Target-verify attention for MLA (absorbed weights), split-KV, CUDA-graph safe.

What it computes (the same function as SGLang's ``extend_attention_fwd`` in target-verify mode):
for every request b with prefix length L_b and t_b draft tokens, every draft row i and head h

    s_j  = sm_scale * <q[i, h, :576], K_j[:576]>        for the L_b prefix latents and the
                                                        draft latents j that row i may see
    out[i, h, :512] = sum_j softmax(s)_j * V_j           (V is the first 512 values of K)

where a prefix latent read from a scaled (e.g. fp8) pool counts as K_j = k_scale * stored and
V_j = v_scale * stored[:512] (SGLang's k/v descale); draft latents are used as they are.
    lse[i, h]       = ln(sum_j exp(s_j))                 (optional)

Every draft row sees the whole prefix; inside the t_b x t_b draft block a row sees only what the
tree mask allows (its ancestors and itself; a chain is lower-triangular).

Flow of this file:
  1. the three ``@triton.jit`` kernels: ``_verify_plan_kernel`` (cuts the prefixes into
     slices), ``_verify_split_kernel`` (one program = one block of BLOCK_M query rows x one
     slice of a prefix, or a draft block) and ``_verify_merge_kernel`` (log-sum-exp merge of the
     partial results);
  2. launch configs per architecture and the split count;
  3. the launcher (``verify_attention``), which validates shapes and builds a grid from static
     sizes only;
  4. mask helpers (SGLang's bool ``custom_mask`` -> bit-packed tree mask, parent array -> mask);
  5. a plain-torch float32 reference.

Layout decisions:
  * All t_b * h query rows of a request sit in the MMA's M dimension (row r = token r // h,
    head r % h), so each latent row loaded by a program serves every head and draft token of
    its row block: KV traffic does not grow with t or h.
  * Each latent row is loaded once per tile and used for both Q.K^T (all 576 values) and P.V
    (its first 512 values).
  * An fp8 pool is widened to bf16 as it is loaded (exact), so both dots stay bf16; its scales
    (SGLang's k/v descale) fold into the program's score scale and its partial output.
  * Split-KV, balanced over the batch: the prefixes of all requests are cut into slices of one
    size (about total / NUM_SPLITS tokens, a multiple of BLOCK_N, at least MIN_CHUNK; up to 40%
    longer where that fits every slice in the first wave of programs), so a long request gets
    many slices and a short one few. A one-program kernel (``_verify_plan_kernel``)
    writes the plan from kv_indptr on the device; programs past the last slice return at once.
    A batch of one request needs no plan kernel: its programs cut their own slices.
    Each request's draft block is one more slot. The merge kernel reads the same plan (for one
    request it counts the slices as the programs cut them), so nothing goes through the host.
  * The grid is (row blocks for max_q_len, NUM_SPLITS + 2 * batch): only static sizes.
"""
from __future__ import annotations

import importlib
import logging
import os
from dataclasses import dataclass
from typing import NamedTuple

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

try:
    import torch
except ImportError:  # the ahead-of-time build (aot.py) needs only the kernels and configs below
    torch = None

D_LATENT = 576  # kv_lora_rank 512 + qk_rope_head_dim 64
D_NOPE = 512  # V = first 512 latent values
D_ROPE = 64
LOG2E = 1.4426950408889634  # 1/ln(2)
# Integer arguments whose values vary between calls (batch, splits, rows, mask width). The JIT
# must not specialise on them (a value of 1, a multiple of 16): then one compiled binary serves
# every call, and it is the one the image's ahead-of-time build put in Triton's cache (aot.py).
# (stride_mask_req is 0 for a shared draft block: not specialised, so one binary serves both masks)
SPLIT_RUNTIME_INTS = ["stride_mask", "stride_mask_req", "rows_max", "NUM_SPLITS", "BATCH"]


# ----------------------------------------------------------------------------------------------
# 1/ kernels
# ----------------------------------------------------------------------------------------------
@triton.jit
def _online_softmax_step(q_nope, q_pe, kn, kp, visible, m_i, l_i, acc, qk_scale):
    """One KV tile: s = Q.K^T (576 wide, split 512 + 64), online softmax, acc += P.V.

    q_nope (M, 512) / q_pe (M, 64) bf16, kn (N, 512) / kp (N, 64) bf16, visible (M, N) or (1, N)
    bool. Scores are kept in log2 units (qk_scale = sm_scale / ln 2).
    """
    s = tl.dot(q_nope, tl.trans(kn))
    s = tl.dot(q_pe, tl.trans(kp), s)
    s = tl.where(visible, s * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # a row with nothing visible so far keeps m = -inf; subtract 0 then so no NaN appears
    m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_sub)
    p = tl.math.exp2(s - m_sub[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(kn.dtype), kn, acc)
    return m_new, l_i, acc


@triton.jit
def _base_chunk(total, NUM_SPLITS, MIN_CHUNK: tl.constexpr, BLOCK_N: tl.constexpr):
    """The plan's base slice length for `total` prefix latents: total / NUM_SPLITS rounded up to
    whole tiles, and at least MIN_CHUNK (rounded up to whole tiles). One expression for the plan
    kernel and for a one-request program that cuts its own slice (_program_slice), which must
    agree on it."""
    return tl.maximum(tl.cdiv(tl.cdiv(total, NUM_SPLITS), BLOCK_N), tl.cdiv(MIN_CHUNK, BLOCK_N)) * BLOCK_N


@triton.jit(do_not_specialize=["BATCH", "NUM_SPLITS"])
def _verify_plan_kernel(KV_INDPTR, PLAN, BATCH, NUM_SPLITS, MIN_CHUNK: tl.constexpr,
                        BLOCK_N: tl.constexpr, BS_PAD: tl.constexpr, SLOT_BLOCK: tl.constexpr,
                        FIT_PCT: tl.constexpr):
    """One program. Cuts the batch's prefixes into slices of one size, balanced over requests:
    chunk0 = ceil(total / NUM_SPLITS) rounded up to BLOCK_N (at least MIN_CHUNK). A request's last
    slice is what is left of it, so a batch gets up to NUM_SPLITS + BATCH - 1 slices, and the
    grid's NUM_SPLITS columns are one wave of programs (default_num_splits): the slices past them
    start only when a first-wave program ends. So the plan takes the smallest chunk >= chunk0
    whose slices fit NUM_SPLITS columns, when it is at most FIT_PCT percent of chunk0; else chunk0.
    Request i gets n_i = ceil(L_i / chunk) slices at slots first_i .. first_i + n_i - 1 (sum n_i
    <= NUM_SPLITS + BATCH since chunk >= total / NUM_SPLITS). Writes, int32:
      PLAN[p, 0:3]           = (request, lo, hi) of prefix slot p (request = BATCH: unused slot)
      PLAN[S + i, 0:2]       = (first_i, n_i), S = NUM_SPLITS + BATCH, for the merge kernel."""
    offs_b = tl.arange(0, BS_PAD)
    b_ok = offs_b < BATCH
    start = tl.load(KV_INDPTR + offs_b, mask=b_ok, other=0)
    lens = tl.load(KV_INDPTR + offs_b + 1, mask=b_ok, other=0) - start
    total = tl.sum(lens, 0)
    chunk0 = _base_chunk(total, NUM_SPLITS, MIN_CHUNK, BLOCK_N)
    # The plan kernel is on every call's critical path, so the search below (a reduction a step,
    # about 0.1 us) runs only for a batch whose slices do not fit as cut and do fit when
    # FIT_PCT percent longer: a binary search, in tiles, for the smallest such chunk (the slice
    # count falls as the chunk grows).
    chunk = chunk0
    if tl.sum(tl.cdiv(lens, chunk0), 0) > NUM_SPLITS:
        lo_t = chunk0 // BLOCK_N + 1
        hi_t = tl.minimum(tl.cdiv(tl.max(lens, 0), BLOCK_N), (chunk0 // BLOCK_N) * FIT_PCT // 100)
        if (lo_t <= hi_t) & (tl.sum(tl.cdiv(lens, hi_t * BLOCK_N), 0) <= NUM_SPLITS):
            while lo_t < hi_t:
                mid = (lo_t + hi_t) // 2
                fits = tl.sum(tl.cdiv(lens, mid * BLOCK_N), 0) <= NUM_SPLITS
                hi_t = tl.where(fits, mid, hi_t)
                lo_t = tl.where(fits, lo_t, mid + 1)
            chunk = hi_t * BLOCK_N
    n_sl = tl.cdiv(lens, chunk)
    end = tl.cumsum(n_sl, 0)
    first = end - n_sl
    n_slots = NUM_SPLITS + BATCH
    tl.store(PLAN + (n_slots + offs_b) * 4 + 0, first, mask=b_ok)
    tl.store(PLAN + (n_slots + offs_b) * 4 + 1, n_sl, mask=b_ok)
    for p0 in range(0, n_slots, SLOT_BLOCK):
        p = p0 + tl.arange(0, SLOT_BLOCK)
        # request of slot p: the number of requests whose slices end at or before p
        owner = tl.sum(((end[None, :] <= p[:, None]) & b_ok[None, :]).to(tl.int32), 1)
        sel = offs_b[None, :] == owner[:, None]
        f = tl.sum(tl.where(sel, first[None, :], 0), 1)
        L = tl.sum(tl.where(sel, lens[None, :], 0), 1)
        lo = (p - f) * chunk
        hi = tl.minimum(lo + chunk, L)
        ok = p < n_slots
        tl.store(PLAN + p * 4 + 0, owner, mask=ok)
        tl.store(PLAN + p * 4 + 1, lo, mask=ok)
        tl.store(PLAN + p * 4 + 2, hi, mask=ok)


@triton.jit
def _grid_dependency(PDL: tl.constexpr):
    """A split kernel's part in programmatic dependent launch (VerifyConfig.pdl): from 3, wait for
    the kernel before it (launched as its dependent, it may start before that one ends); from 2,
    then let the merge kernel launch (its programs load their rows and slots, then wait for this
    grid's end before their partials' loads). Scalar code, for the Gluon kernels too."""
    if PDL >= 3:
        gdc_wait()
    if PDL >= 2:
        gdc_launch_dependents()


@triton.jit
def _program_slice(pid_s, PLAN, KV_INDPTR, QO_INDPTR, NUM_SPLITS, BATCH, rows_max, NUM_HEADS: tl.constexpr,
                   MIN_CHUNK: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr):
    """(request b, first and end latent row, is_draft, the request's first query token, its draft
    length, its first kv_indices entry) of program column pid_s; b = BATCH for a slot past the
    batch's last slice, whose program returns (the last three then mean nothing). Prefix slices
    come from the plan; the last BATCH columns are the requests' draft blocks (rows set by the
    caller). A batch of one request has no plan kernel: its slices follow from its length alone,
    the plan kernel's chunk0 (which always fits one wave there), so each program cuts its own,
    and the merge counts them the same way (_request_slots). That takes a launch off the call's
    critical path (about 3 us, RESULTS.md session 23).
    A program's first loads wait on nothing: the request's entries are loaded beside the slice's
    where the request is known without them (one request, a draft block), so a program of one
    request is one memory round trip from its first slot index, not three. A split kernel's
    first call: its part in a dependent launch (_grid_dependency) comes before any load.
    The draft length is never more than max_q_len (rows_max / NUM_HEADS), which sized the
    workspace and the mask: a caller's longer draft leaves rows unwritten, but no program stores
    past its slot or reads a mask word past its row.
    Scalar code only, so the Gluon kernels (verify_gluon.py) call it too."""
    _grid_dependency(PDL)
    is_draft = pid_s >= NUM_SPLITS + BATCH
    # (each branch loads the request's entries before it computes anything: loads issue in order)
    if is_draft:
        b = pid_s - (NUM_SPLITS + BATCH)
        qo_start, qo_end, kv_start = _request_entries(b, QO_INDPTR, KV_INDPTR)
        lo = 0
        hi = 0
    elif BATCH == 1:
        kv_end = tl.load(KV_INDPTR + 1)
        qo_start, qo_end, kv_start = _request_entries(0, QO_INDPTR, KV_INDPTR)
        length = kv_end - kv_start
        chunk = _base_chunk(length, NUM_SPLITS, MIN_CHUNK, BLOCK_N)
        lo = pid_s * chunk
        hi = tl.minimum(lo + chunk, length)
        b = tl.where(lo < length, 0, 1)  # 1 = BATCH: a slot past the last slice
    else:
        b = tl.load(PLAN + pid_s * 4)
        lo = tl.load(PLAN + pid_s * 4 + 1)
        hi = tl.load(PLAN + pid_s * 4 + 2)
        # (an unused slot's b is BATCH: its loads stay in bounds)
        qo_start, qo_end, kv_start = _request_entries(tl.minimum(b, BATCH - 1), QO_INDPTR, KV_INDPTR)
    return b, lo, hi, is_draft, qo_start, tl.minimum(qo_end - qo_start, rows_max // NUM_HEADS), kv_start


@triton.jit
def _request_entries(b, QO_INDPTR, KV_INDPTR):
    """(first query token, end query token, first kv_indices entry) of request b."""
    return tl.load(QO_INDPTR + b), tl.load(QO_INDPTR + b + 1), tl.load(KV_INDPTR + b)


@triton.jit
def _keys_of_program(is_draft, t_b, lo, hi, K_EXT, KV, stride_kext, stride_kv):
    """(lo, hi, keys, row stride): a prefix slice reads pool slots kv_indices[lo:hi] of KV; a
    draft block reads the request's t_b draft latents of K_EXT."""
    if is_draft:
        lo = 0
        hi = t_b
        k_base = K_EXT
        k_stride = stride_kext
    else:
        k_base = KV
        k_stride = stride_kv
    return lo, hi, k_base, k_stride


@triton.jit
def _attend_keys(q_nope, q_pe, m_i, l_i, acc, lo, hi, k_base, k_stride, is_draft, idx_ptr, qo_start,
                 mask_row, row_ok, qk_scale, BLOCK_N: tl.constexpr, IDX_AHEAD: tl.constexpr):
    """Online softmax of one program's query rows over its keys lo..hi, BLOCK_N at a time:
      prefix slice: keys at pool slots idx_ptr[lo:hi], all visible;
      draft block:  keys are the request's draft latents (rows qo_start + j of k_base), visible
                    as the tree mask says.
    Keys of an fp8 pool are widened to bf16 as they are loaded (exact), so both dots stay bf16."""
    offs_dn = tl.arange(0, 512)
    offs_dp = 512 + tl.arange(0, 64)
    offs_n = tl.arange(0, BLOCK_N)
    if IDX_AHEAD:
        # the slot indices of the next tile are loaded one iteration ahead, so that the latent
        # gather of a tile does not wait for its own index load
        slot_nx = tl.load(idx_ptr + lo + offs_n, mask=(lo + offs_n < hi) & (not is_draft), other=0)
    for n0 in range(lo, hi, BLOCK_N):
        cols = n0 + offs_n
        col_ok = cols < hi
        if IDX_AHEAD:
            slot = slot_nx
            slot_nx = tl.load(idx_ptr + cols + BLOCK_N, mask=(cols + BLOCK_N < hi) & (not is_draft), other=0)
        else:
            slot = tl.load(idx_ptr + cols, mask=col_ok & (not is_draft), other=0)
        slot = tl.where(is_draft, qo_start + cols, slot).to(tl.int64)
        k_row = k_base + slot * k_stride
        kn = tl.load(k_row[:, None] + offs_dn[None, :], mask=col_ok[:, None], other=0.0).to(tl.bfloat16)
        kp = tl.load(k_row[:, None] + offs_dp[None, :], mask=col_ok[:, None], other=0.0).to(tl.bfloat16)
        # tree mask: a draft tile starts at a multiple of BLOCK_N, so it spans one 32-bit word
        # per row (two when BLOCK_N = 64); prefix programs load nothing here
        w0 = tl.load(mask_row + (n0 >> 5), mask=row_ok & is_draft, other=0)
        if BLOCK_N > 32:
            w1 = tl.load(mask_row + (n0 >> 5) + 1, mask=row_ok & is_draft & (n0 + 32 < hi), other=0)
            word = tl.where(((cols >> 5) & 1)[None, :] == 0, w0[:, None], w1[:, None])
        else:
            word = w0[:, None]
        bit = (word >> (cols & 31)[None, :]) & 1
        visible = ((bit != 0) | (not is_draft)) & col_ok[None, :]
        m_i, l_i, acc = _online_softmax_step(q_nope, q_pe, kn, kp, visible, m_i, l_i, acc, qk_scale)
    return m_i, l_i, acc


@triton.jit(do_not_specialize=SPLIT_RUNTIME_INTS)
def _verify_split_kernel(
    Q, K_EXT, KV, KV_INDICES, KV_INDPTR, QO_INDPTR, TREE_MASK, PLAN,
    PART_O, PART_LSE,
    qk_scale,
    stride_qt, stride_qh, stride_kext, stride_kv, stride_mask, stride_mask_req,
    rows_max, NUM_SPLITS, BATCH,
    k_scale, v_scale,
    NUM_HEADS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MIN_CHUNK: tl.constexpr,
    IDX_AHEAD: tl.constexpr,
    PDL: tl.constexpr,
):
    """One program: BLOCK_M query rows x one prefix slice (or the request's draft block) ->
    partial output and log2-sum-exp2. The pool KV (bf16 or fp8) holds latent / scale: its
    scores are multiplied by k_scale and its values by v_scale, as SGLang's extend kernel does;
    the draft latents K_EXT (bf16) are not scaled."""
    pid_m = tl.program_id(0)  # block of query rows (fastest: blocks of one slice share its KV in L2)
    pid_s = tl.program_id(1)  # slot: prefix slice (< NUM_SPLITS + BATCH) or a request's draft block

    # -- which request and which part of it this program takes (from the plan kernel) --
    b, lo, hi, is_draft, qo_start, t_b, kv_start = _program_slice(pid_s, PLAN, KV_INDPTR, QO_INDPTR, NUM_SPLITS,
                                                                  BATCH, rows_max, NUM_HEADS, MIN_CHUNK, BLOCK_N, PDL)
    if b >= BATCH:
        return  # a slot past the last slice of the batch
    n_rows = t_b * NUM_HEADS
    if pid_m * BLOCK_M >= n_rows:
        return

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = offs_m < n_rows
    tok = offs_m // NUM_HEADS
    head = offs_m % NUM_HEADS
    offs_dn = tl.arange(0, 512)
    offs_dp = 512 + tl.arange(0, 64)

    q_row = Q + (qo_start + tok).to(tl.int64) * stride_qt + head * stride_qh
    q_nope = tl.load(q_row[:, None] + offs_dn[None, :], mask=row_ok[:, None], other=0.0)
    q_pe = tl.load(q_row[:, None] + offs_dp[None, :], mask=row_ok[:, None], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, 512], tl.float32)

    idx_ptr = KV_INDICES + kv_start
    mask_row = TREE_MASK + qo_start.to(tl.int64) * stride_mask_req + tok.to(tl.int64) * stride_mask
    prefix_qk_scale = qk_scale * k_scale
    if KV.dtype.element_ty == K_EXT.dtype.element_ty:
        # One loop serves both kinds of program (the key rows come from K_EXT or KV), so the
        # compiler pipelines a single loop.
        lo, hi, k_base, k_stride = _keys_of_program(is_draft, t_b, lo, hi, K_EXT, KV, stride_kext, stride_kv)
        m_i, l_i, acc = _attend_keys(q_nope, q_pe, m_i, l_i, acc, lo, hi, k_base, k_stride, is_draft, idx_ptr,
                                     qo_start, mask_row, row_ok, tl.where(is_draft, qk_scale, prefix_qk_scale),
                                     BLOCK_N, IDX_AHEAD)
    else:
        # an fp8 pool beside bf16 draft latents: pointers of two types, so a loop for each
        if is_draft:
            m_i, l_i, acc = _attend_keys(q_nope, q_pe, m_i, l_i, acc, 0, t_b, K_EXT, stride_kext, is_draft,
                                         idx_ptr, qo_start, mask_row, row_ok, qk_scale, BLOCK_N, IDX_AHEAD)
        else:
            m_i, l_i, acc = _attend_keys(q_nope, q_pe, m_i, l_i, acc, lo, hi, KV, stride_kv, is_draft,
                                         idx_ptr, qo_start, mask_row, row_ok, prefix_qk_scale, BLOCK_N, IDX_AHEAD)

    # -- partial result: normalised output and log2-sum-exp2 of this slice --
    has = l_i > 0.0
    o = acc * (tl.where(is_draft, 1.0, v_scale) / tl.where(has, l_i, 1.0))[:, None]
    lse2 = tl.where(has, m_i + tl.math.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    part = pid_s.to(tl.int64) * rows_max + offs_m
    tl.store(PART_O + part[:, None] * 512 + offs_dn[None, :], o, mask=row_ok[:, None])
    tl.store(PART_LSE + part, lse2, mask=row_ok)


@triton.jit
def _request_slots(b, PLAN, KV_INDPTR, NUM_SPLITS, BATCH, MIN_CHUNK: tl.constexpr, BLOCK_N: tl.constexpr):
    """(first prefix slot, slot count) of request b, 0 slots for an empty prefix: the plan's, or
    for a batch of one request (no plan kernel) counted from its length as its split programs cut
    their slices (_program_slice). Both come from data the split kernel read before it ran, never
    from what it writes (VerifyConfig.pdl: the merge loads them before it waits for the split).
    Both forms are loaded (the plan's only where it was written) and one kept, without a branch:
    a program's first loads then all go out together."""
    planned = BATCH > 1
    planned_first = tl.load(PLAN + (NUM_SPLITS + BATCH + b) * 4, mask=planned, other=0)
    planned_count = tl.load(PLAN + (NUM_SPLITS + BATCH + b) * 4 + 1, mask=planned, other=0)
    length = tl.load(KV_INDPTR + 1) - tl.load(KV_INDPTR)  # (request 0's, for BATCH == 1)
    own_count = tl.cdiv(length, _base_chunk(length, NUM_SPLITS, MIN_CHUNK, BLOCK_N))
    return tl.where(BATCH == 1, 0, planned_first), tl.where(BATCH == 1, own_count, planned_count)


@triton.jit
def _merge_chunk_rows(k, r, b, s_first, n_used, rows_max, NUM_SPLITS, BATCH):
    """(row of partial k of query row r in the workspace, whether it exists): partial 0 is request
    b's draft block, partial k > 0 its prefix slot s_first + k - 1."""
    ok = k <= n_used
    slot = tl.where(k == 0, NUM_SPLITS + BATCH + b, s_first + k - 1)
    return slot.to(tl.int64) * rows_max + r, ok


@triton.jit
def _merge_weights(lse_s, m):
    """(weights of a chunk's partials, rescale of the sums so far, new running maximum)."""
    m_new = tl.maximum(m, tl.max(lse_s, 0))
    m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)  # all empty so far: weights 0, no NaN
    return tl.math.exp2(lse_s - m_sub), tl.math.exp2(m - m_sub), m_new


@triton.jit
def _merge_bf16_pairs(PART_O, PART_LSE, r, b, pid_d, s_first, n_used, rows_max, NUM_SPLITS, BATCH,
                      BLOCK_D: tl.constexpr, SPLIT_CHUNK: tl.constexpr):
    """The merge's loop over bf16 partials ((sums of BLOCK_D columns, running maximum, weight sum)).
    They are read as int32 words of two columns: loaded as bf16, Triton gave the tile another
    layout than its fp32 sums and converted it through shared memory in every step (RESULTS.md,
    session 31: the merge up to 1.6x slower). A bf16 value's bits are the top half of its fp32."""
    offs_s = tl.arange(0, SPLIT_CHUNK)
    offs_w = pid_d * (BLOCK_D // 2) + tl.arange(0, BLOCK_D // 2)
    words = PART_O.to(tl.pointer_type(tl.int32), bitcast=True)
    m = tl.full([1], float("-inf"), tl.float32)
    w_sum = tl.zeros([1], tl.float32)
    acc_even = tl.zeros([BLOCK_D // 2], tl.float32)
    acc_odd = tl.zeros([BLOCK_D // 2], tl.float32)
    for s0 in range(0, n_used + 1, SPLIT_CHUNK):
        part, ok = _merge_chunk_rows(s0 + offs_s, r, b, s_first, n_used, rows_max, NUM_SPLITS, BATCH)
        lse_s = tl.load(PART_LSE + part, mask=ok, other=float("-inf"))
        x = tl.load(words + part[:, None] * 256 + offs_w[None, :], mask=ok[:, None], other=0)
        o_even = (x << 16).to(tl.float32, bitcast=True)  # column 2i: the word's low half
        o_odd = (x & -65536).to(tl.float32, bitcast=True)  # column 2i + 1: its high half
        w, rescale, m = _merge_weights(lse_s, m)
        acc_even = acc_even * rescale + tl.sum(w[:, None] * o_even, 0)
        acc_odd = acc_odd * rescale + tl.sum(w[:, None] * o_odd, 0)
        w_sum = w_sum * rescale + tl.sum(w, 0)
    return tl.interleave(acc_even, acc_odd), m, w_sum


@triton.jit(do_not_specialize=["stride_lt", "stride_lh", "rows_max", "NUM_SPLITS", "BATCH"])
def _verify_merge_kernel(
    PART_O, PART_LSE, PLAN, KV_INDPTR, QO_INDPTR, OUT, LSE,
    stride_ot, stride_oh, stride_lt, stride_lh,
    rows_max, NUM_SPLITS, BATCH,
    NUM_HEADS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SPLIT_CHUNK: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    MIN_CHUNK: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PDL: tl.constexpr,
):
    """One program = one query row x BLOCK_D output columns. One pass over the request's partials
    (its draft block first, then its prefix slices), SPLIT_CHUNK at a time with a running maximum:
    a chunk's partial outputs do not depend on its lse values, so both loads are in flight
    together and a request of up to SPLIT_CHUNK - 1 slices costs one memory round trip. With more
    chunks, a tile's pipeline stages (MergeTile) keep the loads of the next ones in flight."""
    r = tl.program_id(0)
    pid_d = tl.program_id(1)
    b = tl.program_id(2)
    # the request's slots are loaded beside its rows, not after the early return: a program then
    # waits for one memory round trip before its partials' loads, not two. (Neither slot value is
    # negative; without them in the condition the compiler moves their loads past the return.)
    qo_start = tl.load(QO_INDPTR + b)
    n_rows = (tl.load(QO_INDPTR + b + 1) - qo_start) * NUM_HEADS
    s_first, n_used = _request_slots(b, PLAN, KV_INDPTR, NUM_SPLITS, BATCH, MIN_CHUNK, BLOCK_N)
    if (r >= n_rows) | ((s_first | n_used) < 0):
        return
    if PDL:  # launched as the split kernel's dependent: its partials are complete past this wait
        gdc_wait()

    offs_s = tl.arange(0, SPLIT_CHUNK)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    if PART_O.dtype.element_ty == tl.bfloat16:
        acc, m, w_sum = _merge_bf16_pairs(PART_O, PART_LSE, r, b, pid_d, s_first, n_used, rows_max, NUM_SPLITS,
                                          BATCH, BLOCK_D, SPLIT_CHUNK)
    else:
        m = tl.full([1], float("-inf"), tl.float32)  # running maximum of the partial lse (log2)
        w_sum = tl.zeros([1], tl.float32)
        acc = tl.zeros([BLOCK_D], tl.float32)
        for s0 in range(0, n_used + 1, SPLIT_CHUNK):
            part, ok = _merge_chunk_rows(s0 + offs_s, r, b, s_first, n_used, rows_max, NUM_SPLITS, BATCH)
            lse_s = tl.load(PART_LSE + part, mask=ok, other=float("-inf"))
            o_s = tl.load(PART_O + part[:, None] * 512 + offs_d[None, :], mask=ok[:, None], other=0.0)
            w, rescale, m = _merge_weights(lse_s, m)
            acc = acc * rescale + tl.sum(w[:, None] * o_s, 0)
            w_sum = w_sum * rescale + tl.sum(w, 0)

    has = w_sum > 0.0
    out = acc / tl.where(has, w_sum, 1.0)
    tok = r // NUM_HEADS
    head = r % NUM_HEADS
    o_row = OUT + (qo_start + tok).to(tl.int64) * stride_ot + head * stride_oh
    tl.store(o_row + offs_d, out.to(OUT.dtype.element_ty))
    if WRITE_LSE:
        if pid_d == 0:
            m_sub = tl.where(has, m, 0.0)
            lse = tl.where(has, (m_sub + tl.math.log2(tl.where(has, w_sum, 1.0))) * 0.6931471805599453,
                           float("-inf"))  # log2 -> natural log
            tl.store(LSE + (qo_start + tok).to(tl.int64) * stride_lt + head * stride_lh + tl.arange(0, 1), lse)


# ----------------------------------------------------------------------------------------------
# 2/ launch configs
# ----------------------------------------------------------------------------------------------
class MergeTile(NamedTuple):
    """A launch of the merge kernel: output columns a program, partials loaded at once, and the
    software-pipeline stages of its loop over them (Triton's num_stages)."""
    block_d: int
    chunk: int
    stages: int = 1


@dataclass(frozen=True)
class VerifyConfig:
    block_m: int  # query rows (draft tokens x heads) per program
    block_n: int  # latent rows per KV tile
    num_warps: int
    num_stages: int
    min_chunk: int = 256  # fewest prefix tokens worth a program of their own
    idx_ahead: bool = False  # load the next tile's slot indices one iteration early
    waves: float = 1.0  # programs per SM the default split count aims at (2: two resident CTAs)
    gluon: bool = False  # sm_90 only: the Gluon split kernel (verify_gluon.py); block_m 64, 8 warps
    warp_specialized: bool = False  # with gluon: the warp-specialised Gluon kernel (4 warps + 2 workers)
    # with warp_specialized, for bf16 pools: output columns the S group keeps (256 or 128; the V
    # group the rest), and Q's blocks it holds in registers (0; 1: columns 0..255; 2: and rope;
    # 3: columns 0..383)
    s_cols: int = 256
    q_regs: int = 0
    # with warp_specialized, for bf16 pools: P.V takes P from registers (the S group its own, the
    # V group P read from shared memory once for both of its chains)
    p_regs: bool = False
    # with warp_specialized: the S group issues S_{j+1} before tile j's softmax (True), or S_j at
    # the top of iteration j (False: two K buffers suffice, so 64-latent tiles fit)
    s_ahead: bool = True
    mma2: bool = False  # the Gluon split kernel over S^T for mma.sync GPUs (verify_mma2.py); block 32 x 32, 8 warps
    # with mma2: bf16 pools run its two-team kernel (verify_teams.py: a default partition of 4
    # warps, a team of 4 and a loader, 12 in all), fp8 pools the 8-warp kernel (verify_mma2.py)
    teams: bool = False
    # with teams: hold each latent's rope part as one 128-byte line of shared memory
    # (verify_teams.py's ROPE_LINES), and S^T's partial sums in a layout without bank conflicts
    # (SUMS_XOR); CONFIGS["sm120"] sets both (session 15), False is session 13's layout
    rope_lines: bool = False
    sums_xor: bool = False
    # merge kernel: a MergeTile (or its fields as a tuple); None: chosen from the split count and
    # the batch (merge_tile)
    merge_tile: MergeTile | tuple | None = None
    # with warp_specialized and s_cols 256: partial outputs in bf16 (half the bytes the split kernel
    # stores and the merge reads), each MMA group staging its columns in shared memory so that a
    # warp stores whole rows; the workspace follows (alloc_workspace(config=...))
    partials_bf16: bool = False
    # programmatic dependent launch (sm_90 and later; off in every config: on the H200 levels 2
    # and 3 take 1.1 us off a layer at 32k, t = 16, and add 1.8 us at 8k, t = 64, RESULTS.md
    # session 35): 1, the merge kernel is launched as the split kernel's dependent, so its launch
    # and its programs' first loads overlap the split kernel's end; 2, and the split kernel lets it
    # launch as soon as all its programs run (the merge's programs then wait on SMs the split's
    # have left); 3, and the split kernel is launched as the dependent of the kernel before it,
    # and waits for it before its first load
    pdl: int = 0

    def __post_init__(self):
        if self.merge_tile is not None and not isinstance(self.merge_tile, MergeTile):
            object.__setattr__(self, "merge_tile", MergeTile(*self.merge_tile))
        if self.s_cols not in (128, 256) or self.q_regs not in (0, 1, 2, 3):
            raise ValueError(f"VerifyConfig: s_cols must be 128 or 256 and q_regs 0, 1, 2 or 3 (got {self.s_cols}, "
                             f"{self.q_regs})")
        if (self.s_cols != 256 or self.q_regs or self.p_regs or not self.s_ahead) and not self.warp_specialized:
            raise ValueError("VerifyConfig: s_cols, q_regs, p_regs and s_ahead shape sm_90's warp-specialised kernel; "
                             "set warp_specialized=True (and gluon=True) or leave them at 256, 0, False and True")
        if self.warp_specialized and self.s_ahead and self.num_stages < 3:
            raise ValueError("VerifyConfig: s_ahead needs num_stages >= 3 (S_{j+1} is issued while tile j is held: "
                             "with two buffers the loader would wait on every tile); set s_ahead=False")
        if (self.rope_lines or self.sums_xor) and not self.teams:
            raise ValueError("VerifyConfig: rope_lines and sums_xor shape sm_120's two-team kernel; set mma2=True "
                             "and teams=True or leave them False")
        if self.partials_bf16 and not ((self.warp_specialized and self.s_cols == 256) or self.mma2):
            raise ValueError("VerifyConfig: partials_bf16 needs a split kernel that stages its stores (the "
                             "warp-specialised one with s_cols=256, or sm_120's mma2 kernels); leave it False")
        if self.pdl not in (0, 1, 2, 3):
            raise ValueError(f"VerifyConfig: pdl must be 0 (off), 1, 2 or 3 (got {self.pdl})")
        if self.q_regs and self.s_cols != 128:
            raise ValueError("VerifyConfig: q_regs needs s_cols=128; with 256 output columns the S group has no "
                             "registers left for Q (it spills)")

    def smem_bytes(self) -> int:
        """Rough shared-memory need: Q tile once plus num_stages KV tiles (bf16)."""
        return 2 * D_LATENT * (self.block_m + max(self.num_stages, 1) * self.block_n)


# Hopper (H100/H200, 227 KB shared memory per block): 64 rows x 512 fp32 accumulators need 8 warps.
# sm_120 (RTX PRO 6000 / RTX 50xx, ~99 KB per block) and sm_80/89: a smaller tile that fits.
CONFIGS = {
    # measured best on the H200 (RESULTS.md, session 28): the warp-specialised Gluon split kernel
    # (session 4: an S group of 4 warps, a V group and a loader; 1.3x faster at 128k than the
    # lock-step Gluon kernel of session 2, which stays in the sweeps) over 64-latent tiles in two
    # K buffers, the S group issuing S_j at the top of its own iteration. Until session 28 it ran
    # 32-latent tiles in four buffers with S_{j+1} issued ahead of tile j's softmax, Q's first
    # 384 columns and P in registers (sessions 13 and 27; the candidates keep that layout): per
    # layer in a graph the 64-latent tiles take 7-8% less at 128k-200k, t = 16, 12% at t = 64.
    # A profile of the old layout had the tensor pipe 49% busy and the S group's serial chain
    # (36 wgmma issued, the softmax, the hand-over of P) setting the pace: 64 latents a wgmma halve
    # the instructions and softmax passes a latent. It reads every pool: its loader widens an fp8
    # pool's rows to bf16 (session 8), in the same tiles since session 29 (split_kernel).
    # The best config of the Triton kernel on sm_90, SM90_TRITON below, is 1.8x slower at 128k
    # (the fallback without Gluon).
    # Since session 31 its partial outputs are bf16, each MMA group storing whole rows through
    # shared memory, and the merge reads them as words of two columns: per layer 4-5 us less at
    # 32k-200k, t = 16 (128k at 68-69% of the floor, 200k at 73%), 2.3 at 1k, 3.8 on 4 x 8k.
    "sm90": VerifyConfig(block_m=64, block_n=64, num_warps=4, num_stages=2, min_chunk=64, gluon=True,
                         warp_specialized=True, s_ahead=False, partials_bf16=True),
    # sm_120 (100 KB of shared memory an SM, 99 KB a block, mma.sync only): the Gluon kernel over
    # S^T (verify_mma2.py), 32 rows x 32 latents over 8 warps with Q in registers, S^T's columns
    # split over the warps: 92 KB, 240 registers (232 for fp8 pools, which it widens in shared
    # memory), no spill in the sm_120a build. bf16 pools run it as two teams of 4 warps out of
    # phase with a loader partition (verify_teams.py; 92.6 KB, no spill). Not run on an sm_120
    # card; measured on the H200 running mma.sync code (RESULTS.md sessions 9-13): at 128k,
    # t = 16, 2.2x faster than the best Triton-language tile for bf16 pools (SM120_TRITON; the
    # teams 11% faster than the 8-warp kernel there, 12-13% on mixed batches, as fast at 1k),
    # 4.2x faster than the Triton-language kernel for fp8 pools (SM120_TRITON_FP8). The teams hold
    # the rope part as lines and the partial sums in an XOR layout: 2.3-3.5% faster from 128k
    # than session 13's layout, the same at 1k and 32k (session 15).
    # Since session 31 its partial outputs are bf16, as sm_90's (its kernels already store rows
    # through shared memory; the merge reads words of two columns): on the H200 running this
    # code, per layer 2.0-2.5 us less at 1k-128k, t = 16.
    "sm120": VerifyConfig(block_m=32, block_n=32, num_warps=8, num_stages=2, mma2=True, teams=True,
                          rope_lines=True, sums_xor=True, partials_bf16=True),
    "sm80": VerifyConfig(block_m=32, block_n=16, num_warps=4, num_stages=2),
}
MERGE_NUM_WARPS = 4
# The merge tile for a mean number of partials per request (its slices and its draft block, a
# static bound from the split count and the batch): (most mean partials, tile), the first that
# holds it. Up to 32 (t = 64, batches: about 10-17), a program per query row over all 512 columns,
# 8 partials a step in a 4-stage pipeline, so the loads of later steps are in flight while a step
# is summed. Up to 64 (34 at t = 16, bs = 1 with sm_120's 32-row blocks on 132 SMs), 64 x 64 in
# one round trip; more (67 with sm_90's 64-row blocks), 64 x 128. Measured on the H200, merge
# alone in graph replay (RESULTS.md, session 22; Triton 3.8): the row tile takes bs = 8 mixed,
# t = 64 from 41.1 to 17.7 us (sm_90's config) and 40.5 to 15.7 (sm_120's), t = 16 from 17.7 to
# 14.0 and 15.8 to 10.7, bs = 1 t = 64 from 14.2 to 12.5; at bs = 1, t = 16 (34 and 67 partials)
# it is 1.1-1.9 us slower than the one-round-trip tiles, which stay there (sessions 5 and 11).
MERGE_TILE_BY_PARTIALS = ((32, MergeTile(512, 8, 4)), (64, MergeTile(64, 64)), (None, MergeTile(64, 128)))
# With bf16 partials (over half the warps, merge_kernel) 128 columns x 64 partials in two stages
# take the place of 64 x 64 (34-35 partials: bs = 1 with sm_120's 32-row blocks, bs = 2 with
# sm_90's). Measured on the H200 (RESULTS.md, session 32): merge alone in graph replay 0-1.4 us
# less; per layer in a graph of eight, bs = 2 x 128k with sm_90's config 143.5 -> 141.9 us, sm_120's
# code at 32k 51.4 -> 51.1, at 128k the same. 128 x 32 in one round trip was 0.1-1.1 us faster
# than a program per row alone at 12-24 partials but 0.4-1.0 us slower per layer, so the row tile
# keeps them.
MERGE_TILE_BY_PARTIALS_BF16 = ((32, MergeTile(512, 8, 4)), (64, MergeTile(128, 64, 2)), (None, MergeTile(64, 128)))


def _merge_table(cfg: VerifyConfig):
    return MERGE_TILE_BY_PARTIALS_BF16 if cfg.partials_bf16 else MERGE_TILE_BY_PARTIALS


def merge_tiles(cfg: VerifyConfig) -> tuple:
    """Every tile merge_tile may pick for a config (the ahead-of-time build compiles them all)."""
    return (cfg.merge_tile,) if cfg.merge_tile is not None else tuple(tile for _, tile in _merge_table(cfg))


def merge_tile(cfg: VerifyConfig, num_splits: int, batch: int) -> MergeTile:
    """The merge kernel's tile; the batch's slices are at most num_splits + batch - 1."""
    if cfg.merge_tile is not None:
        return cfg.merge_tile
    mean_partials = (num_splits + batch - 1) / batch + 1
    return next(tile for most, tile in _merge_table(cfg) if most is None or mean_partials <= most)


PLAN_SLOT_BLOCK = 64  # slots the plan kernel fills per step
# The plan lengthens its slices by up to this percentage so that they fit one wave of programs.
# Measured on the H200 (RESULTS.md, session 23; bench/plan_chunks.py): batches at t = 16 were
# 5-22% faster where that took 2-17% longer slices, and 10% at 48 x 1k where it took 33%; at
# t = 64, where the batch of 8 mixed lengths would need 56% longer slices, one wave was 23% slower.
PLAN_FIT_PCT = 140
# KV pool dtypes the launcher takes (SGLang's --kv-cache-dtype auto/bf16, fp8_e4m3, fp8_e5m2);
# fp8 values widen to bf16 exactly, so the dots stay bf16.
KV_DTYPES = (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2) if torch is not None else ()


# sm_120 where Gluon cannot be imported: the best Triton-language tile, 32 rows x 32 latents over
# 4 warps (76 KB, a 96-byte spill of values set before the loop). Triton lays both dots over
# [1, num_warps] warps, so with 8 warps each S would be computed twice and every warp would read
# all of Q; 4 warps do neither. 1.7x faster at 128k than the 32 x 16 tile (RESULTS.md session 9).
SM120_TRITON = VerifyConfig(block_m=32, block_n=32, num_warps=4, num_stages=2)
# and for fp8 pools: that kernel keeps each fp8 tile and its bf16 widening in shared memory, so the
# 32 x 32 tile would take 113 KB; the 32 x 16 tile fits in 93 KB
SM120_TRITON_FP8 = VerifyConfig(block_m=32, block_n=16, num_warps=4, num_stages=2)
# sm_90 where verify_gluon.py cannot be imported (a Triton other than the one it is written for:
# Gluon's API is experimental): the best Triton-language config on the H200, 1.8x slower at 128k.
SM90_TRITON = VerifyConfig(block_m=64, block_n=64, num_warps=8, num_stages=2, min_chunk=64, idx_ahead=True)
_GLUON_OK: bool | None = None


def gluon_available() -> bool:
    """Whether this Triton runs the Gluon split kernels (checked once; logged when it does not)."""
    global _GLUON_OK
    if _GLUON_OK is None:
        try:
            importlib.import_module(".verify_gluon", __package__)
            importlib.import_module(".verify_mma2", __package__)
            importlib.import_module(".verify_teams", __package__)
            _GLUON_OK = True
        except Exception as exc:  # ImportError, or an API that changed between Triton releases
            logging.getLogger(__name__).warning(
                "dflash_kernels: the Gluon split kernels are unavailable with Triton %s (%s: %s); "
                "sm_90 and sm_120 use the Triton-language kernel", triton.__version__, type(exc).__name__, exc)
            _GLUON_OK = False
    return _GLUON_OK


def split_kernel(cfg: VerifyConfig, heads: int, fp8_pool: bool = False):
    """(kernel, constexprs, launch options) of the split kernel a config runs for a bf16 or an
    fp8 pool; one choice for the launcher and the ahead-of-time build, so both compile the same
    binary."""
    const = dict(NUM_HEADS=heads, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, MIN_CHUNK=cfg.min_chunk, PDL=cfg.pdl)
    # (num_stages: only part of the cache key for the Gluon kernels, which pipeline by hand)
    opts = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if cfg.pdl >= 3:
        opts["launch_pdl"] = True
    if cfg.mma2 and cfg.teams and not fp8_pool:
        verify_teams = importlib.import_module(".verify_teams", __package__)
        return (verify_teams._verify_split_kernel_teams, {**const, "ROPE_LINES": cfg.rope_lines, "SUMS_XOR": cfg.sums_xor},
                {**opts, "num_warps": verify_teams.TEAM_WARPS})
    if cfg.mma2:
        verify_mma2 = importlib.import_module(".verify_mma2", __package__)
        return verify_mma2._verify_split_kernel_mma2, const, opts
    if not cfg.gluon:
        return _verify_split_kernel, {**const, "IDX_AHEAD": cfg.idx_ahead}, opts
    verify_gluon = importlib.import_module(".verify_gluon", __package__)  # Hopper; not the interpreter's
    if cfg.warp_specialized:
        ws_const = {**const, "NUM_STAGES": cfg.num_stages,  # K buffers, filled by the loader partition
                    "S_COLS": cfg.s_cols, "Q_REGS": cfg.q_regs, "P_REGS": cfg.p_regs, "S_AHEAD": cfg.s_ahead}
        if fp8_pool:
            # the config's tiles, buffers and S placement, with the S group's 256 columns and Q and P
            # in shared memory: the fp8 loader's 80 registers leave the S group no room for Q or P
            # (session 8). Until session 29 fp8 pools ran 32-latent tiles in four buffers whatever
            # the config; with the loader widening a tile before it waits for the next one's buffer,
            # the bf16 pools' 64-latent tiles in two buffers are as fast at 128k-200k, t = 16, and
            # 2.5-5% faster at 1k-32k and 3.6% at t = 64 (RESULTS.md)
            ws_const.update(S_COLS=256, Q_REGS=0, P_REGS=False)
        return verify_gluon._verify_split_kernel_gluon_ws, ws_const, {**opts, "maxnreg": verify_gluon.WS_MAXNREG}
    return verify_gluon._verify_split_kernel_gluon, const, opts


def plan_kernel(cfg: VerifyConfig, bs_pad: int):
    """(kernel, constexprs, launch options) of the plan kernel; one choice for the launcher and
    the ahead-of-time build."""
    const = dict(MIN_CHUNK=cfg.min_chunk, BLOCK_N=cfg.block_n, BS_PAD=bs_pad, SLOT_BLOCK=PLAN_SLOT_BLOCK,
                 FIT_PCT=PLAN_FIT_PCT)
    return _verify_plan_kernel, const, dict(num_warps=4, num_stages=1)


def merge_kernel(heads: int, write_lse: bool, tile: MergeTile, cfg: VerifyConfig):
    """(kernel, constexprs, launch options) of the merge kernel for one tile. bf16 partials are
    half the words a column: over half the warps a thread holds the same words as over fp32 ones,
    so the row tiles keep a chunk's partials in each thread and sum them there (over 4 warps
    Triton spread them over 2 warps and summed through shared memory, with 8 barriers a step)."""
    const = dict(NUM_HEADS=heads, BLOCK_D=tile.block_d, SPLIT_CHUNK=tile.chunk, WRITE_LSE=write_lse,
                 MIN_CHUNK=cfg.min_chunk, BLOCK_N=cfg.block_n,  # (to count a lone request's slices)
                 PDL=cfg.pdl > 0)
    warps = MERGE_NUM_WARPS // 2 if cfg.partials_bf16 else MERGE_NUM_WARPS
    opts = dict(num_warps=warps, num_stages=tile.stages)
    if cfg.pdl:
        opts["launch_pdl"] = True
    return _verify_merge_kernel, const, opts


def is_plain_pool(kv_dtype, k_scale: float = 1.0, v_scale: float = 1.0) -> bool:
    """A bf16 pool without scales: the one pool every split kernel reads (see takes_scales)."""
    return kv_dtype == torch.bfloat16 and k_scale == 1.0 and v_scale == 1.0


def takes_scales(split_fn) -> bool:
    """Whether a split kernel takes the pool's scales, and so reads scaled and fp8 pools: the
    Triton-language kernel, the shipped warp-specialised Gluon kernel and sm_120's Gluon kernel;
    sm_90's lock-step Gluon kernel (_verify_split_kernel_gluon), kept in the sweeps and the GPU
    tests, reads an unscaled bf16 pool only."""
    return "k_scale" in split_fn.arg_names


def config_key(major: int) -> str:
    """The CONFIGS entry of an arch (one config serves every pool)."""
    if major == 9:
        return "sm90"
    if major >= 12:
        return "sm120"
    return "sm80"


def config_for_arch(major: int, minor: int = 0, kv_dtype=None) -> VerifyConfig:
    """The config of an arch for a pool of kv_dtype (None: bfloat16), scaled or not: CONFIGS'
    entry, or where Gluon is unavailable a Triton-language config (on sm_120 one for each pool
    dtype, as their shared memory differs)."""
    cfg = CONFIGS[config_key(major)]
    if (cfg.gluon or cfg.mma2) and not gluon_available():
        if major == 9:
            return SM90_TRITON
        return SM120_TRITON if kv_dtype in (None, torch.bfloat16) else SM120_TRITON_FP8
    return cfg


_DEVICE_CACHE: dict = {}
# Triton's CPU interpreter (TRITON_INTERPRET=1) runs these kernels on CPU tensors: the CPU tests
# use it to check the kernels' logic on a machine with no GPU.
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
# CPU tensors are accepted under the interpreter, and by prebuilt.compile_only (which compiles
# the launcher's kernels for a GPU target without running them).
_CPU_TENSORS_OK = _INTERPRET


def _device_info(device: torch.device):
    if device.type == "cpu":
        return (8, 0, 4)  # interpreter: small tiles, a few "SMs" so several slices are exercised
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _DEVICE_CACHE:
        p = torch.cuda.get_device_properties(idx)
        _DEVICE_CACHE[idx] = (p.major, p.minor, p.multi_processor_count)
    return _DEVICE_CACHE[idx]


def fp8_capable(major: int, minor: int) -> bool:
    """Whether the split kernel reads fp8 pools on this architecture (Triton's e4m3 needs sm_89+)."""
    return (major, minor) >= (8, 9)


def fp8_pool_supported(device: torch.device) -> bool:
    """fp8_capable for a device (the interpreter's CPU runs them all)."""
    major, minor, _ = _device_info(device)
    return device.type == "cpu" or fp8_capable(major, minor)


def default_num_splits(num_sms: int, batch: int, row_blocks: int, waves: float = 1.0) -> int:
    """Prefix slices for the whole batch (shared out by length on the device) so that
    row_blocks x slices <= waves x SMs (one program per SM at these tile sizes; rounding down
    avoids a last, nearly empty wave). Depends on static sizes only."""
    return max(1, min(1024, int(waves * num_sms) // max(1, row_blocks)))


# ----------------------------------------------------------------------------------------------
# 3/ launcher
# ----------------------------------------------------------------------------------------------
def _latent_2d(x: torch.Tensor, name: str) -> torch.Tensor:
    if x.dim() == 3:
        if x.shape[1] != 1:
            raise ValueError(f"{name}: expected (n, 1, 576) or (n, 576), got {tuple(x.shape)}")
        x = x[:, 0]
    if x.dim() != 2 or x.shape[1] != D_LATENT:
        raise ValueError(f"{name}: expected (n, 576) or (n, 1, 576), got {tuple(x.shape)}")
    if x.stride(1) != 1:
        raise ValueError(f"{name}: the latent dimension must be contiguous")
    return x


def workspace_shape(batch: int, num_heads: int, max_q_len: int, num_splits: int):
    """Shapes of the two scratch tensors: partial outputs and partial log2-sum-exp2, one slot per
    prefix slice (at most num_splits + batch) and one per request's draft block."""
    rows = max_q_len * num_heads
    slots = num_splits + 2 * batch
    return (slots, rows, D_NOPE), (slots, rows), (slots, 4)


def partial_dtype(cfg: VerifyConfig):
    """The dtype of a config's partial outputs (float32, or bfloat16 with partials_bf16)."""
    return torch.bfloat16 if cfg.partials_bf16 else torch.float32


def alloc_workspace(batch, num_heads, max_q_len, num_splits, device, config: VerifyConfig | None = None):
    """(partial_o, partial_lse float32, plan int32) for ``verify_attention``; partial_o is float32,
    or what `config` (default: the device's) stores (partial_dtype)."""
    so, sl, sp = workspace_shape(batch, num_heads, max_q_len, num_splits)
    if config is None:
        config = config_for_arch(*_device_info(torch.device(device))[:2])
    return (torch.empty(so, dtype=partial_dtype(config), device=device),
            torch.empty(sl, dtype=torch.float32, device=device),
            torch.empty(sp, dtype=torch.int32, device=device))


def plan(q: torch.Tensor, batch: int, max_q_len: int | None = None, num_splits: int | None = None,
         config: VerifyConfig | None = None, waves: float | None = None, kv_dtype=None):
    """Static launch plan (config, num_splits, max_q_len) from shapes, the pool's dtype and the
    device only."""
    major, minor, sms = _device_info(q.device)
    cfg = config or config_for_arch(major, minor, kv_dtype)
    if cfg.pdl and major < 9:
        arch = f"sm_{major}{minor}" if q.device.type == "cuda" else "the CPU"
        raise ValueError(f"config: pdl={cfg.pdl} (programmatic dependent launch) needs sm_90 or later, and "
                         f"{q.device} is {arch}; set pdl=0")
    h = q.shape[1]
    mq = int(max_q_len) if max_q_len is not None else q.shape[0]
    row_blocks = triton.cdiv(mq * h, cfg.block_m)
    ns = num_splits or default_num_splits(sms, batch, row_blocks, waves or cfg.waves)
    return cfg, ns, mq


def verify_attention(
    q: torch.Tensor,
    k_extend: torch.Tensor,
    kv_cache: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_indptr: torch.Tensor,
    qo_indptr: torch.Tensor,
    tree_mask: torch.Tensor,
    sm_scale: float,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    workspace: tuple[torch.Tensor, torch.Tensor] | None = None,
    max_q_len: int | None = None,
    num_splits: int | None = None,
    config: VerifyConfig | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    block_mask: bool = False,
    plan_ready: bool = False,
    _phases: tuple = ("split", "merge"),
) -> torch.Tensor:
    """MLA target-verify attention.

    Args:
      q: (num_tokens, num_heads, 576) bfloat16; num_tokens = sum_b t_b, rows of request b are
         qo_indptr[b] .. qo_indptr[b+1].
      k_extend: (num_tokens, 576) or (num_tokens, 1, 576) bfloat16, the draft tokens' own latents
         (row r is the latent of draft token r), as SGLang passes them beside the pool.
      kv_cache: (pool_tokens, 576) or (pool_tokens, 1, 576) bfloat16, float8_e4m3fn or
         float8_e5m2, the latent pool; it holds latent / scale (see k_scale, v_scale).
      kv_indices: (>= kv_indptr[-1],) int32 or int64, the pool slot of every prefix token
         (token-level for any page size, as SGLang's Triton backend builds them).
      kv_indptr: (batch + 1,) int32, prefix of request b is kv_indices[kv_indptr[b]:kv_indptr[b+1]].
      qo_indptr: (batch + 1,) int32.
      tree_mask: (num_tokens, ceil(max_q_len / 32)) int32, bit-packed draft block: bit j of word
         j // 32 in row r says whether draft row r sees draft token j of its own request.
         See ``pack_custom_mask``, ``tree_mask_from_parents``, ``chain_tree_mask``.
         With block_mask, (>= max_q_len, ceil(max_q_len / 32)) int32 instead: one draft block's
         rows, shared by every request (row i is draft token i of each request; bits past a
         request's own draft length are ignored). A chain or an all-visible block is the same
         for any batch, so it can be built once (``draft_block_mask``).
      sm_scale: softmax scale (1/sqrt(192) for DeepSeek V3 / Kimi K2).
      out: optional (num_tokens, num_heads, 512) bfloat16 output, written in place.
      lse: optional (num_tokens, num_heads) float32, natural-log sum-exp of the scaled scores.
      workspace: optional (partial_o, partial_lse, plan) from ``alloc_workspace`` (required for CUDA
         graph capture: without it this call allocates).
      max_q_len: static upper bound on t_b (default num_tokens). Sets the grid; graph-safe.
      num_splits: prefix slices per request (default: fill the chip once for this batch size).
      k_scale, v_scale: the pool's scales, as SGLang's ``k_descale`` / ``v_descale``: scores of
         pool keys are multiplied by k_scale and P.V over pool values by v_scale; the draft
         latents are not scaled. fp8 pools need sm_89 or newer; on sm_90 they run the
         shipped Gluon kernel, which widens the pool's rows in its loader.
      block_mask: tree_mask is one draft block's rows shared by every request (see tree_mask).
      plan_ready: the workspace's plan already holds this batch's slices: an earlier call on this
         stream planned the same kv_indptr values, batch, max_q_len, num_splits and config into
         this workspace (the other layers of one forward). The plan kernel is then not launched; a
         stale plan gives wrong results, so pass it only when nothing could have changed.
    Returns ``out``.
    """
    # -- validation --
    if q.dim() != 3 or q.shape[2] != D_LATENT:
        raise ValueError(f"q: expected (num_tokens, num_heads, 576), got {tuple(q.shape)}")
    if q.dtype != torch.bfloat16:
        raise TypeError(f"q: expected bfloat16, got {q.dtype}")
    if q.stride(2) != 1:
        raise ValueError("q: the last dimension must be contiguous")
    if not q.is_cuda and not _CPU_TENSORS_OK:
        raise ValueError("q: expected a CUDA tensor")
    n_tok, h, _ = q.shape
    k_ext = _latent_2d(k_extend, "k_extend")
    kv = _latent_2d(kv_cache, "kv_cache")
    if k_ext.dtype != torch.bfloat16:
        raise TypeError(f"k_extend: expected bfloat16, got {k_ext.dtype}")
    if kv.dtype not in KV_DTYPES:
        raise TypeError(f"kv_cache: expected one of {', '.join(map(str, KV_DTYPES))}, got {kv.dtype}")
    if kv.dtype != torch.bfloat16 and not fp8_pool_supported(q.device):
        raise ValueError(f"kv_cache: {kv.dtype} pools need a GPU of compute capability 8.9 or newer "
                         "(this kernel's fp8 loads); use a bfloat16 pool")
    if k_ext.shape[0] != n_tok:
        raise ValueError(f"k_extend: {k_ext.shape[0]} rows, q has {n_tok} tokens")
    if kv_indices.dtype not in (torch.int32, torch.int64) or kv_indices.dim() != 1:
        raise TypeError(f"kv_indices: expected 1-D int32/int64, got {kv_indices.dtype} {tuple(kv_indices.shape)}")
    for name, x in (("kv_indptr", kv_indptr), ("qo_indptr", qo_indptr)):
        if x.dtype != torch.int32 or x.dim() != 1:
            raise TypeError(f"{name}: expected 1-D int32, got {x.dtype} {tuple(x.shape)}")
    indices = {"kv_indices": kv_indices, "kv_indptr": kv_indptr, "qo_indptr": qo_indptr}
    given = {"k_extend": k_ext, "kv_cache": kv, **indices, "tree_mask": tree_mask, "out": out, "lse": lse}
    for name, x in given.items():
        if x is not None and x.device != q.device:
            raise ValueError(f"{name}: on {x.device}, q on {q.device}")
    # the kernels read these at base + i: a strided view would be read as the wrong entries
    for name, x in indices.items():
        if x.numel() > 1 and x.stride(0) != 1:
            raise ValueError(f"{name}: expected a contiguous tensor (stride 1), got stride {x.stride(0)}; "
                             "pass .contiguous()")
    batch = qo_indptr.shape[0] - 1
    if batch < 1 or kv_indptr.shape[0] != batch + 1:
        raise ValueError(f"qo_indptr ({qo_indptr.shape[0]}) and kv_indptr ({kv_indptr.shape[0]}) must both be batch + 1 >= 2 long")
    cfg, ns, mq = plan(q, batch, max_q_len, num_splits, config, kv_dtype=kv.dtype)
    # The workspace, the grid and the mask are sized by max_q_len: a request with more draft
    # tokens would have rows left unwritten, and its partials stored past its slot. What can be
    # checked without reading qo_indptr (no host sync): it is positive, and the tokens fit.
    if n_tok and (mq < 1 or n_tok > batch * mq):
        raise ValueError(f"max_q_len={mq}: every request's draft length must be at most max_q_len, and "
                         f"{n_tok} tokens in {batch} request(s) need at least {triton.cdiv(n_tok, batch)}; "
                         "pass the batch's longest draft (SGLang's max_extend_len)")
    split_fn, split_const, split_opts = split_kernel(cfg, h, fp8_pool=kv.dtype != torch.bfloat16)
    reads_scales = takes_scales(split_fn)
    if not reads_scales and not is_plain_pool(kv.dtype, k_scale, v_scale):
        raise ValueError(f"config: {split_fn.__name__} reads an unscaled bfloat16 pool; leave config=None "
                         "(or pass SM90_TRITON) for an fp8 or a scaled pool")
    words = triton.cdiv(mq, 32)
    mask_rows_ok = tree_mask.dim() == 2 and (tree_mask.shape[0] >= mq if block_mask else tree_mask.shape[0] == n_tok)
    if tree_mask.dtype != torch.int32 or not mask_rows_ok or tree_mask.shape[1] < words or tree_mask.stride(1) != 1:
        rows = f">= {mq}" if block_mask else str(n_tok)
        raise ValueError(f"tree_mask: expected int32 ({rows}, >= {words}) with contiguous rows"
                         f"{' (block_mask: one draft block of max_q_len rows or more; pass max_q_len)' if block_mask else ''}, "
                         f"got {tree_mask.dtype} {tuple(tree_mask.shape)}")
    if out is None:
        out = torch.empty((n_tok, h, D_NOPE), dtype=torch.bfloat16, device=q.device)
    elif out.shape != (n_tok, h, D_NOPE) or out.dtype != torch.bfloat16 or out.stride(2) != 1:
        raise ValueError(f"out: expected bfloat16 ({n_tok}, {h}, 512), got {out.dtype} {tuple(out.shape)}")
    if lse is not None and (lse.shape != (n_tok, h) or lse.dtype != torch.float32):
        raise ValueError(f"lse: expected float32 ({n_tok}, {h}), got {lse.dtype} {tuple(lse.shape)}")
    so, sl, sp = workspace_shape(batch, h, mq, ns)
    if workspace is None:
        workspace = alloc_workspace(batch, h, mq, ns, q.device, config=cfg)
    part_o, part_lse, plan_buf = workspace
    if part_o.shape != so or part_lse.shape != sl or plan_buf.shape != sp \
            or part_o.dtype != partial_dtype(cfg) or part_lse.dtype != torch.float32 \
            or plan_buf.dtype != torch.int32 or not all(x.is_contiguous() for x in workspace):
        raise ValueError(f"workspace: expected contiguous {str(partial_dtype(cfg)).removeprefix('torch.')} {so}, "
                         f"float32 {sl}, int32 {sp} "
                         f"(alloc_workspace(..., config=)), got {[(tuple(x.shape), x.dtype) for x in workspace]}")
    if n_tok == 0:
        return out

    rows_max = mq * h
    bs_pad = triton.next_power_of_2(max(batch, 2))
    grid = (triton.cdiv(rows_max, cfg.block_m), ns + 2 * batch)
    if "split" in _phases:  # (_phases: the benchmark times the merge alone)
        if batch > 1 and not plan_ready:  # (one request's programs cut their own slices: _program_slice)
            plan_fn, plan_const, plan_opts = plan_kernel(cfg, bs_pad)
            plan_fn[(1,)](kv_indptr, plan_buf, batch, ns, **plan_const, **plan_opts)
        split_args = (q, k_ext, kv, kv_indices, kv_indptr, qo_indptr, tree_mask, plan_buf,
                      part_o, part_lse,
                      sm_scale * LOG2E,
                      q.stride(0), q.stride(1), k_ext.stride(0), kv.stride(0), tree_mask.stride(0),
                      0 if block_mask else tree_mask.stride(0),  # (the rows of a request's first token)
                      rows_max, ns, batch)
        if reads_scales:
            split_args += (float(k_scale), float(v_scale))
        split_fn[grid](*split_args, **split_const, **split_opts)
    lse_arg = lse if lse is not None else part_lse  # dummy pointer when not written
    if "merge" in _phases:
        tile = merge_tile(cfg, ns, batch)
        merge_fn, merge_const, merge_opts = merge_kernel(h, lse is not None, tile, cfg)
        merge_fn[(rows_max, D_NOPE // tile.block_d, batch)](
            part_o, part_lse, plan_buf, kv_indptr, qo_indptr, out, lse_arg,
            out.stride(0), out.stride(1),
            lse.stride(0) if lse is not None else 0, lse.stride(1) if lse is not None else 0,
            rows_max, ns, batch,
            **merge_const, **merge_opts,
        )
    return out


# ----------------------------------------------------------------------------------------------
# 4/ masks
# ----------------------------------------------------------------------------------------------
def _pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """bits: (n, words * 32) bool -> (n, words) int32, bit j of word w = column 32 w + j."""
    n, cols = bits.shape
    w = bits.view(n, cols // 32, 32).to(torch.int64)
    shifts = torch.arange(32, device=bits.device, dtype=torch.int64)
    v = (w << shifts).sum(-1)  # in [0, 2^32)
    v = torch.where(v >= 2**31, v - 2**32, v)
    return v.to(torch.int32)


def pack_custom_mask(custom_mask: torch.Tensor, mask_indptr: torch.Tensor, qo_indptr: torch.Tensor,
                     kv_indptr: torch.Tensor, max_q_len: int, num_tokens: int | None = None) -> torch.Tensor:
    """SGLang's flat bool custom_mask -> bit-packed draft-block mask.

    custom_mask: flat bool/uint8; request b's block is row-major t_b x (L_b + t_b) starting at
      mask_indptr[b] (t_b = qo_indptr[b+1] - qo_indptr[b], L_b = kv_indptr[b+1] - kv_indptr[b]).
    Returns (num_tokens, ceil(max_q_len / 32)) int32. Only the draft columns are read: the prefix
    is always visible (SGLang's skip_prefix_custom_mask=True). num_tokens defaults to
    max_q_len * batch when not given; pass q.shape[0]. Fixed shapes, no host sync: graph-safe.
    """
    dev = custom_mask.device
    batch = qo_indptr.shape[0] - 1
    if num_tokens is None:
        num_tokens = max_q_len * batch
    words = triton.cdiv(max_q_len, 32)
    qo = qo_indptr.to(torch.int64)
    kv = kv_indptr.to(torch.int64)
    rows = torch.arange(num_tokens, device=dev, dtype=torch.int64)
    b = torch.searchsorted(qo[1:].contiguous(), rows, right=True).clamp_(max=batch - 1)
    i = rows - qo[b]
    t_b = qo[b + 1] - qo[b]
    L_b = kv[b + 1] - kv[b]
    j = torch.arange(words * 32, device=dev, dtype=torch.int64)
    pos = mask_indptr.to(torch.int64)[b][:, None] + (i * (L_b + t_b) + L_b)[:, None] + j[None, :]
    ok = (j[None, :] < t_b[:, None]) & (i < t_b)[:, None]
    pos = torch.where(ok, pos, torch.zeros_like(pos)).clamp_(max=max(custom_mask.numel() - 1, 0))
    bits = custom_mask.reshape(-1)[pos].to(torch.bool) & ok
    return _pack_bits(bits)


def chain_tree_mask(t: int, device=None) -> torch.Tensor:
    """(t, t) bool: draft token i sees 0..i (a chain)."""
    return torch.tril(torch.ones(t, t, dtype=torch.bool, device=device))


def draft_block_mask(max_q_len: int, causal: bool = True, device=None) -> torch.Tensor:
    """One draft block's packed rows for ``verify_attention(..., block_mask=True)``: a chain
    (draft token i sees 0..i: SGLang's causal verify without a custom mask, DFlash's) or all
    visible (causal False). It holds for any batch and any draft lengths up to max_q_len, since
    a request reads rows 0..t_b - 1 and the kernel ignores bits past t_b. Torch ops of fixed
    shape, no host sync. (max_q_len, ceil(max_q_len / 32)) int32."""
    block = torch.ones(max_q_len, max_q_len, dtype=torch.bool, device=device)
    return pack_tree_masks([torch.tril(block) if causal else block])


def random_tree_parents(t: int, gen: torch.Generator) -> torch.Tensor:
    """A random tree over t draft tokens in topological order (parent index < child index), as
    DDTree's trees are; for tests and the on-card self-check."""
    par = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, t)]
    return torch.tensor(par)


def tree_mask_from_parents(parents: torch.Tensor) -> torch.Tensor:
    """parents: (t,) int, parents[i] < i the parent of draft token i, -1 for the root(s).
    Returns (t, t) bool: row i sees its ancestors and itself."""
    t = parents.shape[0]
    m = torch.eye(t, dtype=torch.bool, device=parents.device)
    par = parents.tolist()
    for i in range(t):
        p = par[i]
        if p >= 0:
            if p >= i:
                raise ValueError(f"parents[{i}] = {p}: a parent must come before its child")
            m[i] |= m[p]
    return m


def pack_tree_masks(blocks: list, max_q_len: int | None = None) -> torch.Tensor:
    """Per-request (t_b, t_b) bool blocks -> (sum t_b, ceil(max_q_len / 32)) int32."""
    mq = max_q_len or max(blk.shape[0] for blk in blocks)
    words = triton.cdiv(mq, 32)
    rows = []
    for blk in blocks:
        t = blk.shape[0]
        full = torch.zeros(t, words * 32, dtype=torch.bool, device=blk.device)
        full[:, :t] = blk
        rows.append(full)
    return _pack_bits(torch.cat(rows))


# ----------------------------------------------------------------------------------------------
# 5/ reference
# ----------------------------------------------------------------------------------------------
def reference_verify_attention(q, k_extend, kv_cache, kv_indices, kv_indptr, qo_indptr, tree_blocks,
                               sm_scale, k_scale=1.0, v_scale=1.0):
    """Plain torch, float32: returns (out (num_tokens, h, 512) float32, lse (num_tokens, h)).
    tree_blocks: list of per-request (t_b, t_b) bool masks. The pool's keys count k_scale times
    their stored value and its values v_scale times (SGLang's k/v descale)."""
    k_ext = k_extend.reshape(k_extend.shape[0], D_LATENT).float()
    kv = kv_cache.reshape(-1, D_LATENT)
    qo = qo_indptr.tolist()
    kvp = kv_indptr.tolist()
    outs, lses = [], []
    for b in range(len(qo) - 1):
        t = qo[b + 1] - qo[b]
        if t == 0:
            continue
        idx = kv_indices[kvp[b]:kvp[b + 1]].long()
        prefix = kv[idx].float()
        keys = torch.cat([prefix * k_scale, k_ext[qo[b]:qo[b + 1]]], 0)  # (L + t, 576)
        values = torch.cat([prefix[:, :D_NOPE] * v_scale, k_ext[qo[b]:qo[b + 1], :D_NOPE]], 0)
        L = idx.shape[0]
        qb = q[qo[b]:qo[b + 1]].float()  # (t, h, 576)
        s = torch.einsum("thd,nd->thn", qb, keys) * sm_scale
        vis = torch.ones(t, L + t, dtype=torch.bool, device=q.device)
        vis[:, L:] = tree_blocks[b].to(q.device)
        s = s.masked_fill(~vis[:, None, :], float("-inf"))
        lse = torch.logsumexp(s, -1)
        p = torch.exp(s - lse[..., None])
        outs.append(torch.einsum("thn,nd->thd", p, values))
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)
