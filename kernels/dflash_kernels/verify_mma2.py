"""The split kernel sm_120 runs (RESULTS.md, sessions 9 and 10), for mma.sync GPUs, in Triton's
Gluon dialect.

Same contract as ``verify_attention._verify_split_kernel`` (same arguments, plan and partial
outputs; bf16 pools, scaled or not, and fp8 pools). What it does that the Triton-language kernel
cannot get from the compiler on sm_120 (99 KB of shared memory a block):

  * it computes S^T = K.Q^T (latents x query rows) instead of S = Q.K^T, so Q is the B operand:
    over 8 warps as [2, 4], a warp holds its 8 query rows' 576 values in registers
    (72 a thread), loaded once, and no tile of S is computed twice;
  * P.V becomes O^T = V^T.P^T, over 8 warps along the 512 output columns: V^T is read from the
    K buffer it came in with, P^T goes through 2 KB of shared memory;
  * so shared memory holds two 32-latent K buffers (72 KB) and P^T, and never Q.

An fp8 pool's tile is widened to bf16 (exact) before either dot reads it: its rows are copied into
the second K buffer, which holds two fp8 tiles, and all warps widen tile j into the first while
tile j + 1's copies are in flight (_fp8_pool_tiles).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from .verify_attention import SPLIT_RUNTIME_INTS, _keys_of_program, _program_slice
from .verify_gluon import _issue_tile, _q_row_ptrs, _tile_slots, _widen

KC = gl.constexpr(64)  # latent columns per step of S^T (9 steps: 8 of the nope part, the rope part)
# S^T (latents x rows) over [2, 4] warps: a warp computes 16 latents x 8 rows
ST_L = gl.constexpr(gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[2, 4], instr_shape=[16, 8]))
# O^T (512 columns x rows) over [8, 1] warps: a warp owns 64 output columns of every row
OT_L = gl.constexpr(gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[8, 1], instr_shape=[16, 8]))
# k_width 2 is mma.sync's own fragment, which ldmatrix loads; with 8 the compiler rebuilt the
# fragments with about 260 register moves a tile, 1.6x slower (RESULTS.md, session 9)
K_A = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=ST_L, k_width=2))
QT_B = gl.constexpr(gl.DotOperandLayout(operand_index=1, parent=ST_L, k_width=2))
VT_A = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=OT_L, k_width=2))
PT_B = gl.constexpr(gl.DotOperandLayout(operand_index=1, parent=OT_L, k_width=2))
KEY_S = gl.constexpr(gl.SliceLayout(1, ST_L))  # along S^T's latents
ROW_S = gl.constexpr(gl.SliceLayout(0, ST_L))  # along S^T's query rows
ROW_O = gl.constexpr(gl.SliceLayout(0, OT_L))
# bf16 latent gathers, 16 bytes a thread and copy: each 8 lanes copy 128 bytes of one row, which
# the swizzle puts in 8 different bank groups (8 lanes over 2 rows' 64 bytes met each group twice:
# 2x the ideal wavefronts, ncu, RESULTS.md session 10)
GL = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0]))
# fp8 rows: a warp copies (16 bytes a thread) and widens (8) one row's nope part at a time, 4 rows
# of its rope part; each is 32 x 16 bytes of a plain row, 2-4 wavefronts, as are the widened
# rows' stores into the swizzled K buffer
FP8_NOPE_COPY = gl.constexpr(gl.BlockedLayout([1, 16], [1, 32], [8, 1], [1, 0]))
FP8_NOPE_WIDEN = gl.constexpr(gl.BlockedLayout([1, 8], [1, 32], [8, 1], [1, 0]))
FP8_ROPE = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0]))
FP8_SH = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
KN_SH = gl.constexpr(gl.SwizzledSharedLayout(8, 1, 8, [1, 0]))  # rows of 1 KB
# the swizzles give the 8 rows an ldmatrix reads 16 bytes each in 8 different bank groups
KP_SH = gl.constexpr(gl.SwizzledSharedLayout(8, 1, 8, [1, 0]))  # rows of 128 bytes
PT_SH = gl.constexpr(gl.SwizzledSharedLayout(8, 2, 4, [1, 0]))  # rows of 64 bytes, two a 128-byte line


@gluon.jit
def _q_t_chunk(q_rows, rows_ok, c0, QT_BL: gl.constexpr):
    """Q^T columns c0 .. c0 + 64 of the rows starting at q_rows, as the B operand of S^T (0 where
    not rows_ok)."""
    k = c0 + gl.arange(0, KC, layout=gl.SliceLayout(1, QT_BL))
    q = gl.load(q_rows[None, :] + k[:, None], mask=rows_ok[None, :], other=0.0)
    return gl.convert_layout(q, QT_B)


@gluon.jit
def _q_t_blocks(q_rows, rows_ok, QT_BL: gl.constexpr):
    """Q^T in registers, once: the nine 64-column blocks of S^T's B operand. Loaded after the
    first tile's copies are issued, so that their latencies overlap."""
    return (_q_t_chunk(q_rows, rows_ok, 0, QT_BL), _q_t_chunk(q_rows, rows_ok, 64, QT_BL),
            _q_t_chunk(q_rows, rows_ok, 128, QT_BL), _q_t_chunk(q_rows, rows_ok, 192, QT_BL),
            _q_t_chunk(q_rows, rows_ok, 256, QT_BL), _q_t_chunk(q_rows, rows_ok, 320, QT_BL),
            _q_t_chunk(q_rows, rows_ok, 384, QT_BL), _q_t_chunk(q_rows, rows_ok, 448, QT_BL),
            _q_t_chunk(q_rows, rows_ok, 512, QT_BL))


