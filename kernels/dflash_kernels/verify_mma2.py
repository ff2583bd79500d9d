"""The split kernel sm_120 runs (RESULTS.md, sessions 9 and 10), for mma.sync GPUs, in Triton's
Gluon dialect.

Same contract as ``verify_attention._verify_split_kernel`` (same arguments, plan and partial
outputs; bf16 pools, scaled or not, and fp8 pools). What it does that the Triton-language kernel
cannot get from the compiler on sm_120 (99 KB of shared memory a block):

  * it computes S^T = K.Q^T (latents x query rows) instead of S = Q.K^T, so Q is the B operand
    and stays in registers (72 a thread), loaded once (through the K buffer tile 1 will fill);
  * S^T's 576 columns are split over the warps: warp (g, h) of [4, 2] sums latents 16h .. 16h + 15
    of all 32 rows over nope columns 128g .. 128g + 127 and rope columns 16g .. 16g + 15 (one
    batched mma over the four column groups), so each tile is read from shared memory once for
    S^T; the four partial sums meet in 16 KB of shared memory, loaded so that a warp owns 4 rows
    of the softmax (no barrier for its maximum and sum);
  * P.V becomes O^T = V^T.P^T over 8 warps along the output columns, a 128-column block at a
    time: V^T is read from the K buffer it came in with, P^T goes through 2 KB of shared memory;
  * a K buffer holds a tile as four 128-column blocks (and four 16-column rope blocks), the
    layout both dots read.

An fp8 pool's tile is widened to bf16 (exact) before either dot reads it: its rows are copied into
the second K buffer, which holds two fp8 tiles, and all warps widen tile j into the first while
tile j + 1's copies are in flight (_tiles).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from ._gluon_compat import cta_barrier
from .verify_attention import SPLIT_RUNTIME_INTS, _keys_of_program, _program_slice
from .verify_gluon import _online_softmax_step, _q_row_ptrs, _tile_slots, _widen

# S^T's partial sums [column group, latents, rows] over [4, 2, 1] warps
ST3_L = gl.constexpr(gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 2, 1], instr_shape=[1, 16, 8]))
# k_width 2 is mma.sync's own fragment, which ldmatrix loads; with 8 the compiler rebuilt the
# fragments with about 260 register moves a tile, 1.6x slower (RESULTS.md, session 9)
K3_A = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=ST3_L, k_width=2))
Q3_B = gl.constexpr(gl.DotOperandLayout(operand_index=1, parent=ST3_L, k_width=2))
# the summed scores for the softmax, S (rows x latents) read transposed from S^T's partial sums: a
# warp owns 4 rows, each over 8 lanes (latents l, l + 8, l + 16, l + 24 a lane), so its maximum
# and sum need no other warp, nor a barrier
S_L = gl.constexpr(gl.BlockedLayout([1, 1], [4, 8], [8, 1], [1, 0]))
# a 128-column block of O^T (columns x rows) over [8, 1] warps: 16 columns of every row a warp
OT_L = gl.constexpr(gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[8, 1], instr_shape=[16, 8]))
VT_A = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=OT_L, k_width=2))
PT_B = gl.constexpr(gl.DotOperandLayout(operand_index=1, parent=OT_L, k_width=2))
KEY_S = gl.constexpr(gl.SliceLayout(0, S_L))  # along S's latents
ROW_S = gl.constexpr(gl.SliceLayout(1, S_L))  # along S's query rows
ROW_O = gl.constexpr(gl.SliceLayout(0, OT_L))
# row copies [column group, row, column], 8 values a thread: each 8 lanes copy (or widen) 128
# bytes of one row of a block, which the swizzle puts in 8 different bank groups
NOPE_ROWS = gl.constexpr(gl.BlockedLayout([1, 1, 8], [1, 2, 16], [1, 8, 1], [2, 1, 0]))  # [4, 32, 128]
ROPE_ROWS = gl.constexpr(gl.BlockedLayout([1, 1, 8], [4, 4, 2], [1, 8, 1], [2, 1, 0]))  # [4, 32, 16]
# Shared layouts. A K buffer [4 x 32 rows, W] is also viewed as its four blocks [4, 32, W] (_blocks;
# a layout's order has the rank of the view, or one less), with the same swizzle, as the blocks'
# rows are a multiple of 8. The 8 rows an ldmatrix reads 16 bytes each meet 8 different bank groups.
KN_SH = gl.constexpr(gl.SwizzledSharedLayout(8, 1, 8, [1, 0]))  # block rows of 256 bytes
KN3_SH = gl.constexpr(gl.SwizzledSharedLayout(8, 1, 8, [2, 1, 0]))
KP_SH = gl.constexpr(gl.SwizzledSharedLayout(8, 4, 2, [1, 0]))  # block rows of 32 bytes, four a line
KP3_SH = gl.constexpr(gl.SwizzledSharedLayout(8, 4, 2, [2, 1, 0]))
FP8_SH = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))  # fp8 staging, 8 bytes a lane
FP8_3SH = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
# S^T's partial sums, fp32 rows of 128 bytes over 8 phases of 16 bytes: a warp's store (8 rows x
# 32 bytes) takes 2 wavefronts, its loads (8 rows x 16 bytes) 1
SP_SH = gl.constexpr(gl.SwizzledSharedLayout(4, 1, 8, [1, 0]))
SP3_SH = gl.constexpr(gl.SwizzledSharedLayout(4, 1, 8, [2, 1, 0]))
PT_SH = gl.constexpr(gl.SwizzledSharedLayout(8, 2, 4, [1, 0]))  # P^T: rows of 64 bytes, two a line
# the epilogue's staging of an O^T block, [rows, 128 columns] fp32 (16-byte pieces swizzled over 8 rows)
STAGE_SH = gl.constexpr(gl.SwizzledSharedLayout(4, 1, 8, [1, 0]))
A_SH = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [0]))


@gluon.jit
def _blocks(buf, SH3: gl.constexpr):
    """A K buffer (or fp8 staging slot) [4 x rows, W] as its four blocks [4, rows, W]: the view
    the copies and S^T's batched loads take (the blocks' rows are a multiple of 8, so a block
    row's swizzle is the same in both views)."""
    return buf._reinterpret(buf.dtype, [4, buf.shape[0] // 4, buf.shape[1]], SH3)


@gluon.jit
def _block_cols(W: gl.constexpr, L3: gl.constexpr):
    """Offsets of a row's values in its four W-column blocks, [4, 1, W] in layout L3."""
    g = gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3)))
    c = gl.arange(0, W, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))
    return (g * W)[:, None, None] + c[None, None, :]


