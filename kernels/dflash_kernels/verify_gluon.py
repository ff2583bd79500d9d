"""Hopper (sm_90) split kernels of verify attention, written in Triton's Gluon dialect: the
warp-specialised kernel that ships (``_verify_split_kernel_gluon_ws``, below; 1.3x faster at 128k)
and the lock-step kernel before it (``_verify_split_kernel_gluon``), both kept in the sweeps and
the GPU tests.

Same contract as ``verify_attention._verify_split_kernel`` (same arguments, plan, partial
outputs), so the plan and merge kernels are shared. What Gluon allows here and the Triton kernel
cannot get from the compiler (see RESULTS.md, session 2), in the lock-step kernel:

  * S = Q.K^T is computed once per tile, split by columns over the two warpgroups
    (warps [4, 2]: each warpgroup computes 64 x BLOCK_N/2 of S), instead of the whole S in
    each warpgroup (Triton lays a chained dot out over [8, 1] warps, which duplicates a 64-row S);
  * P goes to shared memory once and both warpgroups read it as the A operand of P.V, each for
    its half of the 512 output columns;
  * the gather of tile j + 1 (cp.async, 16 bytes per thread and copy) is issued at the top of
    iteration j, right after the barrier that frees its buffer, so it overlaps the whole of
    S_j, the softmax and P_j.V_j (Triton's pipeliner issues it after S_j and the softmax).

Shared memory (BLOCK_N = 64): Q 72 KB + 2 x K 72 KB + P 8 KB = 224 KB of the 227 KB per block.
This module is imported on sm_90 devices, on sm_120 ones (verify_mma2.py reuses its row,
widening and softmax helpers) and by the AOT build (not by Triton's CPU interpreter, which does
not run Gluon).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ._gluon_compat import cta_barrier
from .verify_attention import SPLIT_RUNTIME_INTS, _keys_of_program, _program_slice


@gluon.jit
def _tile_slots(idx_ptr, n0, hi, is_draft, BLOCK_N: gl.constexpr, ROW_G: gl.constexpr):
    """Pool slots of latent rows n0 .. n0 + BLOCK_N of a prefix slice (rows past hi take the
    slot of row hi - 1; 0 for draft programs). Loaded one tile ahead of the gather that uses
    them, so their latency is hidden. Narrowed to int32 (a pool has far fewer than 2**31 slots):
    SGLang's int64 kv_indices would hold twice the registers across the loop, and sm_120's
    kernels spilled for it. A draft program's last row is -1, so the mask is one test: with
    `not is_draft` in it, Triton 3.8 (the image's) re-derives that uniform predicate for every
    slot check (RESULTS.md, sessions 20 and 21: about 1% on sm_120's code under 3.8)."""
    last = gl.where(is_draft, -1, hi - 1)
    r = gl.minimum(n0 + gl.arange(0, BLOCK_N, layout=ROW_G), last)
    return gl.load(idx_ptr + r, mask=r >= 0, other=0).to(gl.int32)


@gluon.jit
def _issue_tile(kn_buf, kp_buf, slots, k_base, k_stride, qo_start, n0, hi, is_draft,
                BLOCK_N: gl.constexpr, GL: gl.constexpr):
    """cp.async gather of latent rows n0 .. n0 + BLOCK_N: one row per thread (16 x 16 bytes of
    the 512 nope values + 2 x 16 bytes of the rope part, at fixed offsets from one address).
    Rows past hi read row hi - 1 again (cp.async has no zero fill here): their scores are masked
    to -inf, so P is 0 there, and the data is a latent of this request, finite whenever the
    result is (never an unused pool slot, which may hold anything)."""
    r = gl.minimum(n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, GL)), hi - 1)
    row = gl.where(is_draft, qo_start + r, slots).to(gl.int64)
    rp = k_base + row * k_stride
    cp.async_copy_global_to_shared(kn_buf, rp[:, None] + gl.arange(0, 512, layout=gl.SliceLayout(0, GL))[None, :])
    cp.async_copy_global_to_shared(kp_buf, rp[:, None] + 512 + gl.arange(0, 64, layout=gl.SliceLayout(0, GL))[None, :])


@gluon.jit
def _q_row_ptrs(Q, qo_start, rows, stride_qt, stride_qh, NUM_HEADS: gl.constexpr):
    """Start of query row `rows` (draft token rows // NUM_HEADS, head rows % NUM_HEADS)."""
    return Q + (qo_start + rows // NUM_HEADS).to(gl.int64) * stride_qt + (rows % NUM_HEADS) * stride_qh


@gluon.jit
def _load_q_rope(Q, qo_start, pid_m, n_rows, stride_qt, stride_qh, NUM_HEADS: gl.constexpr,
                 BLOCK_M: gl.constexpr, LAYOUT: gl.constexpr):
    """The 64 rope values of the program's BLOCK_M query rows (0 past n_rows)."""
    rows = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, LAYOUT))
    ptrs = _q_row_ptrs(Q, qo_start, rows, stride_qt, stride_qh, NUM_HEADS)
    return gl.load(ptrs[:, None] + 512 + gl.arange(0, 64, layout=gl.SliceLayout(0, LAYOUT))[None, :],
                   mask=(rows < n_rows)[:, None], other=0.0)


@gluon.jit
def _online_softmax_step(s, n0, hi, is_draft, mask_row, row_ok, qk_scale, m_i, l_i,
                         BLOCK_N: gl.constexpr, COL_S: gl.constexpr):
    """Mask the scores of latent rows n0 .. n0 + BLOCK_N and fold them into the running row
    maximum and sum; returns (P, the scale of the old accumulator, m_i, l_i).

    The prefix is always visible (only the last tile of a slice has rows past its end); a draft
    tile reads the packed tree mask (a tile starts at a multiple of BLOCK_N, so it spans one
    32-bit word per row, two when BLOCK_N = 64). The scores stay unscaled until the exponent:
    qk_scale > 0 commutes with the maximum, and s * qk_scale - m is one FFMA per score."""
    cols = n0 + gl.arange(0, BLOCK_N, layout=COL_S)
    if is_draft:
        w0 = gl.load(mask_row + (n0 >> 5), mask=row_ok, other=0)
        if BLOCK_N > 32:
            w1 = gl.load(mask_row + (n0 >> 5) + 1, mask=row_ok & (n0 + 32 < hi), other=0)
            word = gl.where(((cols >> 5) & 1)[None, :] == 0, w0[:, None], w1[:, None])
        else:
            word = w0[:, None]
        visible = (((word >> (cols & 31)[None, :]) & 1) != 0) & (cols < hi)[None, :]
        s = gl.where(visible, s, float("-inf"))
    elif n0 + BLOCK_N > hi:
        s = gl.where((cols < hi)[None, :], s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
    # a row with nothing visible so far keeps m = -inf; subtract 0 then so no NaN appears
    m_sub = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_sub)
    p = gl.exp2(s * qk_scale - m_sub[:, None])
    return p, alpha, m_new, l_i * alpha + gl.sum(p, 1)