@gluon.jit
def _attend_tile(kn, kp, pt_smem, qt, n0, hi, is_draft, mask_row, row_ok, score_scale, m_i, l_i, acc,
                 BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr):
    """Fold the bf16 tile of latents n0 .. n0 + BLOCK_N (kn: nope part, kp: rope part) into the
    online softmax and O^T; qt: the nine 64-column blocks of Q^T."""
    qt0, qt1, qt2, qt3, qt4, qt5, qt6, qt7, qt8 = qt
    # three accumulators, so that a warp's 36 mma.sync of S^T are three chains of 12, not one of
    # 36 that waits on each result (ncu: 30% of the stalls were such waits, RESULTS.md session 10)
    zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=ST_L)
    s0 = mma_v2(kn.slice(0, KC, dim=1).load(K_A), qt0, zero)
    s1 = mma_v2(kn.slice(64, KC, dim=1).load(K_A), qt1, zero)
    s2 = mma_v2(kn.slice(128, KC, dim=1).load(K_A), qt2, zero)
    s0 = mma_v2(kn.slice(192, KC, dim=1).load(K_A), qt3, s0)
    s1 = mma_v2(kn.slice(256, KC, dim=1).load(K_A), qt4, s1)
    s2 = mma_v2(kn.slice(320, KC, dim=1).load(K_A), qt5, s2)
    s0 = mma_v2(kn.slice(384, KC, dim=1).load(K_A), qt6, s0)
    s1 = mma_v2(kn.slice(448, KC, dim=1).load(K_A), qt7, s1)
    s2 = mma_v2(kp.load(K_A), qt8, s2)
    s = s0 + s1 + s2
    # mask (latents past hi; a draft tile's tree mask: one 32-bit word a row) and the online
    # softmax along the latents, S^T's first dimension
    cols = n0 + gl.arange(0, BLOCK_N, layout=KEY_S)
    if is_draft:
        word = gl.load(mask_row + (n0 >> 5), mask=row_ok, other=0)
        visible = (((word[None, :] >> (cols & 31)[:, None]) & 1) != 0) & (cols < hi)[:, None]
        s = gl.where(visible, s, float("-inf"))
    elif n0 + BLOCK_N > hi:
        s = gl.where((cols < hi)[:, None], s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 0) * score_scale)
    m_sub = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_sub)
    p = gl.exp2(s * score_scale - m_sub[None, :])
    l_i = l_i * alpha + gl.sum(p, 0)
    pt_smem.store(p.to(gl.bfloat16))
    gl.thread_barrier()
    acc = acc * gl.convert_layout(alpha, ROW_O)[None, :]
    acc = mma_v2(kn.permute((1, 0)).load(VT_A), pt_smem.load(PT_B), acc)
    return acc, m_new, l_i