# The copy helpers below take the copies' layouts (NR, RR: [4, rows, 128] and [4, rows, 16]),
# this kernel's 8-warp ones by default; verify_teams.py's loader passes its 2-warp ones (and an RR
# of [rows, 64] for its rope lines).
@gluon.constexpr_function
def _is_lines(L):
    """Copy layout L is [rows, W], one whole row a latent (verify_teams.py's rope lines), not a
    row's [4, rows, W] column blocks."""
    return len(L.size_per_thread) == 2


@gluon.constexpr_function
def _row_layout(L):
    """The layout of a row vector (one value a row) of copy layout L."""
    if _is_lines(L):
        return gl.SliceLayout(1, L)
    return gl.SliceLayout(0, gl.SliceLayout(2, L))


@gluon.jit
def _copy_rows(kn_buf, kp_buf, starts, NR: gl.constexpr = NOPE_ROWS, RR: gl.constexpr = ROPE_ROWS):
    """cp.async of 576-value rows (starts: their first values, a [32] vector for the nope and one
    for the rope copies) into a K buffer's column blocks (the rope part as [rows, 64] lines when RR
    is a lines layout); the caller commits the group."""
    starts_n, starts_r = starts
    cp.async_copy_global_to_shared(kn_buf, starts_n[None, :, None] + _block_cols(128, NR))
    if _is_lines(RR):
        cols = gl.arange(0, 64, layout=gl.SliceLayout(0, RR))
        cp.async_copy_global_to_shared(kp_buf, starts_r[:, None] + 512 + cols[None, :])
    else:
        cp.async_copy_global_to_shared(kp_buf, starts_r[None, :, None] + 512 + _block_cols(16, RR))


