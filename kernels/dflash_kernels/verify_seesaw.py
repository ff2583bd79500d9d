"""sm_90's split kernel with FlashMLA's "seesaw" schedule (a candidate; CONFIGS["sm90"] still
runs the warp-specialised kernel of verify_gluon.py until this one measures faster).

Why: in the warp-specialised kernel one warpgroup (the S group) computes every S = Q.K^T and
every softmax, and the other (the V group) only the larger part of P.V; the S group's chain per
tile sets the pace (RESULTS.md, session 13: 40% of its samples issue S, 25% wait for it), and
the tensor pipe is busy 47% of the time. Here the two MMA warpgroups are symmetric: they take
the tiles in pairs, the left one computes S of the even tile and the right one S of the odd
tile, and each keeps half of the 64 x 512 output (left: columns 0..255, right: 256..511). Per
pair (FlashMLA's deep-dive, docs/20250422-new-kernel-deep-dive.md, in log2 units):

  left:  S_e; m_e = max(m, rowmax S_e); P_e = 2^(S_e - m_e); s_e = 2^(m - m_e)   -> right
         O_L = O_L s_e + P_e V_eL                     (P_e from registers)
  right: S_o; m_o = max(m_e, rowmax S_o); P_o = 2^(S_o - m_o); s_o = 2^(m_e - m_o) -> left
         O_R = O_R s_e s_o + P_o V_oR                 (P_o from registers)
  left:  P_e s_o -> right;  O_L = O_L s_o + P_o V_oL  (P_o from shared memory)
  right: O_R = O_R + (P_e s_o) V_eR                   (from shared memory)

so one group's softmax runs while the other's MMAs keep the tensor pipe busy, and each does
half of the S work. The right group keeps the row sums (l = (l s_e + sum P_e) s_o + sum P_o)
and hands them over at the end; the left group keeps the running maximum and writes the LSE.

The loader partition is the warp-specialised kernel's (Q, then the gathers, bf16 or widened
fp8), asked for an even number of tiles: the pad tile of an odd count repeats the slice's last
row (a finite latent of this request) and its columns are masked, so no MMA is conditional.
Shared memory (BLOCK_N = 32, NUM_STAGES = 4): Q 72 KB + 4 x K 36 KB + two P tiles of 4 KB + the
exchanged row values.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ._gluon_compat import cta_barrier
from .verify_attention import SPLIT_RUNTIME_INTS, _keys_of_program, _program_slice
from .verify_gluon import (
    WS_FP8_LOADER_REGS,
    WS_LOADER_REGS,
    WS_LOADER_WARPS,
    _issue_s,
    _online_softmax_step,
    _q_and_k_buffers,
    _store_partial_hi,
    _store_partial_lo,
    _ws_loader_any,
)

# registers of the right group (128 accumulators, S, P, the exchanged rows); the left group gets the
# rest of 504 a thread: 248 beside the bf16 loader (no spill; 232 spilled 48 bytes), 224 beside the
# fp8 loader's 72
SEESAW_RIGHT_REGS = gl.constexpr(216)
SEESAW_RIGHT_REGS_FP8 = gl.constexpr(208)
# rows of the exchange buffer (fp32, one value a query row)
X_M_E = gl.constexpr(0)  # left -> right: the maximum after the even tile
X_S_E = gl.constexpr(1)  # its rescale factor of the older accumulators
X_SUM_E = gl.constexpr(2)  # the row sums of P_e
X_S_O = gl.constexpr(3)  # right -> left: the rescale factor after the odd tile
X_M_O = gl.constexpr(4)  # the maximum after the odd tile (the pair's)
X_L = gl.constexpr(5)  # right -> left, once at the end: the row sums


@gluon.jit
def _seesaw_left(qn_lo, qn_hi, qp_s, q_ready, kn_lo, kn_hi, kp_s, p_e_smem, p_o_smem, xch, ready, kfree,
                 x_ready, x_free, po_ready, po_free, l_ready,
                 mask_rows, stride_mask, pid_m, n_rows, lo, hi, is_draft, n_pairs, qk_scale,
                 NUM_HEADS: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr):
    """Even tiles' S and softmax; output columns 0..255. Returns (O_L, m, l)."""
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    ROW_S: gl.constexpr = gl.SliceLayout(1, S_L)
    COL_S: gl.constexpr = gl.SliceLayout(0, S_L)
    ROW_O: gl.constexpr = gl.SliceLayout(1, O_L)
    offs_m = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=ROW_S)
    row_ok = offs_m < n_rows
    mask_row = mask_rows + (offs_m // NUM_HEADS).to(gl.int64) * stride_mask
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=ROW_S)
    no_sum = gl.full([BLOCK_M], 0.0, gl.float32, layout=ROW_S)
    acc = gl.zeros([BLOCK_M, 256], gl.float32, layout=O_L)
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=S_L)
    mbarrier.wait(q_ready, 0)
    mbarrier.wait(ready.index(0), 0, pred=n_pairs > 0)
    fence_async_shared()
    s = _issue_s(qn_lo, qn_hi, qp_s, kn_lo, kn_hi, kp_s, 0, zero_s)
    s = warpgroup_mma_wait(0, deps=[s])
    for i in range(n_pairs):
        ph = i & 1
        be = (2 * i) % NUM_STAGES
        bo = (2 * i + 1) % NUM_STAGES
        p_e, s_e, m_e, sum_e = _online_softmax_step(s, lo + 2 * i * BLOCK_N, hi, is_draft, mask_row, row_ok,
                                                    qk_scale, m_i, no_sum, BLOCK_N, COL_S)
        mbarrier.wait(x_free, ph ^ 1)  # the right group is done with the last pair's P_e and values
        p_e_smem.store(p_e.to(gl.bfloat16))
        xch.index(X_M_E).store(m_e)
        xch.index(X_S_E).store(s_e)
        xch.index(X_SUM_E).store(sum_e)
        fence_async_shared()
        mbarrier.arrive(x_ready, count=1)
        acc = acc * gl.convert_layout(s_e, ROW_O)[:, None]
        acc = warpgroup_mma(p_e_smem, kn_lo.index(be), acc, is_async=True)
        mbarrier.wait(po_ready, ph)  # P_o, s_o and m_o
        s_o = xch.index(X_S_O).load(ROW_S)
        m_i = xch.index(X_M_O).load(ROW_S)
        acc = warpgroup_mma_wait(0, deps=[acc])
        mbarrier.arrive(kfree.index(be), count=1)
        acc = acc * gl.convert_layout(s_o, ROW_O)[:, None]
        acc = warpgroup_mma(p_o_smem, kn_lo.index(bo), acc, is_async=True)
        # the next pair's S_e behind P_o.V_oL, so the tensor pipe has it queued (after the last
        # pair: a discarded S of a buffer no copy is writing)
        nb = (2 * i + 2) % NUM_STAGES
        mbarrier.wait(ready.index(nb), ((2 * i + 2) // NUM_STAGES) & 1, pred=i + 1 < n_pairs)
        fence_async_shared()
        s_nx = _issue_s(qn_lo, qn_hi, qp_s, kn_lo, kn_hi, kp_s, nb, zero_s)
        # (both waited here: an MMA in flight across the loop's back edge serialises them all, C7514)
        acc, s = warpgroup_mma_wait(0, deps=[acc, s_nx])
        mbarrier.arrive(po_free, count=1)
        mbarrier.arrive(kfree.index(bo), count=1)
    mbarrier.wait(l_ready, 0)
    return acc, m_i, xch.index(X_L).load(ROW_S)


@gluon.jit
def _seesaw_right(qn_lo, qn_hi, qp_s, q_ready, kn_lo, kn_hi, kp_s, p_e_smem, p_o_smem, xch, ready, kfree,
                  x_ready, x_free, po_ready, po_free, l_ready,
                  mask_rows, stride_mask, pid_m, n_rows, lo, hi, is_draft, n_pairs, qk_scale,
                  PART_O, part_row0, n_rows_here, o_scale,
                  NUM_HEADS: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr):
    """Odd tiles' S and softmax, the row sums; output columns 256..511, which it stores."""
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    ROW_S: gl.constexpr = gl.SliceLayout(1, S_L)
    COL_S: gl.constexpr = gl.SliceLayout(0, S_L)
    ROW_O: gl.constexpr = gl.SliceLayout(1, O_L)
    offs_m = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=ROW_S)
    row_ok = offs_m < n_rows
    mask_row = mask_rows + (offs_m // NUM_HEADS).to(gl.int64) * stride_mask
    l_i = gl.full([BLOCK_M], 0.0, gl.float32, layout=ROW_S)
    acc = gl.zeros([BLOCK_M, 256], gl.float32, layout=O_L)
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=S_L)
    mbarrier.wait(q_ready, 0)
    mbarrier.wait(ready.index(1 % NUM_STAGES), (1 // NUM_STAGES) & 1, pred=n_pairs > 0)
    fence_async_shared()
    s = _issue_s(qn_lo, qn_hi, qp_s, kn_lo, kn_hi, kp_s, 1 % NUM_STAGES, zero_s)
    s = warpgroup_mma_wait(0, deps=[s])
    for i in range(n_pairs):
        ph = i & 1
        be = (2 * i) % NUM_STAGES
        bo = (2 * i + 1) % NUM_STAGES
        n0 = lo + (2 * i + 1) * BLOCK_N
        mbarrier.wait(x_ready, ph)  # P_e and the even tile's row values
        m_e = xch.index(X_M_E).load(ROW_S)
        s_e = xch.index(X_S_E).load(ROW_S)
        sum_e = xch.index(X_SUM_E).load(ROW_S)
        # O_R = (O_R s_e + P_e V_eR) s_o + P_o V_oR: P_e.V_eR runs during the softmax of S_o
        acc = acc * gl.convert_layout(s_e, ROW_O)[:, None]
        acc = warpgroup_mma(p_e_smem, kn_hi.index(be), acc, is_async=True)
        # (an odd count's pad tile lies past hi: no mask word is read for it)
        p_o, s_o, m_o, l_i = _online_softmax_step(s, n0, hi, is_draft, mask_row, row_ok & (n0 < hi), qk_scale, m_e,
                                                  l_i * s_e + sum_e, BLOCK_N, COL_S)
        mbarrier.wait(po_free, ph ^ 1)  # the left group is done with the last pair's P_o and values
        p_o_smem.store(p_o.to(gl.bfloat16))
        xch.index(X_S_O).store(s_o)
        xch.index(X_M_O).store(m_o)
        fence_async_shared()
        mbarrier.arrive(po_ready, count=1)
        acc = warpgroup_mma_wait(0, deps=[acc])
        mbarrier.arrive(x_free, count=1)
        mbarrier.arrive(kfree.index(be), count=1)
        acc = acc * gl.convert_layout(s_o, ROW_O)[:, None]
        acc = warpgroup_mma(p_o_smem, kn_hi.index(bo), acc, is_async=True)
        nb = (2 * i + 3) % NUM_STAGES  # the next pair's S_o, as the left group does
        mbarrier.wait(ready.index(nb), ((2 * i + 3) // NUM_STAGES) & 1, pred=i + 1 < n_pairs)
        fence_async_shared()
        s_nx = _issue_s(qn_lo, qn_hi, qp_s, kn_lo, kn_hi, kp_s, nb, zero_s)
        acc, s = warpgroup_mma_wait(0, deps=[acc, s_nx])
        mbarrier.arrive(kfree.index(bo), count=1)
    xch.index(X_L).store(l_i)
    mbarrier.arrive(l_ready, count=1)
    _store_partial_hi(acc, gl.convert_layout(gl.where(l_i > 0.0, l_i, 1.0) / o_scale, ROW_O), PART_O, part_row0,
                      n_rows_here, BLOCK_M, 256)


@gluon.jit(do_not_specialize=SPLIT_RUNTIME_INTS)
def _verify_split_kernel_seesaw(
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
):
    gl.static_assert(BLOCK_M == 64)
    gl.static_assert((BLOCK_N == 64) or (BLOCK_N == 32))  # the loader's layout covers BLOCK_N rows
    gl.static_assert(NUM_STAGES >= 2)  # a pair's two tiles
    gl.static_assert(gl.num_warps() == 4)  # the left group; the right group and the loader come on top

    pid_m = gl.program_id(0)
    pid_s = gl.program_id(1)
    b, lo, hi, is_draft = _program_slice(pid_s, PLAN, KV_INDPTR, NUM_SPLITS, BATCH, MIN_CHUNK, BLOCK_N)
    if b >= BATCH:
        return
    qo_start = gl.load(QO_INDPTR + b)
    mask_rows = TREE_MASK + qo_start.to(gl.int64) * stride_mask_req  # (see the warp-specialised kernel)
    t_b = gl.load(QO_INDPTR + b + 1) - qo_start
    n_rows = t_b * NUM_HEADS
    if pid_m * BLOCK_M >= n_rows:
        return
    kv_start = gl.load(KV_INDPTR + b)
    KV_FP8: gl.constexpr = KV.dtype.element_ty != K_EXT.dtype.element_ty
    if KV_FP8:
        lo, hi, k_base, k_stride = _keys_of_program(is_draft, t_b, lo, hi, K_EXT, K_EXT, stride_kext, stride_kext)
    else:
        lo, hi, k_base, k_stride = _keys_of_program(is_draft, t_b, lo, hi, K_EXT, KV, stride_kext, stride_kv)
    if is_draft:
        qk = qk_scale
        o_scale = 1.0
    else:
        qk = qk_scale * k_scale
        o_scale = v_scale

    qn_lo, qn_hi, qp_s, kn_lo, kn_hi, kp_s = _q_and_k_buffers(BLOCK_M, BLOCK_N, NUM_STAGES)
    P_SH: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], gl.bfloat16)
    p_e_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, BLOCK_N], P_SH)
    p_o_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, BLOCK_N], P_SH)
    xch = gl.allocate_shared_memory(gl.float32, [6, BLOCK_M], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    kfree = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    # x: P_e and the even tile's row values; po: P_o and the odd tile's; l: the final row sums
    sync = gl.allocate_shared_memory(gl.int64, [6, 1], mbarrier.MBarrierLayout())
    x_ready = sync.index(0)
    x_free = sync.index(1)
    po_ready = sync.index(2)
    po_free = sync.index(3)
    l_ready = sync.index(4)
    q_ready = sync.index(5)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(i), count=32 * WS_LOADER_WARPS)  # one cp.async arrive per loader thread
        mbarrier.init(kfree.index(i), count=2)  # both MMA groups read every tile (S or P.V)
    for i in gl.static_range(5):
        mbarrier.init(sync.index(i), count=1)
    mbarrier.init(q_ready, count=32 * WS_LOADER_WARPS)
    fence_async_shared()
    cta_barrier()

    n_pairs = gl.cdiv(gl.cdiv(hi - lo, BLOCK_N), 2)
    if KV_FP8:
        loader_regs: gl.constexpr = WS_FP8_LOADER_REGS
        right_regs: gl.constexpr = SEESAW_RIGHT_REGS_FP8
    else:
        loader_regs: gl.constexpr = WS_LOADER_REGS
        right_regs: gl.constexpr = SEESAW_RIGHT_REGS
    acc, m_i, l_i = gl.warp_specialize([
        (_seesaw_left, (qn_lo, qn_hi, qp_s, q_ready, kn_lo, kn_hi, kp_s, p_e_smem, p_o_smem, xch, ready, kfree,
                        x_ready, x_free, po_ready, po_free, l_ready,
                        mask_rows, stride_mask, pid_m, n_rows, lo, hi, is_draft, n_pairs, qk,
                        NUM_HEADS, BLOCK_M, BLOCK_N, NUM_STAGES)),
        (_seesaw_right, (qn_lo, qn_hi, qp_s, q_ready, kn_lo, kn_hi, kp_s, p_e_smem, p_o_smem, xch, ready, kfree,
                         x_ready, x_free, po_ready, po_free, l_ready,
                         mask_rows, stride_mask, pid_m, n_rows, lo, hi, is_draft, n_pairs, qk,
                         PART_O, pid_s.to(gl.int64) * rows_max + pid_m * BLOCK_M, n_rows - pid_m * BLOCK_M, o_scale,
                         NUM_HEADS, BLOCK_M, BLOCK_N, NUM_STAGES)),
        (_ws_loader_any, (qn_lo, qn_hi, qp_s, q_ready, Q, stride_qt, stride_qh, pid_m, n_rows, kn_lo, kn_hi, kp_s,
                          ready, kfree, KV_INDICES + kv_start, k_base, k_stride, KV, stride_kv, qo_start, lo, hi,
                          is_draft, 2 * n_pairs, NUM_HEADS, BLOCK_M, BLOCK_N, NUM_STAGES)),
    ], [4, WS_LOADER_WARPS], [right_regs, loader_regs])

    # -- partial result (the right group wrote columns 256..511) --
    l_div = gl.convert_layout(gl.where(l_i > 0.0, l_i, 1.0) / o_scale, gl.SliceLayout(1, acc.type.layout))
    _store_partial_lo(acc, l_div, m_i, l_i, PART_O, PART_LSE, pid_s, pid_m, rows_max, n_rows, BLOCK_M)