@gluon.jit
def _bf16_tiles(kn_smem, kp_smem, pt_smem, q_rows, q_ok, idx_ptr, k_base, k_stride, qo_start, lo, hi, is_draft,
                mask_row, row_ok, score_scale, m_i, l_i, acc, QT_BL: gl.constexpr, BLOCK_N: gl.constexpr,
                BLOCK_M: gl.constexpr):
    """Latents lo .. hi of bf16 rows (a bf16 pool, or a draft block): tile j + 1's gather into
    the other K buffer is in flight while tile j is attended."""
    ROW_G: gl.constexpr = gl.SliceLayout(1, GL)
    n_tiles = gl.cdiv(hi - lo, BLOCK_N)
    if n_tiles > 0:
        slots0 = _tile_slots(idx_ptr, lo, hi, is_draft, BLOCK_N, ROW_G)
        _issue_tile(kn_smem.index(0), kp_smem.index(0), slots0, k_base, k_stride, qo_start, lo, hi,
                    is_draft, BLOCK_N, GL)
    cp.commit_group()
    qt = _q_t_blocks(q_rows, q_ok, QT_BL)
    slots_nx = _tile_slots(idx_ptr, lo + BLOCK_N, hi, is_draft, BLOCK_N, ROW_G)
    for j in range(0, n_tiles):
        buf = j % 2
        n0 = lo + j * BLOCK_N
        slots = slots_nx  # of tile j + 1, loaded one iteration ago
        slots_nx = _tile_slots(idx_ptr, n0 + 2 * BLOCK_N, hi, is_draft, BLOCK_N, ROW_G)
        # tile j is in; every warp is past iteration j - 1, so buffer 1 - buf and P^T are free
        cp.wait_group(0)
        gl.thread_barrier()
        if j + 1 < n_tiles:
            _issue_tile(kn_smem.index(1 - buf), kp_smem.index(1 - buf), slots, k_base, k_stride,
                        qo_start, n0 + BLOCK_N, hi, is_draft, BLOCK_N, GL)
        cp.commit_group()
        acc, m_i, l_i = _attend_tile(kn_smem.index(buf), kp_smem.index(buf), pt_smem, qt, n0, hi, is_draft,
                                     mask_row, row_ok, score_scale, m_i, l_i, acc, BLOCK_N, BLOCK_M)
    cp.wait_group(0)
    return acc, m_i, l_i


@gluon.jit
def _fp8_slots(idx_ptr, n0, hi, BLOCK_N: gl.constexpr):
    """Pool slots of a tile's rows in the nope copies' layout and in the rope copies' one."""
    return (_tile_slots(idx_ptr, n0, hi, False, BLOCK_N, gl.SliceLayout(1, FP8_NOPE_COPY)),
            _tile_slots(idx_ptr, n0, hi, False, BLOCK_N, gl.SliceLayout(1, FP8_ROPE)))


@gluon.jit
def _stage_fp8_tile(stage_nope, stage_rope, slots, KV, stride_kv):
    """cp.async of the fp8 pool rows at `slots` (their nope parts, their rope parts) into a
    staging slot; the caller commits the group."""
    slots_n, slots_r = slots
    rows_n = KV + slots_n.to(gl.int64) * stride_kv
    rows_r = KV + slots_r.to(gl.int64) * stride_kv + 512
    cp.async_copy_global_to_shared(
        stage_nope, rows_n[:, None] + gl.arange(0, 512, layout=gl.SliceLayout(0, FP8_NOPE_COPY))[None, :])
    cp.async_copy_global_to_shared(
        stage_rope, rows_r[:, None] + gl.arange(0, 64, layout=gl.SliceLayout(0, FP8_ROPE))[None, :])