@gluon.jit(do_not_specialize=SPLIT_RUNTIME_INTS)
def _verify_split_kernel_gluon(
    Q, K_EXT, KV, KV_INDICES, KV_INDPTR, QO_INDPTR, TREE_MASK, PLAN,
    PART_O, PART_LSE,
    qk_scale,
    stride_qt, stride_qh, stride_kext, stride_kv, stride_mask, stride_mask_req,
    rows_max, NUM_SPLITS, BATCH,
    NUM_HEADS: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    MIN_CHUNK: gl.constexpr,
    PDL: gl.constexpr,
):
    gl.static_assert(BLOCK_M == 64)
    gl.static_assert(gl.num_warps() == 8)
    # S (BLOCK_M x BLOCK_N) over [4, 2] warps: warpgroup w computes columns w * BLOCK_N / 2 ...
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                  instr_shape=[16, BLOCK_N // 2, 16])
    # O (BLOCK_M x 512) over [4, 2] warps: warpgroup w owns output columns 256 w .. 256 w + 255
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                  instr_shape=[16, 256, 16])
    KN_BL: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 2], [1, 0])  # Q (rows, 512) load
    KP_BL: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])  # Q (rows, 64) load
    # latent gathers: a warp covers 16 rows x 32 bytes (whole sectors), a thread one row
    GL: gl.constexpr = gl.BlockedLayout([1, 8], [16, 2], [4, 2], [1, 0])
    ROW_G: gl.constexpr = gl.SliceLayout(1, GL)
    SH: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    ROW_S: gl.constexpr = gl.SliceLayout(1, S_L)
    COL_S: gl.constexpr = gl.SliceLayout(0, S_L)
    ROW_O: gl.constexpr = gl.SliceLayout(1, O_L)

    pid_m = gl.program_id(0)
    pid_s = gl.program_id(1)
    b, lo, hi, is_draft, qo_start, t_b, kv_start = _program_slice(pid_s, PLAN, KV_INDPTR, QO_INDPTR, NUM_SPLITS,
                                                                  BATCH, rows_max, NUM_HEADS, MIN_CHUNK, BLOCK_N, PDL)
    if b >= BATCH:
        return
    n_rows = t_b * NUM_HEADS
    if pid_m * BLOCK_M >= n_rows:
        return
    lo, hi, k_base, k_stride = _keys_of_program(is_draft, t_b, lo, hi, K_EXT, KV, stride_kext, stride_kv)
    idx_ptr = KV_INDICES + kv_start

    # -- Q (all 576 values of BLOCK_M rows) into shared memory, once --
    rq = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, KN_BL))
    q_row = _q_row_ptrs(Q, qo_start, rq, stride_qt, stride_qh, NUM_HEADS)
    q_nope = gl.load(q_row[:, None] + gl.arange(0, 512, layout=gl.SliceLayout(0, KN_BL))[None, :],
                     mask=(rq < n_rows)[:, None], other=0.0)
    q_pe = _load_q_rope(Q, qo_start, pid_m, n_rows, stride_qt, stride_qh, NUM_HEADS, BLOCK_M, KP_BL)
    qn_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, 512], SH, q_nope)
    qp_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, 64], SH, q_pe)
    kn_smem = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, 512], SH)
    kp_smem = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, 64], SH)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, BLOCK_N], SH)

    # rows of S / O and the tree-mask rows (draft programs only)
    offs_m = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=ROW_S)
    row_ok = offs_m < n_rows
    mask_row = TREE_MASK + qo_start.to(gl.int64) * stride_mask_req + (offs_m // NUM_HEADS).to(gl.int64) * stride_mask

    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=ROW_S)
    l_i = gl.full([BLOCK_M], 0.0, gl.float32, layout=ROW_S)
    acc = gl.zeros([BLOCK_M, 512], gl.float32, layout=O_L)

    n_tiles = gl.cdiv(hi - lo, BLOCK_N)
    if n_tiles > 0:
        slots0 = _tile_slots(idx_ptr, lo, hi, is_draft, BLOCK_N, ROW_G)
        _issue_tile(kn_smem.index(0), kp_smem.index(0), slots0, k_base, k_stride, qo_start, lo, hi,
                    is_draft, BLOCK_N, GL)
    cp.commit_group()
    slots_nx = _tile_slots(idx_ptr, lo + BLOCK_N, hi, is_draft, BLOCK_N, ROW_G)
    for j in range(0, n_tiles):
        buf = j % 2
        n0 = lo + j * BLOCK_N
        slots = slots_nx  # of tile j + 1, loaded one iteration ago
        slots_nx = _tile_slots(idx_ptr, n0 + 2 * BLOCK_N, hi, is_draft, BLOCK_N, ROW_G)
        # tile j is in; every warp is past iteration j - 1, so buffer 1 - buf and P are free
        cp.wait_group(0)
        cta_barrier()
        fence_async_shared()
        if j + 1 < n_tiles:
            _issue_tile(kn_smem.index(1 - buf), kp_smem.index(1 - buf), slots, k_base, k_stride,
                        qo_start, n0 + BLOCK_N, hi, is_draft, BLOCK_N, GL)
        cp.commit_group()
        kn = kn_smem.index(buf)
        s = warpgroup_mma(qn_smem, kn.permute((1, 0)), gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=S_L),
                          use_acc=False, is_async=True)
        s = warpgroup_mma(qp_smem, kp_smem.index(buf).permute((1, 0)), s, is_async=True)
        s = warpgroup_mma_wait(0, deps=[s])
        p, alpha, m_i, l_i = _online_softmax_step(s, n0, hi, is_draft, mask_row, row_ok, qk_scale, m_i, l_i,
                                                  BLOCK_N, COL_S)
        p_smem.store(p.to(gl.bfloat16))
        fence_async_shared()
        cta_barrier()
        acc = acc * gl.convert_layout(alpha, ROW_O)[:, None]
        acc = warpgroup_mma(p_smem, kn, acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=[acc])
    cp.wait_group(0)

    # -- partial result: normalised output and log2-sum-exp2 of this slice --
    has = l_i > 0.0
    lse2 = gl.where(has, m_i + gl.log2(gl.where(has, l_i, 1.0)), float("-inf"))
    o = acc / gl.convert_layout(gl.where(has, l_i, 1.0), ROW_O)[:, None]
    offs_mo = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=ROW_O)
    part_o = pid_s.to(gl.int64) * rows_max + offs_mo
    gl.store(PART_O + part_o[:, None] * 512 + gl.arange(0, 512, layout=gl.SliceLayout(0, O_L))[None, :], o,
             mask=(offs_mo < n_rows)[:, None])
    gl.store(PART_LSE + pid_s.to(gl.int64) * rows_max + offs_m, lse2, mask=row_ok)