@gluon.jit
def _slots(idx_ptr, n0, hi, is_draft, BLOCK_N: gl.constexpr, NR: gl.constexpr = NOPE_ROWS,
           RR: gl.constexpr = ROPE_ROWS):
    """_tile_slots of a tile in the nope and in the rope copies' layouts."""
    return (_tile_slots(idx_ptr, n0, hi, is_draft, BLOCK_N, _row_layout(NR)),
            _tile_slots(idx_ptr, n0, hi, is_draft, BLOCK_N, _row_layout(RR)))


@gluon.jit
def _row_starts(slots, k_base, k_stride, qo_start, n0, hi, is_draft, BLOCK_N: gl.constexpr,
                NR: gl.constexpr = NOPE_ROWS, RR: gl.constexpr = ROPE_ROWS):
    """First values of latent rows n0 .. n0 + BLOCK_N (pool slots, or the draft block's rows);
    rows past hi read row hi - 1 again: their scores are masked to -inf, so P is 0 there, and the
    data is a latent of this request, finite whenever the result is."""
    slots_n, slots_r = slots
    r_n = gl.minimum(n0 + gl.arange(0, BLOCK_N, layout=_row_layout(NR)), hi - 1)
    r_r = gl.minimum(n0 + gl.arange(0, BLOCK_N, layout=_row_layout(RR)), hi - 1)
    return (k_base + gl.where(is_draft, qo_start + r_n, slots_n).to(gl.int64) * k_stride,
            k_base + gl.where(is_draft, qo_start + r_r, slots_r).to(gl.int64) * k_stride)


@gluon.jit
def _q_starts(Q, qo_start, pid_m, n_rows, stride_qt, stride_qh, NUM_HEADS: gl.constexpr, BLOCK_M: gl.constexpr,
              NR: gl.constexpr = NOPE_ROWS, RR: gl.constexpr = ROPE_ROWS):
    """First values of the program's query rows (rows past n_rows read row n_rows - 1 again:
    their results are never stored)."""
    r_n = gl.minimum(pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=_row_layout(NR)), n_rows - 1)
    r_r = gl.minimum(pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=_row_layout(RR)), n_rows - 1)
    return (_q_row_ptrs(Q, qo_start, r_n, stride_qt, stride_qh, NUM_HEADS),
            _q_row_ptrs(Q, qo_start, r_r, stride_qt, stride_qh, NUM_HEADS))


@gluon.jit
def _q_t(qn_buf, qp_buf):
    """Q^T in registers, once, as S^T's B operands ([4, 128, rows] and [4, 16, rows]), from the K
    buffer the caller copied Q's rows into (_copy_rows, a group committed before tile 0's, which
    stays in flight)."""
    cp.wait_group(1)  # this thread's copies of Q (all groups but the latest, tile 0's)
    cta_barrier()
    # (the first iteration's barrier keeps the next copies into this buffer after every load)
    return qn_buf.permute((0, 2, 1)).load(Q3_B), qp_buf.permute((0, 2, 1)).load(Q3_B)


@gluon.jit
def _s_of(sp_smem, g, BLOCK_N: gl.constexpr, SL: gl.constexpr = S_L):
    """Column group g's partial sum of S^T, read as S (rows x latents) in layout SL."""
    return sp_smem.slice(g * BLOCK_N, BLOCK_N).permute((1, 0)).load(SL)


