"""The split kernel sm_120 runs for bf16 pools (scaled or not): verify_mma2.py's kernel as two
teams of 4 warps that work out of phase (fp8 pools run verify_mma2.py's kernel itself).

Session 11's profile of verify_mma2.py's kernel (RESULTS.md): one program an SM leaves two warps a
scheduler, and its barriers hold all eight in the same phase of a tile, so the schedulers idle 75%
of the time. Overlap needs another tile's work beside the current one; a third K buffer (108 KB)
does not fit in sm_120's 99 KB a block. Here the 32 rows of a program are split instead:

  * team r (a warp_specialize partition of 4 warps) owns query rows 16r .. 16r + 15: S^T, the
    softmax and O^T of its rows (the same mma count a tile as the 8-warp kernel, Q^T in 36
    registers a thread, O^T in 64), with its own partial sums, P^T and barriers (bar.sync of its
    4 warps only);
  * both teams read the same two K buffers, which a loader partition of 2 warps fills (Q into
    buffer 1 first, then the tiles), counted on mbarriers as the rows land (cp.async's mbarrier
    arrive); each team arrives on a buffer's kfree barrier once it is done with its tile. So the
    teams are not held together by any barrier: while one waits on its barriers or its shared
    loads, the other's mma and softmax can take the issue slots.

Each tile's K and V are read from shared memory twice (once a team): 136 KB a tile instead of 68.
Measured on the H200 running this mma.sync code (RESULTS.md, session 12): 7.7% faster than
verify_mma2.py's kernel at 128k, t = 16, 8.8% at 200k, 10% at t = 64 and 10-11% on mixed batches,
even at 32k, but 4 us (15%) slower at 1k, which session 13 traced to the epilogue's reads of its
stage (16 wavefronts each; the stage is now laid out for them: 26 us at 1k, 3.8% less at 128k).
A first version without the loader (team 1 issuing
every copy, so that team 0 ran ahead) was 24% slower at 128k: the copies lengthened team 1's
chain, which set the pace; loading a tile's slot indices one tile ahead in the loader gave the
last 5-6%.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.ampere import mbarrier, mma_v2

from ._gluon_compat import cta_barrier
from .verify_attention import SPLIT_RUNTIME_INTS, _keys_of_program, _program_slice
from .verify_gluon import _online_softmax_step
from .verify_mma2 import (
    KN3_SH,
    KN_SH,
    KP3_SH,
    KP_SH,
    STAGE_SH,
    _blocks,
    _copy_rows,
    _q_starts,
    _row_starts,
    _s_of,
    _slots,
    _staged_store,
)

TEAM_ROWS = gl.constexpr(16)
TEAM_WARPS = 4  # the launch's num_warps: team 0, the default partition (team 1 and the loader come on top)
# S^T's partial sums of a team [column group, latents, rows] over [4, 1, 1] warps: warp g sums
# nope columns 128g .. 128g + 127 and rope columns 16g .. 16g + 15 for all 32 latents
ST3_L = gl.constexpr(gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1, 1], instr_shape=[1, 16, 8]))
K3_A = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=ST3_L, k_width=2))
Q3_B = gl.constexpr(gl.DotOperandLayout(operand_index=1, parent=ST3_L, k_width=2))
# the summed scores [rows, latents]: a warp owns 4 rows, each over 8 lanes
S_L = gl.constexpr(gl.BlockedLayout([1, 1], [4, 8], [4, 1], [1, 0]))
# a 128-column block of a team's O^T [columns, rows] over [4, 1] warps: 32 columns a warp
OT_L = gl.constexpr(gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1], instr_shape=[16, 8]))
VT_A = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=OT_L, k_width=2))
PT_B = gl.constexpr(gl.DotOperandLayout(operand_index=1, parent=OT_L, k_width=2))
KEY_S = gl.constexpr(gl.SliceLayout(0, S_L))
ROW_S = gl.constexpr(gl.SliceLayout(1, S_L))
ROW_O = gl.constexpr(gl.SliceLayout(0, OT_L))
# The loader's row copies over its 2 warps, 8 values a thread: each 16 lanes copy 256 bytes of one
# row of a nope block ([4, 32, 128]). The rope part, as verify_mma2.py holds it (four [32, 16]
# blocks), each 2 lanes 32 bytes of a block's row ([4, 32, 16]). ncu counts those copies at 4x
# their ideal shared-memory wavefronts, where each 8 lanes gather 32 bytes of 4 rows; the nope
# copies, 256 bytes of one row a 16 lanes, take none excess. The counts fit one wavefront for each
# line of the pool 8 lanes gather from (copying 16 rows of one block a warp, still 4 rows an 8
# lanes, left the count as it was: session 13).
LOADER_WARPS = gl.constexpr(2)
NOPE_ROWS = gl.constexpr(gl.BlockedLayout([1, 1, 8], [1, 2, 16], [1, 2, 1], [2, 1, 0]))
ROPE_ROWS = gl.constexpr(gl.BlockedLayout([1, 1, 8], [4, 4, 2], [1, 2, 1], [2, 1, 0]))
# ROPE_LINES (session 14; shipped in CONFIGS["sm120"] since session 15): a K buffer holds the rope part as
# [32, 64], one 128-byte row a latent with its 16-byte pieces swizzled over 8 rows (KPL_SH), so
# that each 8 lanes copy one whole line of the pool ([32, 64]); S^T reads the same bytes as four
# 16-column blocks through a linear layout (_rope_view).
ROPE_LINES_ROWS = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [2, 1], [1, 0]))
KPL_SH = gl.constexpr(gl.SwizzledSharedLayout(8, 1, 8, [1, 0]))
# a team's S^T partial sums: fp32 rows of 64 bytes, two a 128-byte line
SP_SH = gl.constexpr(gl.SwizzledSharedLayout(4, 2, 4, [1, 0]))
SP3_SH = gl.constexpr(gl.SwizzledSharedLayout(4, 2, 4, [2, 1, 0]))
# SUMS_XOR (session 14; shipped since session 15): the partial sums [4, 32 latents, 16 rows]
# in a linear (XOR) layout where neither the mma fragments' 64-bit stores nor the softmax's loads
# meet a bank twice. In SP3_SH a store takes 2 wavefronts where 1 would do (ncu, session 13: 2.17 M
# excess at 128k, t = 16), and no swizzle of that kind keeps the loads free too. Here the bank of
# (latent l, row n) is the word (n0, n1, l0, l1, n2 ^ l2): a store's half-warp spans n0-n2 and
# l0-l1, a load's warp n0-n1 and l0-l2. Each entry: the [group, latent, row] an offset bit is.
SP_XOR = gl.constexpr(gl.SharedLinearLayout(offset_bases=[
    [0, 0, 1], [0, 0, 2], [0, 1, 0], [0, 2, 0], [0, 0, 4], [0, 4, 4], [0, 0, 8], [0, 8, 0], [0, 16, 0], [1, 0, 0],
    [2, 0, 0]]))
# ... loaded as [4, rows, latents] with a thread's four groups in its registers: summed, S_L
S4_L = gl.constexpr(gl.BlockedLayout([4, 1, 1], [1, 4, 8], [1, 4, 1], [0, 2, 1]))
PT_SH = gl.constexpr(gl.SwizzledSharedLayout(8, 4, 2, [1, 0]))  # P^T: rows of 32 bytes, four a line
# the partial output's store: a warp writes 128 consecutive columns of one row
ST_BL = gl.constexpr(gl.BlockedLayout([4, 1], [32, 1], [1, 4], [0, 1]))
# ... read from the team's partial-sum buffer held as [rows, columns] (row-major, 16-byte pieces
# swizzled over 8 rows, verify_mma2.py's STAGE_SH): the O^T fragments' stores and those row
# reads meet no bank twice. Held as the partial sums are ([columns, rows]), each row read took 16
# wavefronts (ncu, session 13)
# registers a thread after setmaxnreg (the 12 warps start at 168): team 1 232, the loader's
# warpgroup (its 2 warps padded to 4) 56, team 0 (the default partition) what is left, 216
TEAMS_REGS = gl.constexpr(232)
LOADER_REGS = gl.constexpr(56)


@gluon.constexpr_function
def rope_lines_layout(rows):
    """The layout of _rope_view's [4, rows, 16] view of a rope part held as lines: (g, r, c) is
    value 16g + c of row r in KPL_SH, whose row r holds its 16-byte piece p at p ^ (r % 8).
    The swizzle is linear over the bits of an offset, so the view is a linear layout: the
    coordinates each offset bit stands for."""
    bases = [[0, 0, 1], [0, 0, 2], [0, 0, 4], [0, 0, 8], [1, 0, 0], [2, 0, 0]]  # in a row: p = 2g + c // 8
    for i in range(rows.bit_length() - 1):
        flipped = bases[3 + i] if i < 3 else [0, 0, 0]  # row bit i < 3 flips piece bit i
        bases.append([flipped[0], 1 << i, flipped[2]])
    return gl.SharedLinearLayout(offset_bases=bases)


@gluon.constexpr_function
def _rope_copies(rope_lines):
    """The loader's layout of the rope part's copies."""
    return ROPE_LINES_ROWS.value if rope_lines else ROPE_ROWS.value


@gluon.jit
def _rope_view(kp_buf, ROPE_LINES: gl.constexpr):
    """A K buffer's rope part as S^T's four 16-column blocks [4, rows, 16]."""
    if ROPE_LINES:
        view = kp_buf._reinterpret(kp_buf.dtype, [4, kp_buf.shape[0], 16], rope_lines_layout(kp_buf.shape[0]))
    else:
        view = _blocks(kp_buf, KP3_SH)
    return view


@gluon.jit
def _team_rope_view(kp_buf, TEAM: gl.constexpr, ROPE_LINES: gl.constexpr):
    """The team's 16 rows of a K buffer's rope part (Q's) as [4, 16, 16] (a linear layout's view
    is taken of the rows, as Gluon cannot slice it)."""
    if ROPE_LINES:
        # the rows as [teams, rows, 64] (a team's 16 rows keep the 8-row swizzle phases), indexed:
        # Triton 3.8 reinterprets no row slice of a buffer
        by_team = kp_buf._reinterpret(kp_buf.dtype, [2, TEAM_ROWS, 64], KPL_SH)
        view = _rope_view(by_team.index(TEAM), True)
    else:
        view = _rope_view(kp_buf, False).slice(TEAM * TEAM_ROWS, TEAM_ROWS, dim=1)
    return view


@gluon.jit
def _copy_counted(kn_buf, kp_buf, bar, starts, ROPE_LINES: gl.constexpr):
    """cp.async of 32 rows of 576 values (starts: their first values, in the loader's layouts)
    into a K buffer, counted on bar as they land."""
    if ROPE_LINES:
        kp_dst = kp_buf
    else:
        kp_dst = _blocks(kp_buf, KP3_SH)
    _copy_rows(_blocks(kn_buf, KN3_SH), kp_dst, starts, NOPE_ROWS, _rope_copies(ROPE_LINES))
    cp.mbarrier_arrive(bar, increment_count=False)


@gluon.jit
def _loader(kn_smem, kp_smem, ready, kfree, q_ready, q_done, Q, stride_qt, stride_qh, idx_ptr, k_base, k_stride,
            qo_start, pid_m, n_rows, lo, hi, is_draft, NUM_HEADS: gl.constexpr, BLOCK_N: gl.constexpr,
            ROPE_LINES: gl.constexpr):
    """Q into K buffer 1, tile 0 into buffer 0, then tile j into buffer j % 2 once both teams are
    done with tile j - 2 (with Q for j = 1). A tile's slot indices are loaded one tile ahead, so
    their latency is not on the way from a free buffer to its copies."""
    RR: gl.constexpr = _rope_copies(ROPE_LINES)
    slots_nx = _slots(idx_ptr, lo, hi, is_draft, BLOCK_N, NOPE_ROWS, RR)
    _copy_counted(kn_smem.index(1), kp_smem.index(1), q_ready,
                  _q_starts(Q, qo_start, pid_m, n_rows, stride_qt, stride_qh, NUM_HEADS, 32, NOPE_ROWS, RR), ROPE_LINES)
    n_tiles = gl.cdiv(hi - lo, BLOCK_N)
    for j in range(n_tiles):
        buf = j % 2
        n0 = lo + j * BLOCK_N
        slots = slots_nx
        slots_nx = _slots(idx_ptr, n0 + BLOCK_N, hi, is_draft, BLOCK_N, NOPE_ROWS, RR)
        mbarrier.wait(q_done, 0, pred=j == 1)
        mbarrier.wait(kfree.index(buf), ((j - 2) // 2) & 1, pred=j > 1)
        _copy_counted(kn_smem.index(buf), kp_smem.index(buf), ready.index(buf),
                      _row_starts(slots, k_base, k_stride, qo_start, n0, hi, is_draft, BLOCK_N, NOPE_ROWS, RR),
                      ROPE_LINES)


@gluon.jit
def _summed_scores(sp_smem, s3, SUMS_XOR: gl.constexpr, BLOCK_N: gl.constexpr):
    """S (rows x latents, in S_L) from S^T's four partial sums s3, through the team's buffer."""
    if SUMS_XOR:
        sp3 = sp_smem._reinterpret(gl.float32, [4, BLOCK_N, TEAM_ROWS], SP_XOR)
        sp3.store(s3)
        cta_barrier()  # this team's partial sums are in
        s = gl.convert_layout(gl.sum(sp3.permute((0, 2, 1)).load(S4_L), axis=0), S_L)
    else:
        _blocks(sp_smem, SP3_SH).store(s3)
        cta_barrier()
        s = (_s_of(sp_smem, 0, BLOCK_N, S_L) + _s_of(sp_smem, 1, BLOCK_N, S_L)) + \
            (_s_of(sp_smem, 2, BLOCK_N, S_L) + _s_of(sp_smem, 3, BLOCK_N, S_L))
    return s


@gluon.jit
def _team(TEAM: gl.constexpr, kn_smem, kp_smem, sp_all, pt_all, a_all, ready, kfree, q_ready, q_done,
          idx_ptr, pid_m, n_rows, lo, hi, is_draft,
          mask_rows, stride_mask, score_scale, o_scale, PART_O, PART_LSE, part_row0,
          NUM_HEADS: gl.constexpr, BLOCK_N: gl.constexpr, ROPE_LINES: gl.constexpr, SUMS_XOR: gl.constexpr):
    """Team TEAM's 16 rows over latents lo .. hi, and their partial result."""
    sp_smem = sp_all.index(TEAM)
    pt_smem = pt_all.index(TEAM)
    a_smem = a_all.index(TEAM)
    n_tiles = gl.cdiv(hi - lo, BLOCK_N)
    mbarrier.wait(q_ready, 0)
    q_view = _blocks(kn_smem.index(1), KN3_SH).slice(TEAM * TEAM_ROWS, TEAM_ROWS, dim=1)
    qp_view = _team_rope_view(kp_smem.index(1), TEAM, ROPE_LINES)
    qt_n = q_view.permute((0, 2, 1)).load(Q3_B)
    qt_r = qp_view.permute((0, 2, 1)).load(Q3_B)
    cta_barrier()  # (this team's warps)
    mbarrier.arrive(q_done)  # K buffer 1 may take tile 1

    rows_s = pid_m * 32 + TEAM * TEAM_ROWS + gl.arange(0, TEAM_ROWS, layout=ROW_S)
    row_ok = rows_s < n_rows
    mask_row = mask_rows + (rows_s // NUM_HEADS).to(gl.int64) * stride_mask
    m_i = gl.full([TEAM_ROWS], float("-inf"), gl.float32, layout=ROW_S)
    l_i = gl.full([TEAM_ROWS], 0.0, gl.float32, layout=ROW_S)
    zero_o = gl.zeros([128, TEAM_ROWS], gl.float32, layout=OT_L)
    acc0 = zero_o
    acc1 = zero_o
    acc2 = zero_o
    acc3 = zero_o
    for j in range(n_tiles):
        buf = j % 2
        n0 = lo + j * BLOCK_N
        kn = kn_smem.index(buf)
        kp = kp_smem.index(buf)
        mbarrier.wait(ready.index(buf), (j // 2) & 1)
        s3 = mma_v2(_blocks(kn, KN3_SH).load(K3_A), qt_n, gl.zeros([4, BLOCK_N, TEAM_ROWS], gl.float32, layout=ST3_L))
        s3 = mma_v2(_rope_view(kp, ROPE_LINES).load(K3_A), qt_r, s3)
        s = _summed_scores(sp_smem, s3, SUMS_XOR, BLOCK_N)
        p, alpha, m_i, l_i = _online_softmax_step(s, n0, hi, is_draft, mask_row, row_ok, score_scale, m_i, l_i,
                                                  BLOCK_N, KEY_S)
        pt_smem.permute((1, 0)).store(p.to(gl.bfloat16))
        a_smem.store(alpha)
        cta_barrier()
        pt = pt_smem.load(PT_B)
        a = a_smem.load(ROW_O)[None, :]
        acc0 = mma_v2(kn.slice(0, BLOCK_N).permute((1, 0)).load(VT_A), pt, acc0 * a)
        acc1 = mma_v2(kn.slice(BLOCK_N, BLOCK_N).permute((1, 0)).load(VT_A), pt, acc1 * a)
        acc2 = mma_v2(kn.slice(2 * BLOCK_N, BLOCK_N).permute((1, 0)).load(VT_A), pt, acc2 * a)
        acc3 = mma_v2(kn.slice(3 * BLOCK_N, BLOCK_N).permute((1, 0)).load(VT_A), pt, acc3 * a)
        cta_barrier()  # this team's reads of tile j are done
        mbarrier.arrive(kfree.index(buf))

    # -- partial result of this team's rows: normalised output and log2-sum-exp2 --
    has = l_i > 0.0
    lse2 = gl.where(has, m_i + gl.log2(gl.where(has, l_i, 1.0)), float("-inf"))
    scale = gl.convert_layout(o_scale / gl.where(has, l_i, 1.0), ROW_O)[None, :]
    rows_o = pid_m * 32 + TEAM * TEAM_ROWS + gl.arange(0, TEAM_ROWS, layout=gl.SliceLayout(0, ST_BL))
    part = part_row0 + rows_o
    ok = (rows_o < n_rows)[None, :]
    cols = gl.arange(0, 128, layout=gl.SliceLayout(1, ST_BL))[:, None]
    # each block through the team's partial-sum buffer (the same 8 KB, as [16, 128] floats), as a
    # warp writes 128 consecutive columns of a row: a layout conversion would take 8 KB more a team
    stage = sp_smem._reinterpret(gl.float32, [TEAM_ROWS, 128], STAGE_SH).permute((1, 0))
    _staged_store(stage, acc0 * scale, PART_O + part[None, :] * 512 + cols, ok, ST_BL)
    _staged_store(stage, acc1 * scale, PART_O + part[None, :] * 512 + 128 + cols, ok, ST_BL)
    _staged_store(stage, acc2 * scale, PART_O + part[None, :] * 512 + 256 + cols, ok, ST_BL)
    _staged_store(stage, acc3 * scale, PART_O + part[None, :] * 512 + 384 + cols, ok, ST_BL)
    gl.store(PART_LSE + part_row0 + rows_s, lse2, mask=row_ok)


@gluon.jit(do_not_specialize=SPLIT_RUNTIME_INTS)
def _verify_split_kernel_teams(
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
    ROPE_LINES: gl.constexpr = False,
    SUMS_XOR: gl.constexpr = False,
):
    gl.static_assert(BLOCK_M == 32)
    gl.static_assert(BLOCK_N == 32)
    gl.static_assert(gl.num_warps() == 4)  # team 0; team 1 and the loader are the worker partitions
    gl.static_assert(KV.dtype.element_ty == gl.bfloat16)  # bf16 pools (fp8 ones run verify_mma2.py's kernel)
    gl.static_assert(TEAM_ROWS % 8 == 0)  # (a team's rows of a swizzled rope buffer keep its 8-row phases)

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
    idx_ptr = KV_INDICES + kv_start
    lo, hi, k_base, k_stride = _keys_of_program(is_draft, t_b, lo, hi, K_EXT, KV, stride_kext, stride_kv)
    # the pool's scales: scores of pool keys count k_scale times, their values v_scale times
    score_scale = gl.where(is_draft, qk_scale, qk_scale * k_scale)
    o_scale = gl.where(is_draft, 1.0, v_scale)

    kn_smem = gl.allocate_shared_memory(gl.bfloat16, [2, 4 * BLOCK_N, 128], KN_SH)
    if ROPE_LINES:
        kp_smem = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, 64], KPL_SH)
    else:
        kp_smem = gl.allocate_shared_memory(gl.bfloat16, [2, 4 * BLOCK_N, 16], KP_SH)
    # each team's S^T partial sums, P^T and row scales
    sp_all = gl.allocate_shared_memory(gl.float32, [2, 4 * BLOCK_N, TEAM_ROWS], SP_SH)
    pt_all = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, TEAM_ROWS], PT_SH)
    a_all = gl.allocate_shared_memory(gl.float32, [2, TEAM_ROWS], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    kfree = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_done = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(ready.index(i), count=32 * LOADER_WARPS)  # one cp.async arrive per loader thread
        mbarrier.init(kfree.index(i), count=2)  # both teams
    mbarrier.init(q_ready, count=32 * LOADER_WARPS)
    mbarrier.init(q_done, count=2)
    cta_barrier()

    part_row0 = pid_s.to(gl.int64) * rows_max
    # (the partitions' arguments written out: a tuple held in a variable turns constexprs into tensors)
    gl.warp_specialize([
        (_team, (0, kn_smem, kp_smem, sp_all, pt_all, a_all, ready, kfree, q_ready, q_done, idx_ptr, pid_m,
                 n_rows, lo, hi, is_draft, mask_rows, stride_mask, score_scale, o_scale, PART_O, PART_LSE, part_row0,
                 NUM_HEADS, BLOCK_N, ROPE_LINES, SUMS_XOR)),
        (_team, (1, kn_smem, kp_smem, sp_all, pt_all, a_all, ready, kfree, q_ready, q_done, idx_ptr, pid_m,
                 n_rows, lo, hi, is_draft, mask_rows, stride_mask, score_scale, o_scale, PART_O, PART_LSE, part_row0,
                 NUM_HEADS, BLOCK_N, ROPE_LINES, SUMS_XOR)),
        (_loader, (kn_smem, kp_smem, ready, kfree, q_ready, q_done, Q, stride_qt, stride_qh, idx_ptr, k_base,
                   k_stride, qo_start, pid_m, n_rows, lo, hi, is_draft, NUM_HEADS, BLOCK_N, ROPE_LINES)),
    ], [4, LOADER_WARPS], [TEAMS_REGS, LOADER_REGS])