@gluon.jit
def _q_and_k_buffers(BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr):
    """The warp-specialised kernel's shared operands, empty: Q (all 576 values of BLOCK_M rows) in
    three column blocks, for the loader partition to copy (_copy_q), and NUM_STAGES K buffers of
    BLOCK_N latents (two nope halves and the rope part), all in the 128-byte swizzle wgmma reads."""
    SH: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    qn_lo = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, 256], SH)
    qn_hi = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, 256], SH)
    qp_s = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, 64], SH)
    kn_lo = gl.allocate_shared_memory(gl.bfloat16, [NUM_STAGES, BLOCK_N, 256], SH)
    kn_hi = gl.allocate_shared_memory(gl.bfloat16, [NUM_STAGES, BLOCK_N, 256], SH)
    kp_s = gl.allocate_shared_memory(gl.bfloat16, [NUM_STAGES, BLOCK_N, 64], SH)
    return qn_lo, qn_hi, qp_s, kn_lo, kn_hi, kp_s


@gluon.jit
def _issue_s(qn_lo, qn_hi, qp_s, kn_lo, kn_hi, kp_s, buf, zero_s):
    """S = Q.K^T of the tile in K buffer buf, issued asynchronously (36 wgmma over the two nope
    halves and the rope part); the caller waits for it. qn_lo is Q's first 256 columns in shared
    memory, or in registers (the S group's Q_REGS)."""
    s = warpgroup_mma(qn_lo, kn_lo.index(buf).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    s = warpgroup_mma(qn_hi, kn_hi.index(buf).permute((1, 0)), s, is_async=True)
    return warpgroup_mma(qp_s, kp_s.index(buf).permute((1, 0)), s, is_async=True)


@gluon.jit
def _issue_s_q(q_lo, q_mid, qn_hi, q_pe, kn_lo, kn_hi, kp_s, buf, zero_s, Q_REGS: gl.constexpr):
    """_issue_s for the S group, whose Q_REGS 3 holds Q's columns 256..383 in registers too (q_mid):
    the second nope half is then two chains, 8 wgmma from registers and 8 from shared memory."""
    if Q_REGS == 3:
        kh = kn_hi.index(buf)
        s = warpgroup_mma(q_lo, kn_lo.index(buf).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        s = warpgroup_mma(q_mid, kh.slice(0, 128, dim=1).permute((1, 0)), s, is_async=True)
        s = warpgroup_mma(qn_hi.slice(128, 128, dim=1), kh.slice(128, 128, dim=1).permute((1, 0)), s, is_async=True)
        s = warpgroup_mma(q_pe, kp_s.index(buf).permute((1, 0)), s, is_async=True)
    else:
        s = _issue_s(q_lo, qn_hi, q_pe, kn_lo, kn_hi, kp_s, buf, zero_s)
    return s


@gluon.jit
def _store_partial_hi(acc, l_div, PART_O, part_row0, n_rows_here, BLOCK_M: gl.constexpr, COL0: gl.constexpr):
    """Output columns COL0 .. COL0 + width of a warp-specialised program's partial result
    (acc / l_div, l_div in acc's row layout); rows past n_rows_here are left alone."""
    O_L: gl.constexpr = acc.type.layout
    WIDTH: gl.constexpr = acc.type.shape[1]
    rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, O_L))
    dst = PART_O + (part_row0 + rows).to(gl.int64)[:, None] * 512 + COL0 \
        + gl.arange(0, WIDTH, layout=gl.SliceLayout(0, O_L))[None, :]
    gl.store(dst, acc / l_div[:, None], mask=(rows < n_rows_here)[:, None])


@gluon.jit
def _store_partial_lo(acc, l_div, m_i, l_i, PART_O, PART_LSE, pid_s, pid_m, rows_max, n_rows,
                      BLOCK_M: gl.constexpr):
    """A warp-specialised program's partial result: output columns 0 .. width of acc (acc / l_div,
    l_div in acc's row layout; the other MMA group wrote the rest) and the slice's log2-sum-exp2."""
    O_L: gl.constexpr = acc.type.layout
    WIDTH: gl.constexpr = acc.type.shape[1]
    ROW_O: gl.constexpr = gl.SliceLayout(1, O_L)
    o = acc / l_div[:, None]
    offs_mo = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=ROW_O)
    part_o = pid_s.to(gl.int64) * rows_max + offs_mo
    gl.store(PART_O + part_o[:, None] * 512 + gl.arange(0, WIDTH, layout=gl.SliceLayout(0, O_L))[None, :], o,
             mask=(offs_mo < n_rows)[:, None])
    _store_partial_lse(m_i, l_i, PART_LSE, pid_s, pid_m, rows_max, n_rows, BLOCK_M)


@gluon.jit
def _store_partial_lse(m_i, l_i, PART_LSE, pid_s, pid_m, rows_max, n_rows, BLOCK_M: gl.constexpr):
    """A program's log2-sum-exp2 per row (-inf for a row that saw no key), in m_i's layout."""
    has = l_i > 0.0
    lse2 = gl.where(has, m_i + gl.log2(gl.where(has, l_i, 1.0)), float("-inf"))
    offs_m = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=m_i.type.layout)
    gl.store(PART_LSE + pid_s.to(gl.int64) * rows_max + offs_m, lse2, mask=offs_m < n_rows)


# bf16 partial outputs (a workspace whose partial_o is bf16: VerifyConfig.partials_bf16). Straight
# from the wgmma layout a thread's two adjacent columns are a 4-byte store, half a sector a row
# (RESULTS.md, session 22: the split kernel 3 us slower at 128k). So each MMA group stages its 256
# columns in a K buffer only it reads after its last tile (the S group the first nope halves, the
# V group the second), and each warp then stores whole rows of 512 bytes.
WS_PARTIAL_ROWS: gl.constexpr = gl.BlockedLayout([16, 8], [1, 32], [4, 1], [1, 0])