@gluon.jit
def _attend_tile(kn, kp, sp_smem, pt_smem, a_smem, qt, n0, hi, is_draft, mask_row, row_ok, score_scale, m_i, l_i, acc,
                 BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr):
    """Fold the bf16 tile of latents n0 .. n0 + BLOCK_N (kn: the nope part's four 128-column
    blocks, kp: the rope part's four 16-column blocks, each 32 rows) into the online softmax and
    O^T."""
    qt_n, qt_r = qt
    acc0, acc1, acc2, acc3 = acc
    # S^T's four partial sums (one a column group) in one batched mma, summed through shared memory
    s3 = mma_v2(_blocks(kn, KN3_SH).load(K3_A), qt_n, gl.zeros([4, BLOCK_N, BLOCK_M], gl.float32, layout=ST3_L))
    s3 = mma_v2(_blocks(kp, KP3_SH).load(K3_A), qt_r, s3)
    _blocks(sp_smem, SP3_SH).store(s3)
    cta_barrier()
    s = (_s_of(sp_smem, 0, BLOCK_N) + _s_of(sp_smem, 1, BLOCK_N)) + \
        (_s_of(sp_smem, 2, BLOCK_N) + _s_of(sp_smem, 3, BLOCK_N))
    p, alpha, m_new, l_i = _online_softmax_step(s, n0, hi, is_draft, mask_row, row_ok, score_scale, m_i, l_i,
                                                BLOCK_N, KEY_S)
    # P^T and the rows' rescale factors, for every warp's O^T columns, through shared memory
    pt_smem.permute((1, 0)).store(p.to(gl.bfloat16))
    a_smem.store(alpha)
    cta_barrier()
    pt = pt_smem.load(PT_B)
    a = a_smem.load(ROW_O)[None, :]
    # O^T a 128-column block at a time: V^T is the block read transposed, P^T is loaded once
    acc0 = mma_v2(kn.slice(0, BLOCK_N).permute((1, 0)).load(VT_A), pt, acc0 * a)
    acc1 = mma_v2(kn.slice(BLOCK_N, BLOCK_N).permute((1, 0)).load(VT_A), pt, acc1 * a)
    acc2 = mma_v2(kn.slice(2 * BLOCK_N, BLOCK_N).permute((1, 0)).load(VT_A), pt, acc2 * a)
    acc3 = mma_v2(kn.slice(3 * BLOCK_N, BLOCK_N).permute((1, 0)).load(VT_A), pt, acc3 * a)
    return (acc0, acc1, acc2, acc3), m_new, l_i


@gluon.jit
def _tiles(kn_smem, kp_smem, sp_smem, pt_smem, a_smem, q_starts, idx_ptr, k_base, k_stride, qo_start, lo, hi,
           is_draft, mask_row, row_ok, score_scale, m_i, l_i, acc, WIDEN: gl.constexpr, BLOCK_N: gl.constexpr,
           BLOCK_M: gl.constexpr):
    """Latents lo .. hi: tile j + 1's copies are in flight while tile j is attended.

    bf16 rows (a bf16 pool, or a draft block) are copied into the two K buffers in turn. The rows
    of an fp8 pool (WIDEN) are copied into K buffer 1, which holds two fp8 tiles (the bytes of
    one bf16 tile) in the same column blocks, and all warps widen tile j into K buffer 0, which
    both dots then read. Q goes through the buffer tile 0 is not copied into."""
    if WIDEN:
        FP8: gl.constexpr = k_base.dtype.element_ty
        dst_n = kn_smem.index(1)._reinterpret(FP8, [2, 4 * BLOCK_N, 128], FP8_SH)
        dst_r = kp_smem.index(1)._reinterpret(FP8, [2, 4 * BLOCK_N, 16], FP8_SH)
        DST_N: gl.constexpr = FP8_3SH
        DST_R: gl.constexpr = FP8_3SH
        Q_BUF: gl.constexpr = 0
    else:
        dst_n = kn_smem
        dst_r = kp_smem
        DST_N: gl.constexpr = KN3_SH
        DST_R: gl.constexpr = KP3_SH
        Q_BUF: gl.constexpr = 1
    _copy_rows(_blocks(kn_smem.index(Q_BUF), KN3_SH), _blocks(kp_smem.index(Q_BUF), KP3_SH), q_starts)
    cp.commit_group()
    n_tiles = gl.cdiv(hi - lo, BLOCK_N)
    if n_tiles > 0:
        rows0 = _row_starts(_slots(idx_ptr, lo, hi, is_draft, BLOCK_N), k_base, k_stride, qo_start, lo, hi,
                            is_draft, BLOCK_N)
        _copy_rows(_blocks(dst_n.index(0), DST_N), _blocks(dst_r.index(0), DST_R), rows0)
    cp.commit_group()
    qt = _q_t(_blocks(kn_smem.index(Q_BUF), KN3_SH), _blocks(kp_smem.index(Q_BUF), KP3_SH))
    slots_nx = _slots(idx_ptr, lo + BLOCK_N, hi, is_draft, BLOCK_N)
    for j in range(0, n_tiles):
        buf = j % 2
        n0 = lo + j * BLOCK_N
        slots = slots_nx  # of tile j + 1, loaded one iteration ago
        slots_nx = _slots(idx_ptr, n0 + 2 * BLOCK_N, hi, is_draft, BLOCK_N)
        # tile j is in; every warp is past iteration j - 1, so the copies' other buffer (or
        # staging slot), K buffer 0 (widened into then) and P^T are free
        cp.wait_group(0)
        cta_barrier()
        if j + 1 < n_tiles:
            rows = _row_starts(slots, k_base, k_stride, qo_start, n0 + BLOCK_N, hi, is_draft, BLOCK_N)
            _copy_rows(_blocks(dst_n.index(1 - buf), DST_N), _blocks(dst_r.index(1 - buf), DST_R), rows)
        cp.commit_group()
        if WIDEN:
            _blocks(kn_smem.index(0), KN3_SH).store(_widen(_blocks(dst_n.index(buf), DST_N).load(NOPE_ROWS)))
            _blocks(kp_smem.index(0), KP3_SH).store(_widen(_blocks(dst_r.index(buf), DST_R).load(ROPE_ROWS)))
            cta_barrier()
            acc, m_i, l_i = _attend_tile(kn_smem.index(0), kp_smem.index(0), sp_smem, pt_smem, a_smem, qt, n0, hi,
                                         is_draft, mask_row, row_ok, score_scale, m_i, l_i, acc, BLOCK_N, BLOCK_M)
        else:
            acc, m_i, l_i = _attend_tile(kn_smem.index(buf), kp_smem.index(buf), sp_smem, pt_smem, a_smem, qt, n0,
                                         hi, is_draft, mask_row, row_ok, score_scale, m_i, l_i, acc, BLOCK_N, BLOCK_M)
    cp.wait_group(0)
    return acc, m_i, l_i