@gluon.jit
def _fp8_pool_tiles(kn_smem, kp_smem, pt_smem, q_rows, q_ok, idx_ptr, KV, stride_kv, lo, hi,
                    mask_row, row_ok, score_scale, m_i, l_i, acc, QT_BL: gl.constexpr, BLOCK_N: gl.constexpr,
                    BLOCK_M: gl.constexpr):
    """Pool latents lo .. hi of an fp8 pool. K buffer 1 holds two fp8 tiles (the bytes of one
    bf16 tile): tile j + 1 is copied into one while all warps widen tile j from the other into
    K buffer 0, which both dots then read."""
    FP8: gl.constexpr = KV.dtype.element_ty
    stage_nope = kn_smem.index(1)._reinterpret(FP8, [2, BLOCK_N, 512], FP8_SH)
    stage_rope = kp_smem.index(1)._reinterpret(FP8, [2, BLOCK_N, 64], FP8_SH)
    n_tiles = gl.cdiv(hi - lo, BLOCK_N)
    if n_tiles > 0:
        _stage_fp8_tile(stage_nope.index(0), stage_rope.index(0), _fp8_slots(idx_ptr, lo, hi, BLOCK_N), KV, stride_kv)
    cp.commit_group()
    qt = _q_t_blocks(q_rows, q_ok, QT_BL)
    slots_nx = _fp8_slots(idx_ptr, lo + BLOCK_N, hi, BLOCK_N)
    for j in range(0, n_tiles):
        buf = j % 2
        n0 = lo + j * BLOCK_N
        slots = slots_nx  # of tile j + 1, loaded one iteration ago
        slots_nx = _fp8_slots(idx_ptr, n0 + 2 * BLOCK_N, hi, BLOCK_N)
        # tile j is in; every warp is past iteration j - 1, so K buffer 0 and staging slot 1 - buf
        # (widened then) are free
        cp.wait_group(0)
        gl.thread_barrier()
        if j + 1 < n_tiles:
            _stage_fp8_tile(stage_nope.index(1 - buf), stage_rope.index(1 - buf), slots, KV, stride_kv)
        cp.commit_group()
        kn_smem.index(0).store(_widen(stage_nope.index(buf).load(FP8_NOPE_WIDEN)))
        kp_smem.index(0).store(_widen(stage_rope.index(buf).load(FP8_ROPE)))
        gl.thread_barrier()
        acc, m_i, l_i = _attend_tile(kn_smem.index(0), kp_smem.index(0), pt_smem, qt, n0, hi, False,
                                     mask_row, row_ok, score_scale, m_i, l_i, acc, BLOCK_N, BLOCK_M)
    cp.wait_group(0)
    return acc, m_i, l_i