@gluon.jit
def _store_partial_staged(o, stage, PART_O, part_row0, n_rows_here, COL0: gl.constexpr):
    """Output columns COL0 .. COL0 + 255 of a program's partial result `o` (already divided by its
    row sums) as bf16, through `stage` (a free [BLOCK_M, 256] K buffer of this group's)."""
    gl.static_assert(o.type.shape[1] == 256)
    BLOCK_M: gl.constexpr = o.type.shape[0]
    stage.store(o.to(gl.bfloat16))
    cta_barrier()  # (this partition's warps: every row is read back by other threads than wrote it)
    x = stage.load(WS_PARTIAL_ROWS)
    rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, WS_PARTIAL_ROWS))
    cols = gl.arange(0, 256, layout=gl.SliceLayout(0, WS_PARTIAL_ROWS))
    gl.store(PART_O + (part_row0 + rows).to(gl.int64)[:, None] * 512 + COL0 + cols[None, :], x,
             mask=(rows < n_rows_here)[:, None])


# ----------------------------------------------------------------------------------------------
# Warp-specialised version (after FlashMLA's schedule): three partitions of one warpgroup each.
#   * default (the "S" group): S = Q.K^T of a whole 64 x BLOCK_N tile, the softmax (row-local:
#     no cross-warpgroup reduction), P and the row scale to shared memory, then its part of P.V
#     (output columns 0..S_COLS-1). With S_AHEAD, S_{j+1} is issued before the softmax of tile j,
#     so the tensor core works through it (RESULTS.md, session 4: 118 -> 106 us at 128k); that
#     holds three buffers at once. Without it S_j is issued at the top of iteration j, and two
#     buffers of 64 latents fit: half the wgmma, softmax passes and hand-overs a latent, which
#     pays more (session 28: 7-8% less at 128k-200k, t = 16, 12% at t = 64). With S_COLS = 128 it
#     has the registers to hold Q's first 256 columns (Q_REGS): S's 16 wgmma over them then read
#     only K from shared memory, the pipe every operand and copy shares (session 13: -5.5% at 128k);
#     with the loader in 24 registers, its first 384 (Q_REGS 3, session 27: 1-2.5% from 128k);
#     with P_REGS both groups' P.V take P from registers (session 27: up to 1.5% more);
#   * worker 1 (the "V" group): the rest of P.V (columns S_COLS..511), as soon as P is there;
#   * worker 2 (the loader): Q, then the latent gathers (cp.async, completion counted on an
#     mbarrier), so no MMA warp ever waits in the load-store queue; it also widens the rows of an
#     fp8 pool to bf16 (_fp8_loader, session 8).
# Shared memory: Q 72 KB + 2 x K 72 KB + P 8 KB + row scales (BLOCK_N = 64, NUM_STAGES = 2, what
# sm_90 runs: the loader fills one buffer while the MMA groups work on the other), or Q + 4 x K
# 36 KB + P 4 KB (BLOCK_N = 32, NUM_STAGES = 4, with S_AHEAD: up to two tiles of lead).
# ----------------------------------------------------------------------------------------------
WS_LOADER_WARPS = gl.constexpr(4)  # partitions are whole warpgroups (registers are reallocated per warpgroup)
# The loaders' gathers: a warp's copy covers 4 latent rows x 128 bytes. The rows are gathered from
# anywhere, so a shared-memory store takes a wavefront per row (ncu, session 7: 8 rows x 64 bytes
# cost 8 wavefronts where 4 would do); 128 bytes of a row is one swizzled row of a tile, one wavefront.
WS_GATHER: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WS_LOADER_WARPS, 1], [1, 0])
WS_V_REGS = gl.constexpr(184)  # the V group: 64 x 256 fp32 accumulators (128 per thread) and addresses
WS_LOADER_REGS = gl.constexpr(40)
# the bf16 loader fits in 24 (no spill): beside the wide V group that leaves the S group 248, room for
# Q's columns 0..383 in registers (Q_REGS 3: 96 a thread)
WS_LOADER_NARROW_REGS = gl.constexpr(24)
WS_V_WIDE_REGS = gl.constexpr(232)  # the V group of 384 columns (S_COLS 128): 192 accumulators a thread
# launch limit: 12 warps x 32 threads x 168 <= 65,536 registers; the partitions then take the V
# group's and the loader's counts, and the S group the rest of 504 a thread (at most 256). Beside
# the wide V group the S group gets 232: enough for its 64 accumulators, Q's 64 registers and
# two S tiles (with the fp8 loader's 80 it would get 192, and Q in registers spills there)
WS_MAXNREG = 168


@gluon.jit
def _gather_rows(slots, n0, hi, is_draft, qo_start, k_base, k_stride, BLOCK_N: gl.constexpr):
    """Start of latent rows n0 .. n0 + BLOCK_N (pool slots `slots`, or the draft block's rows),
    as a column in the loaders' gather layout; rows past hi read row hi - 1 again (see _issue_tile)."""
    r = gl.minimum(n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, WS_GATHER)), hi - 1)
    return (k_base + gl.where(is_draft, qo_start + r, slots).to(gl.int64) * k_stride)[:, None]


@gluon.jit
def _copy_latent_rows(dst_lo, dst_hi, dst_pe, rows):
    """cp.async of 576-value rows (`rows`: their starts, a column in the gather layout) into a
    tile's two nope halves and its rope part; the caller counts or commits the copies."""
    cols = gl.arange(0, 256, layout=gl.SliceLayout(0, WS_GATHER))[None, :]
    cp.async_copy_global_to_shared(dst_lo, rows + cols)
    cp.async_copy_global_to_shared(dst_hi, rows + 256 + cols)
    cp.async_copy_global_to_shared(dst_pe, rows + 512 + gl.arange(0, 64, layout=gl.SliceLayout(0, WS_GATHER))[None, :])