@gluon.jit
def _staged_store(stage, o, ptrs, ok, ST_BL: gl.constexpr):
    """A block of O^T to ptrs (in ST_BL), through the shared buffer stage (free on entry), so
    that a warp writes consecutive columns of a row. A layout conversion would take a scratch
    buffer of its own (Triton 3.8 does not lay it over the dead K buffers: 16 KB past the 99 KB
    of a block for the 8-warp kernel, 8 KB more a team for the two teams)."""
    stage.store(o)
    cta_barrier()
    gl.store(ptrs, stage.load(ST_BL), mask=ok)
    cta_barrier()


@gluon.jit
def _store_block(PART_O, part, rows_ok, acc, o_scale, c0, stage, ST_BL: gl.constexpr):
    """Output columns c0 .. c0 + 128 of the partial result (acc: that block of O^T), through
    stage, the partial sums' buffer (free once the tiles are done) held as [columns, rows]."""
    o = acc * gl.convert_layout(o_scale, ROW_O)[None, :]
    cols = c0 + gl.arange(0, 128, layout=gl.SliceLayout(1, ST_BL))
    _staged_store(stage, o, PART_O + part[None, :] * 512 + cols[:, None], rows_ok[None, :], ST_BL)


@gluon.jit(do_not_specialize=SPLIT_RUNTIME_INTS)
def _verify_split_kernel_mma2(
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
    PDL: gl.constexpr,
):
    gl.static_assert(BLOCK_M == 32)
    gl.static_assert(BLOCK_N == 32)
    gl.static_assert(gl.num_warps() == 8)
    # the partial output's store: a warp writes 128 consecutive columns of one row
    ST_BL: gl.constexpr = gl.BlockedLayout([4, 1], [32, 1], [1, 8], [0, 1])

    pid_m = gl.program_id(0)
    pid_s = gl.program_id(1)
    b, lo, hi, is_draft, qo_start, t_b, kv_start = _program_slice(pid_s, PLAN, KV_INDPTR, QO_INDPTR, NUM_SPLITS,
                                                                  BATCH, rows_max, NUM_HEADS, MIN_CHUNK, BLOCK_N, PDL)
    if b >= BATCH:
        return
    n_rows = t_b * NUM_HEADS
    if pid_m * BLOCK_M >= n_rows:
        return
    idx_ptr = KV_INDICES + kv_start
    # the pool's scales: scores of pool keys count k_scale times, their values v_scale times;
    # the draft latents are not scaled
    score_scale = gl.where(is_draft, qk_scale, qk_scale * k_scale)

    kn_smem = gl.allocate_shared_memory(gl.bfloat16, [2, 4 * BLOCK_N, 128], KN_SH)
    kp_smem = gl.allocate_shared_memory(gl.bfloat16, [2, 4 * BLOCK_N, 16], KP_SH)
    sp_smem = gl.allocate_shared_memory(gl.float32, [4 * BLOCK_N, BLOCK_M], SP_SH)
    pt_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, BLOCK_M], PT_SH)
    a_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_M], A_SH)

    q_starts = _q_starts(Q, qo_start, pid_m, n_rows, stride_qt, stride_qh, NUM_HEADS, BLOCK_M)
    rows_s = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=ROW_S)
    row_ok = rows_s < n_rows
    mask_row = TREE_MASK + qo_start.to(gl.int64) * stride_mask_req + (rows_s // NUM_HEADS).to(gl.int64) * stride_mask
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=ROW_S)
    l_i = gl.full([BLOCK_M], 0.0, gl.float32, layout=ROW_S)
    zero_o = gl.zeros([128, BLOCK_M], gl.float32, layout=OT_L)
    acc = (zero_o, zero_o, zero_o, zero_o)

    # (K_EXT and an fp8 KV are pointers of two types, so each has its own call)
    if KV.dtype.element_ty == gl.bfloat16:
        lo, hi, k_base, k_stride = _keys_of_program(is_draft, t_b, lo, hi, K_EXT, KV, stride_kext, stride_kv)
        acc, m_i, l_i = _tiles(kn_smem, kp_smem, sp_smem, pt_smem, a_smem, q_starts, idx_ptr, k_base, k_stride,
                               qo_start, lo, hi, is_draft, mask_row, row_ok, score_scale, m_i, l_i, acc, False,
                               BLOCK_N, BLOCK_M)
    elif is_draft:  # the request's t_b draft latents (rows of K_EXT)
        acc, m_i, l_i = _tiles(kn_smem, kp_smem, sp_smem, pt_smem, a_smem, q_starts, idx_ptr, K_EXT, stride_kext,
                               qo_start, 0, t_b, True, mask_row, row_ok, score_scale, m_i, l_i, acc, False,
                               BLOCK_N, BLOCK_M)
    else:
        acc, m_i, l_i = _tiles(kn_smem, kp_smem, sp_smem, pt_smem, a_smem, q_starts, idx_ptr, KV, stride_kv, 0,
                               lo, hi, False, mask_row, row_ok, score_scale, m_i, l_i, acc, True, BLOCK_N, BLOCK_M)

    # -- partial result: normalised output and log2-sum-exp2 of this slice --
    has = l_i > 0.0
    lse2 = gl.where(has, m_i + gl.log2(gl.where(has, l_i, 1.0)), float("-inf"))
    o_scale = gl.where(is_draft, 1.0, v_scale) / gl.where(has, l_i, 1.0)
    rows_o = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, ST_BL))
    part = pid_s.to(gl.int64) * rows_max + rows_o
    rows_ok = rows_o < n_rows
    acc0, acc1, acc2, acc3 = acc
    cta_barrier()  # every warp's last reads of the partial sums are done
    stage = sp_smem._reinterpret(gl.float32, [BLOCK_M, 128], STAGE_SH).permute((1, 0))
    _store_block(PART_O, part, rows_ok, acc0, o_scale, 0, stage, ST_BL)
    _store_block(PART_O, part, rows_ok, acc1, o_scale, 128, stage, ST_BL)
    _store_block(PART_O, part, rows_ok, acc2, o_scale, 256, stage, ST_BL)
    _store_block(PART_O, part, rows_ok, acc3, o_scale, 384, stage, ST_BL)
    gl.store(PART_LSE + pid_s.to(gl.int64) * rows_max + rows_s, lse2, mask=row_ok)