@gluon.jit(do_not_specialize=SPLIT_RUNTIME_INTS)
def _verify_split_kernel_mma2(
    Q, K_EXT, KV, KV_INDICES, KV_INDPTR, QO_INDPTR, TREE_MASK, PLAN,
    PART_O, PART_LSE,
    qk_scale,
    stride_qt, stride_qh, stride_kext, stride_kv, stride_mask,
    rows_max, NUM_SPLITS, BATCH,
    k_scale, v_scale,
    NUM_HEADS: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
):
    gl.static_assert(BLOCK_M == 32)
    gl.static_assert(BLOCK_N == 32)
    gl.static_assert(gl.num_warps() == 8)
    QT_BL: gl.constexpr = gl.BlockedLayout([8, 1], [8, 4], [1, 8], [0, 1])  # Q^T (64, rows) load
    # the partial output's store: a warp writes 128 consecutive columns of one row
    ST_BL: gl.constexpr = gl.BlockedLayout([4, 1], [32, 1], [1, 8], [0, 1])

    pid_m = gl.program_id(0)
    pid_s = gl.program_id(1)
    b, lo, hi, is_draft = _program_slice(pid_s, PLAN, NUM_SPLITS, BATCH)
    if b >= BATCH:
        return
    qo_start = gl.load(QO_INDPTR + b)
    t_b = gl.load(QO_INDPTR + b + 1) - qo_start
    n_rows = t_b * NUM_HEADS
    if pid_m * BLOCK_M >= n_rows:
        return
    idx_ptr = KV_INDICES + gl.load(KV_INDPTR + b)
    # the pool's scales: scores of pool keys count k_scale times, their values v_scale times;
    # the draft latents are not scaled
    score_scale = gl.where(is_draft, qk_scale, qk_scale * k_scale)

    kn_smem = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, 512], KN_SH)
    kp_smem = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, 64], KP_SH)
    pt_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, BLOCK_M], PT_SH)

    rows_q = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, QT_BL))
    q_rows = _q_row_ptrs(Q, qo_start, rows_q, stride_qt, stride_qh, NUM_HEADS)
    q_ok = rows_q < n_rows
    rows_s = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=ROW_S)
    row_ok = rows_s < n_rows
    mask_row = TREE_MASK + (qo_start + rows_s // NUM_HEADS).to(gl.int64) * stride_mask
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=ROW_S)
    l_i = gl.full([BLOCK_M], 0.0, gl.float32, layout=ROW_S)
    acc = gl.zeros([512, BLOCK_M], gl.float32, layout=OT_L)

    # (K_EXT and an fp8 KV are pointers of two types, so each has its own call)
    if KV.dtype.element_ty == gl.bfloat16:
        lo, hi, k_base, k_stride = _keys_of_program(is_draft, t_b, lo, hi, K_EXT, KV, stride_kext, stride_kv)
        acc, m_i, l_i = _bf16_tiles(kn_smem, kp_smem, pt_smem, q_rows, q_ok, idx_ptr, k_base, k_stride, qo_start,
                                    lo, hi, is_draft, mask_row, row_ok, score_scale, m_i, l_i, acc, QT_BL,
                                    BLOCK_N, BLOCK_M)
    elif is_draft:  # the request's t_b draft latents (rows of K_EXT)
        acc, m_i, l_i = _bf16_tiles(kn_smem, kp_smem, pt_smem, q_rows, q_ok, idx_ptr, K_EXT, stride_kext, qo_start,
                                    0, t_b, True, mask_row, row_ok, score_scale, m_i, l_i, acc, QT_BL,
                                    BLOCK_N, BLOCK_M)
    else:
        acc, m_i, l_i = _fp8_pool_tiles(kn_smem, kp_smem, pt_smem, q_rows, q_ok, idx_ptr, KV, stride_kv, lo, hi,
                                        mask_row, row_ok, score_scale, m_i, l_i, acc, QT_BL, BLOCK_N, BLOCK_M)

    # -- partial result: normalised output and log2-sum-exp2 of this slice --
    has = l_i > 0.0
    lse2 = gl.where(has, m_i + gl.log2(gl.where(has, l_i, 1.0)), float("-inf"))
    o_scale = gl.where(is_draft, 1.0, v_scale) / gl.where(has, l_i, 1.0)
    o = gl.convert_layout(acc * gl.convert_layout(o_scale, ROW_O)[None, :], ST_BL)
    rows_o = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, ST_BL))
    part = pid_s.to(gl.int64) * rows_max + rows_o
    gl.store(PART_O + part[None, :] * 512 + gl.arange(0, 512, layout=gl.SliceLayout(1, ST_BL))[:, None], o,
             mask=(rows_o < n_rows)[None, :])
    gl.store(PART_LSE + pid_s.to(gl.int64) * rows_max + rows_s, lse2, mask=row_ok)