@gluon.jit
def _ws_loader(kn_lo, kn_hi, kp_s, ready, kfree, idx_ptr, k_base, k_stride, qo_start, lo, hi, is_draft,
               n_tiles, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr):
    ROW_G: gl.constexpr = gl.SliceLayout(1, WS_GATHER)
    slots_nx = _tile_slots(idx_ptr, lo, hi, is_draft, BLOCK_N, ROW_G)
    for j in range(n_tiles):
        buf = j % NUM_STAGES
        n0 = lo + j * BLOCK_N
        slots = slots_nx  # loaded one tile ahead, so their latency is hidden
        slots_nx = _tile_slots(idx_ptr, n0 + BLOCK_N, hi, is_draft, BLOCK_N, ROW_G)
        rp = _gather_rows(slots, n0, hi, is_draft, qo_start, k_base, k_stride, BLOCK_N)
        # both MMA groups are done with the tile that last used this buffer
        mbarrier.wait(kfree.index(buf), ((j // NUM_STAGES) & 1) ^ 1)
        _copy_latent_rows(kn_lo.index(buf), kn_hi.index(buf), kp_s.index(buf), rp)
        cp.mbarrier_arrive(ready.index(buf), increment_count=False)  # fires when they land


# fp8 pools (session 8). wgmma on sm_90 takes fp8 only with both operands fp8, so the pool's tiles
# are widened to bf16 (exact) before S and P.V read them, and the widening is the loader's: the
# MMA warps do no conversion. A tile's fp8 rows (cp.async, half the bytes of bf16 ones) are staged
# inside the K buffer they are widened into (the nope halves in the bytes of its bf16 columns
# 256..511, the rope part in the first half of its rope tile), so the kernel keeps its K buffers
# (separate staging buffers left room for three of 32 latents: 4-7% slower, RESULTS.md). Each loader
# thread reads back the bytes it copied itself (no barrier between its copy and its read); one
# barrier of the loader's warps between the last read and the first store over staged bytes.
# The layout is the bf16 gathers' (WS_GATHER): a thread copies 8 fp8 bytes and stores the 16 bf16
# bytes they widen to, so a warp's store is 4 rows x 128 bytes of a swizzled tile, one wavefront
# each (16 fp8 bytes a thread measured 2x the ideal wavefronts); the staged nope rows (256 bytes)
# are swizzled by 64-byte pieces so that a warp's 4 rows x 64 bytes meet no bank twice (the rope
# part's 64-byte rows lie side by side as they are).
WS_FP8_NOPE_SH: gl.constexpr = gl.SwizzledSharedLayout(64, 1, 4, [1, 0])
WS_FP8_ROPE_SH: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
# a tile's fp8 bytes and their widening: 72 sufficed over 32-latent tiles; over 64 (session 29)
# Triton 3.8's build of the loader spills 8 bytes in 72
WS_FP8_LOADER_REGS = gl.constexpr(80)


@gluon.jit
def _staged_fp8(kn_hi, kp_s, buf, FP8: gl.constexpr, BLOCK_N: gl.constexpr):
    """Where an fp8 tile is staged in K buffer buf: its two nope halves in kn_hi's 16 KB, its rope
    part in the first half of kp_s's 4 KB."""
    nope = kn_hi.index(buf)._reinterpret(FP8, [2, BLOCK_N, 256], WS_FP8_NOPE_SH)
    rope = kp_s.index(buf)._reinterpret(FP8, [2, BLOCK_N, 64], WS_FP8_ROPE_SH).index(0)
    return nope.index(0), nope.index(1), rope


@gluon.jit
def _stage_fp8_tile(kn_hi, kp_s, buf, slots, KV, stride_kv, BLOCK_N: gl.constexpr):
    """cp.async of the pool rows at `slots` (_tile_slots repeats the last row past the slice's
    end) into K buffer buf's staging space; the caller commits the group."""
    s_lo, s_hi, s_pe = _staged_fp8(kn_hi, kp_s, buf, KV.dtype.element_ty, BLOCK_N)
    _copy_latent_rows(s_lo, s_hi, s_pe, (KV + slots.to(gl.int64) * stride_kv)[:, None])


@gluon.jit
def _widen(x):
    # through float32 (exact): f16 -> f32 and the packing to bf16 run at full rate, where a direct
    # f16 -> bf16 takes an F2F per value on the pipe of the softmax's exp2
    return x.to(gl.float32).to(gl.bfloat16)


@gluon.jit
def _fp8_loader(kn_lo, kn_hi, kp_s, ready, kfree, idx_ptr, KV, stride_kv, lo, hi, n_tiles,
                BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr):
    """A prefix slice of an fp8 pool. With three or more buffers tile j + 1's copies go out as
    soon as its buffer is free, then tile j (copied an iteration earlier) is widened in place;
    with two, tile j is widened first (session 29: otherwise each widening waits for the MMAs)."""
    ROW_G: gl.constexpr = gl.SliceLayout(1, WS_GATHER)
    if n_tiles > 0:  # tile 0 into buffer 0, free at the start
        _stage_fp8_tile(kn_hi, kp_s, 0, _tile_slots(idx_ptr, lo, hi, False, BLOCK_N, ROW_G), KV, stride_kv, BLOCK_N)
    cp.commit_group()
    slots = _tile_slots(idx_ptr, lo + BLOCK_N, hi, False, BLOCK_N, ROW_G)  # of tile j + 1, a tile early
    for j in range(n_tiles):
        buf = j % NUM_STAGES
        nb = (j + 1) % NUM_STAGES
        if NUM_STAGES == 2:
            # two buffers: tile j is widened as soon as its copies are in, before the wait for
            # tile j + 1's buffer (the MMAs of tile j - 1), so the MMA groups never wait for a
            # widening; tile j + 1's copies then have the MMAs of tile j to land
            cp.wait_group(0)
            _widen_staged_tile(kn_lo, kn_hi, kp_s, ready, buf, KV.dtype.element_ty, BLOCK_N)
        if j + 1 < n_tiles:  # both MMA groups are done with the tile that last used buffer nb
            mbarrier.wait(kfree.index(nb), (((j + 1) // NUM_STAGES) & 1) ^ 1)
            _stage_fp8_tile(kn_hi, kp_s, nb, slots, KV, stride_kv, BLOCK_N)
        cp.commit_group()  # (empty past the last tile: one group per iteration)
        slots = _tile_slots(idx_ptr, lo + (j + 2) * BLOCK_N, hi, False, BLOCK_N, ROW_G)
        if NUM_STAGES > 2:  # tile j + 1's copies are out while tile j is widened
            cp.wait_group(1)  # this thread's copies of tile j are in
            _widen_staged_tile(kn_lo, kn_hi, kp_s, ready, buf, KV.dtype.element_ty, BLOCK_N)
    cp.wait_group(0)


@gluon.jit
def _widen_staged_tile(kn_lo, kn_hi, kp_s, ready, buf, FP8: gl.constexpr, BLOCK_N: gl.constexpr):
    """Widen the fp8 tile staged in K buffer buf to bf16 in place and count it on ready[buf]."""
    s_lo, s_hi, s_pe = _staged_fp8(kn_hi, kp_s, buf, FP8, BLOCK_N)
    kn_lo.index(buf).store(_widen(s_lo.load(WS_GATHER)))  # (columns 0..255 hold no staged bytes)
    x_hi = s_hi.load(WS_GATHER)
    x_pe = s_pe.load(WS_GATHER)
    cta_barrier()  # every loader thread has read the staged bytes the stores below overwrite
    kn_hi.index(buf).store(_widen(x_hi))
    kp_s.index(buf).store(_widen(x_pe))
    fence_async_shared()  # the stores, before wgmma reads them (the async proxy)
    cta_barrier()  # (this partition's warps only)
    mbarrier.arrive(ready.index(buf), count=32 * WS_LOADER_WARPS)  # as many as the bf16 copies' arrives


@gluon.jit
def _copy_q(qn_lo, qn_hi, qp_s, q_ready, Q, qo_start, pid_m, n_rows, stride_qt, stride_qh,
            NUM_HEADS: gl.constexpr, BLOCK_M: gl.constexpr):
    """cp.async of the program's BLOCK_M query rows (rows past n_rows read row n_rows - 1 again:
    their results are never stored), counted on q_ready. Issued by the loader ahead of the first
    tile, so that Q's latency and the first tile's overlap (session 8)."""
    rows = gl.minimum(pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, WS_GATHER)), n_rows - 1)
    _copy_latent_rows(qn_lo, qn_hi, qp_s, _q_row_ptrs(Q, qo_start, rows, stride_qt, stride_qh, NUM_HEADS)[:, None])
    cp.mbarrier_arrive(q_ready, increment_count=False)


@gluon.jit
def _ws_loader_any(qn_lo, qn_hi, qp_s, q_ready, Q, stride_qt, stride_qh, pid_m, n_rows,
                   kn_lo, kn_hi, kp_s, ready, kfree, idx_ptr, k_base, k_stride, KV, stride_kv, qo_start, lo, hi,
                   is_draft, n_tiles, NUM_HEADS: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                   NUM_STAGES: gl.constexpr):
    """The shipped kernel's loader partition: Q first (_copy_q), then bf16 rows (k_base: a draft
    block, or a bf16 pool) as _ws_loader copies them, or the rows of an fp8 pool KV as
    _fp8_loader widens them."""
    _copy_q(qn_lo, qn_hi, qp_s, q_ready, Q, qo_start, pid_m, n_rows, stride_qt, stride_qh, NUM_HEADS, BLOCK_M)
    # (two branches call _ws_loader: a compile-time test or-ed with a run-time one would build the
    # fp8 path for a bf16 pool too)
    if KV.dtype.element_ty == gl.bfloat16:
        _ws_loader(kn_lo, kn_hi, kp_s, ready, kfree, idx_ptr, k_base, k_stride, qo_start, lo, hi, is_draft,
                   n_tiles, BLOCK_N, NUM_STAGES)
    elif is_draft:
        _ws_loader(kn_lo, kn_hi, kp_s, ready, kfree, idx_ptr, k_base, k_stride, qo_start, lo, hi, is_draft,
                   n_tiles, BLOCK_N, NUM_STAGES)
    else:
        _fp8_loader(kn_lo, kn_hi, kp_s, ready, kfree, idx_ptr, KV, stride_kv, lo, hi, n_tiles, BLOCK_N, NUM_STAGES)


@gluon.jit
def _ws_v_group(kn_lo, kn_hi, p_smem, scale_smem, ready, kfree, p_ready, p_free,
                PART_O, part_row0, n_rows_here, n_tiles, o_scale, BLOCK_M: gl.constexpr, NUM_STAGES: gl.constexpr,
                S_COLS: gl.constexpr, P_REGS: gl.constexpr):
    """Output columns S_COLS..511 of P.V: 256..511 over the second nope half's buffer, and where
    the S group keeps fewer than 256 (S_COLS 128), columns S_COLS..255 in a second accumulator
    over the first half's."""
    MID: gl.constexpr = 256 - S_COLS
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, 256, 16])
    ROW_O: gl.constexpr = gl.SliceLayout(1, O_L)
    acc = gl.zeros([BLOCK_M, 256], gl.float32, layout=O_L)
    if MID > 0:
        M_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, MID, 16])
        ROW_M: gl.constexpr = gl.SliceLayout(1, M_L)
        acc_m = gl.zeros([BLOCK_M, MID], gl.float32, layout=M_L)
    for j in range(n_tiles):
        buf = j % NUM_STAGES
        mbarrier.wait(p_ready, j & 1)  # P_j and its row scale are written
        # tile j is in (the S group waited for it before P_j; waiting here too does not lean on
        # that chain, and cannot see a later phase: the loader refills this buffer only after
        # this group's kfree arrive below)
        mbarrier.wait(ready.index(buf), (j // NUM_STAGES) & 1)
        fence_async_shared()
        alpha = scale_smem.load(ROW_O)
        acc = acc * alpha[:, None]
        if MID > 0:
            acc_m = acc_m * scale_smem.load(ROW_M)[:, None]
        # P_REGS: P read from shared memory once, into registers, for both chains
        if P_REGS:
            p_a = p_smem.load(gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2))
        else:
            p_a = p_smem
        acc = warpgroup_mma(p_a, kn_hi.index(buf), acc, is_async=True)
        if MID > 0:
            if P_REGS:
                p_m = gl.convert_layout(p_a, gl.DotOperandLayout(operand_index=0, parent=M_L, k_width=2))
            else:
                p_m = p_smem
            acc_m = warpgroup_mma(p_m, kn_lo.index(buf).slice(S_COLS, MID, dim=1), acc_m, is_async=True)
            acc, acc_m = warpgroup_mma_wait(0, deps=[acc, acc_m])
        else:
            acc = warpgroup_mma_wait(0, deps=[acc])
        mbarrier.arrive(p_free, count=1)
        mbarrier.arrive(kfree.index(buf), count=1)
    # the S group's final row sums come through the scale buffer, after one more p_ready
    mbarrier.wait(p_ready, n_tiles & 1)
    l_i = scale_smem.load(ROW_O)
    l_div = gl.where(l_i > 0.0, l_i, 1.0) / o_scale
    if (PART_O.dtype.element_ty == gl.bfloat16) and (MID == 0):
        # (the S group's last S has read every K buffer's second half before P_{n-1} came)
        _store_partial_staged(acc / l_div[:, None], kn_hi.index(0), PART_O, part_row0, n_rows_here, 256)
    else:
        _store_partial_hi(acc, l_div, PART_O, part_row0, n_rows_here, BLOCK_M, 256)
    if MID > 0:
        l_m = scale_smem.load(ROW_M)
        _store_partial_hi(acc_m, gl.where(l_m > 0.0, l_m, 1.0) / o_scale, PART_O, part_row0, n_rows_here, BLOCK_M,
                          S_COLS)


@gluon.jit
def _ws_s_group(qn_lo, qn_hi, qp_s, q_ready, kn_lo, kn_hi, kp_s, p_smem, scale_smem, ready, kfree, p_ready, p_free,
                mask_rows, stride_mask, pid_m, n_rows, lo, hi, is_draft, n_tiles, qk_scale,
                PART_O, PART_LSE, pid_s, rows_max, o_scale,
                NUM_HEADS: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                NUM_STAGES: gl.constexpr, S_COLS: gl.constexpr, Q_REGS: gl.constexpr, P_REGS: gl.constexpr,
                S_AHEAD: gl.constexpr):
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BLOCK_N, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, S_COLS, 16])
    ROW_S: gl.constexpr = gl.SliceLayout(1, S_L)
    COL_S: gl.constexpr = gl.SliceLayout(0, S_L)
    ROW_O: gl.constexpr = gl.SliceLayout(1, O_L)
    offs_m = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=ROW_S)
    row_ok = offs_m < n_rows
    mask_row = mask_rows + (offs_m // NUM_HEADS).to(gl.int64) * stride_mask
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=ROW_S)
    l_i = gl.full([BLOCK_M], 0.0, gl.float32, layout=ROW_S)
    acc = gl.zeros([BLOCK_M, S_COLS], gl.float32, layout=O_L)
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=S_L)
    mbarrier.wait(q_ready, 0)  # the loader's copy of Q (_copy_q)
    # Q as S's register operand: its first 256 columns (Q_REGS >= 1), and its rope part (2) or
    # the next 128 columns (3)
    Q_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=S_L, k_width=2)
    if Q_REGS >= 1:
        q_lo = qn_lo.load(Q_OP)
    else:
        q_lo = qn_lo
    if Q_REGS == 2:
        q_pe = qp_s.load(Q_OP)
    else:
        q_pe = qp_s
    if Q_REGS == 3:
        q_mid = qn_hi.slice(0, 128, dim=1).load(Q_OP)
    else:
        q_mid = 0  # (unused)
    if S_AHEAD:
        mbarrier.wait(ready.index(0), 0, pred=n_tiles > 0)
        fence_async_shared()
        s = _issue_s_q(q_lo, q_mid, qn_hi, q_pe, kn_lo, kn_hi, kp_s, 0, zero_s, Q_REGS)
        s = warpgroup_mma_wait(0, deps=[s])
    for j in range(n_tiles):
        buf = j % NUM_STAGES
        n0 = lo + j * BLOCK_N
        if S_AHEAD:
            # S_{j+1} first, so the tensor core works through this tile's softmax (on the last
            # tile: a discarded S of the next buffer, which no copy is writing)
            nb = (j + 1) % NUM_STAGES
            mbarrier.wait(ready.index(nb), ((j + 1) // NUM_STAGES) & 1, pred=j + 1 < n_tiles)
            fence_async_shared()
            s_nx = _issue_s_q(q_lo, q_mid, qn_hi, q_pe, kn_lo, kn_hi, kp_s, nb, zero_s, Q_REGS)
        else:  # S_j now: the loader then has a whole iteration to fill the other buffer
            mbarrier.wait(ready.index(buf), (j // NUM_STAGES) & 1)
            fence_async_shared()
            s = _issue_s_q(q_lo, q_mid, qn_hi, q_pe, kn_lo, kn_hi, kp_s, buf, zero_s, Q_REGS)
            s = warpgroup_mma_wait(0, deps=[s])
        p, alpha, m_i, l_i = _online_softmax_step(s, n0, hi, is_draft, mask_row, row_ok, qk_scale, m_i, l_i,
                                                  BLOCK_N, COL_S)
        # the V group is done with P_{j-1} and its scale
        mbarrier.wait(p_free, (j & 1) ^ 1)
        p_bf = p.to(gl.bfloat16)
        p_smem.store(p_bf)
        scale_smem.store(alpha)
        fence_async_shared()
        mbarrier.arrive(p_ready, count=1)
        acc = acc * gl.convert_layout(alpha, ROW_O)[:, None]
        if S_COLS == 256:
            v_lo = kn_lo.index(buf)
        else:
            v_lo = kn_lo.index(buf).slice(0, S_COLS, dim=1)
        if P_REGS:  # its own P as the register operand: no read of P back through shared memory
            p_a = gl.convert_layout(p_bf, gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2))
        else:
            p_a = p_smem
        acc = warpgroup_mma(p_a, v_lo, acc, is_async=True)
        # (an accumulator still in flight across the loop's back edge makes ptxas serialise
        # every wgmma of the kernel, C7514: P_j.V_j is waited for here)
        if S_AHEAD:
            acc, s = warpgroup_mma_wait(0, deps=[acc, s_nx])
        else:
            acc = warpgroup_mma_wait(0, deps=[acc])
        mbarrier.arrive(kfree.index(buf), count=1)
    # the row sums go to the V group through the scale buffer once it has read the last scale
    mbarrier.wait(p_free, (n_tiles & 1) ^ 1)
    scale_smem.store(l_i)
    mbarrier.arrive(p_ready, count=1)
    if (PART_O.dtype.element_ty == gl.bfloat16) and (S_COLS == 256):
        # bf16 partials: columns 0..255 through a first nope half (the V group never reads those)
        l_div = gl.convert_layout(gl.where(l_i > 0.0, l_i, 1.0) / o_scale, ROW_O)
        _store_partial_staged(acc / l_div[:, None], kn_lo.index(0), PART_O,
                              pid_s.to(gl.int64) * rows_max + pid_m * BLOCK_M, n_rows - pid_m * BLOCK_M, 0)
        _store_partial_lse(m_i, l_i, PART_LSE, pid_s, pid_m, rows_max, n_rows, BLOCK_M)
    return acc, m_i, l_i


@gluon.jit(do_not_specialize=SPLIT_RUNTIME_INTS)
def _verify_split_kernel_gluon_ws(
    Q, K_EXT, KV, KV_INDICES, KV_INDPTR, QO_INDPTR, TREE_MASK, PLAN,
    PART_O, PART_LSE,
    qk_scale,
    stride_qt, stride_qh, stride_kext, stride_kv, stride_mask, stride_mask_req,
    rows_max, NUM_SPLITS, BATCH,
    k_scale, v_scale,
    NUM_HEADS: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    MIN_CHUNK: gl.constexpr,
    NUM_STAGES: gl.constexpr,
    S_COLS: gl.constexpr,
    Q_REGS: gl.constexpr,
    P_REGS: gl.constexpr,
    PDL: gl.constexpr,
    S_AHEAD: gl.constexpr = True,
):
    gl.static_assert(BLOCK_M == 64)
    gl.static_assert((S_COLS == 256) or (S_COLS == 128))  # output columns the S group keeps
    gl.static_assert((BLOCK_N == 64) or (BLOCK_N == 32))  # the loader's layout covers BLOCK_N rows
    # S_{j+1} is issued while tile j is still held: with two buffers the loader could only start
    # on tile j + 1 once tile j - 1 is released, right before S_{j+1} needs it
    gl.static_assert((NUM_STAGES >= 3) or (not S_AHEAD))
    gl.static_assert(gl.num_warps() == 4)  # the S group; the V group and the loader come on top

    pid_m = gl.program_id(0)
    pid_s = gl.program_id(1)
    b, lo, hi, is_draft, qo_start, t_b, kv_start = _program_slice(pid_s, PLAN, KV_INDPTR, QO_INDPTR, NUM_SPLITS,
                                                                  BATCH, rows_max, NUM_HEADS, MIN_CHUNK, BLOCK_N, PDL)
    if b >= BATCH:
        return
    # the request's mask rows: its own (stride_mask_req = stride_mask) or the draft block's
    # rows every request shares (stride_mask_req = 0)
    mask_rows = TREE_MASK + qo_start.to(gl.int64) * stride_mask_req
    n_rows = t_b * NUM_HEADS
    if pid_m * BLOCK_M >= n_rows:
        return
    KV_FP8: gl.constexpr = KV.dtype.element_ty != K_EXT.dtype.element_ty  # bf16 draft latents beside an fp8 pool
    if KV_FP8:  # the loader reads either (pointers of two types): the draft block's row range here
        lo, hi, k_base, k_stride = _keys_of_program(is_draft, t_b, lo, hi, K_EXT, K_EXT, stride_kext, stride_kext)
    else:
        lo, hi, k_base, k_stride = _keys_of_program(is_draft, t_b, lo, hi, K_EXT, KV, stride_kext, stride_kv)
    # the pool holds latent / scale (SGLang's k/v descale): its scores times k_scale, its values
    # times v_scale, folded into the score scale and the partial output; draft latents unscaled
    if is_draft:
        qk = qk_scale
        o_scale = 1.0
    else:
        qk = qk_scale * k_scale
        o_scale = v_scale

    qn_lo, qn_hi, qp_s, kn_lo, kn_hi, kp_s = _q_and_k_buffers(BLOCK_M, BLOCK_N, NUM_STAGES)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, BLOCK_N],  # 64-byte rows at BLOCK_N 32
                                       gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], gl.bfloat16))
    scale_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_M], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    kfree = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    p_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    p_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(i), count=32 * WS_LOADER_WARPS)  # one cp.async arrive per loader thread
        mbarrier.init(kfree.index(i), count=2)  # the S group and the V group
    mbarrier.init(p_ready, count=1)
    mbarrier.init(p_free, count=1)
    mbarrier.init(q_ready, count=32 * WS_LOADER_WARPS)  # Q's copies, as a tile's
    fence_async_shared()  # (the initialised barriers, before the partitions use them)
    cta_barrier()

    n_tiles = gl.cdiv(hi - lo, BLOCK_N)
    if KV_FP8:
        loader_regs: gl.constexpr = WS_FP8_LOADER_REGS
    elif Q_REGS == 3:
        loader_regs: gl.constexpr = WS_LOADER_NARROW_REGS
    else:
        loader_regs: gl.constexpr = WS_LOADER_REGS
    if S_COLS == 256:
        v_regs: gl.constexpr = WS_V_REGS
    else:
        v_regs: gl.constexpr = WS_V_WIDE_REGS
    acc, m_i, l_i = gl.warp_specialize([
        (_ws_s_group, (qn_lo, qn_hi, qp_s, q_ready, kn_lo, kn_hi, kp_s, p_smem, scale_smem, ready, kfree, p_ready,
                       p_free, mask_rows, stride_mask, pid_m, n_rows, lo, hi, is_draft, n_tiles, qk,
                       PART_O, PART_LSE, pid_s, rows_max, o_scale,
                       NUM_HEADS, BLOCK_M, BLOCK_N, NUM_STAGES, S_COLS, Q_REGS, P_REGS, S_AHEAD)),
        (_ws_v_group, (kn_lo, kn_hi, p_smem, scale_smem, ready, kfree, p_ready, p_free,
                       PART_O, pid_s.to(gl.int64) * rows_max + pid_m * BLOCK_M, n_rows - pid_m * BLOCK_M,
                       n_tiles, o_scale, BLOCK_M, NUM_STAGES, S_COLS, P_REGS)),
        (_ws_loader_any, (qn_lo, qn_hi, qp_s, q_ready, Q, stride_qt, stride_qh, pid_m, n_rows, kn_lo, kn_hi, kp_s,
                          ready, kfree, KV_INDICES + kv_start, k_base, k_stride, KV, stride_kv, qo_start, lo, hi,
                          is_draft, n_tiles, NUM_HEADS, BLOCK_M, BLOCK_N, NUM_STAGES)),
    ], [4, WS_LOADER_WARPS], [v_regs, loader_regs])

    # -- partial result (the V group wrote columns S_COLS..511; bf16 partials of 256 columns the S
    # group stored itself) --
    if (PART_O.dtype.element_ty != gl.bfloat16) or (S_COLS != 256):
        l_div = gl.convert_layout(gl.where(l_i > 0.0, l_i, 1.0) / o_scale, gl.SliceLayout(1, acc.type.layout))
        _store_partial_lo(acc, l_div, m_i, l_i, PART_O, PART_LSE, pid_s, pid_m, rows_max, n_rows, BLOCK_M)
