"""CPU: mask packing (SGLang's bool custom_mask -> bit-packed tree mask), tree helpers, and the
launcher's validation errors (raised before any kernel starts)."""
import dataclasses
import importlib

import pytest
import torch
from cases import SM_SCALE, make_case, sglang_custom_mask

va = importlib.import_module("dflash_kernels.verify_attention")
# sm_90's lock-step Gluon kernel (the sweeps' gluon-n64): it reads unscaled bf16 pools only
LOCK_STEP = va.VerifyConfig(64, 64, 8, 1, 64, gluon=True)


def test_pack_custom_mask_matches_per_request_blocks():
    case = make_case([100, 0, 5000, 3], [16, 5, 64, 1], 8, mask="tree", device="cpu", max_q_len=64)
    cm, mi = sglang_custom_mask(case)
    packed = va.pack_custom_mask(cm, mi, case["qo_indptr"], case["kv_indptr"], 64, num_tokens=case["q"].shape[0])
    assert packed.dtype == torch.int32 and packed.shape == (86, 2)
    assert torch.equal(packed, case["tree_mask"])
    # and the bits are the mask: unpack row by row
    r = 0
    for blk in case["blocks"]:
        t = blk.shape[0]
        for i in range(t):
            bits = [(int(packed[r, j // 32]) >> (j % 32)) & 1 for j in range(64)]
            assert bits[:t] == blk[i].int().tolist() and not any(bits[t:])
            r += 1


def test_bit_31_and_word_boundary():
    blk = torch.zeros(40, 40, dtype=torch.bool)
    blk[39, 31] = blk[39, 32] = blk[39, 39] = True
    packed = va.pack_tree_masks([blk], 40)
    assert int(packed[39, 0]) == -(2**31)  # bit 31 set: the int32 is negative
    assert int(packed[39, 1]) == (1 << 0) | (1 << 7)


def test_tree_from_parents():
    chain = torch.tensor([-1] + list(range(15)))
    assert torch.equal(va.tree_mask_from_parents(chain), va.chain_tree_mask(16))
    m = va.tree_mask_from_parents(torch.tensor([-1, 0, 0, 1, 2]))
    assert m[3].tolist() == [True, True, False, True, False]
    assert m[4].tolist() == [True, False, True, False, True]
    with pytest.raises(ValueError):
        va.tree_mask_from_parents(torch.tensor([-1, 2, 0]))
    gen = torch.Generator().manual_seed(0)
    par = va.random_tree_parents(64, gen)
    m = va.tree_mask_from_parents(par)
    assert m.diagonal().all() and not torch.triu(m, 1).any()


def test_workspace_shapes():
    so, sl, sp = va.workspace_shape(batch=3, num_heads=8, max_q_len=16, num_splits=10)
    assert so == (16, 128, 512) and sl == (16, 128) and sp == (16, 4)
    assert va.default_num_splits(132, 1, 2) == 66
    assert va.default_num_splits(132, 1, 8) == 16


@pytest.fixture
def args(monkeypatch):
    monkeypatch.setattr(va, "_CPU_TENSORS_OK", True)  # lets CPU tensors reach the checks
    case = make_case([10, 3], [4, 2], 8, device="cpu")
    return [case[k] for k in ("q", "k_extend", "kv_cache", "kv_indices", "kv_indptr", "qo_indptr", "tree_mask")]


def test_validation_errors(args):
    q, ke, kv, idx, kvp, qop, tm = args
    with pytest.raises(TypeError, match="q: expected bfloat16"):
        va.verify_attention(q.float(), ke, kv, idx, kvp, qop, tm, SM_SCALE)
    with pytest.raises(ValueError, match=r"q: expected \(num_tokens, num_heads, 576\)"):
        va.verify_attention(q[..., :512], ke, kv, idx, kvp, qop, tm, SM_SCALE)
    with pytest.raises(ValueError, match="kv_cache"):
        va.verify_attention(q, ke, kv[:, :512], idx, kvp, qop, tm, SM_SCALE)
    with pytest.raises(ValueError, match="k_extend"):
        va.verify_attention(q, ke[:-1], kv, idx, kvp, qop, tm, SM_SCALE)
    with pytest.raises(TypeError, match="kv_cache: expected one of"):
        va.verify_attention(q, ke, kv.half(), idx, kvp, qop, tm, SM_SCALE)
    with pytest.raises(TypeError, match="k_extend: expected bfloat16"):
        va.verify_attention(q, ke.to(torch.float8_e4m3fn), kv.to(torch.float8_e4m3fn), idx, kvp, qop, tm, SM_SCALE)
    with pytest.raises(ValueError, match="_verify_split_kernel_gluon reads an unscaled bfloat16 pool"):
        va.verify_attention(q, ke, kv.to(torch.float8_e4m3fn), idx, kvp, qop, tm, SM_SCALE, config=LOCK_STEP)
    with pytest.raises(ValueError, match="_verify_split_kernel_gluon reads an unscaled bfloat16 pool"):
        va.verify_attention(q, ke, kv, idx, kvp, qop, tm, SM_SCALE, config=LOCK_STEP, k_scale=0.5)
    with pytest.raises(TypeError, match="kv_indices"):
        va.verify_attention(q, ke, kv, idx.float(), kvp, qop, tm, SM_SCALE)
    with pytest.raises(TypeError, match="kv_indptr"):
        va.verify_attention(q, ke, kv, idx, kvp.long(), qop, tm, SM_SCALE)
    with pytest.raises(ValueError, match="batch"):
        va.verify_attention(q, ke, kv, idx, kvp[:2], qop, tm, SM_SCALE)
    with pytest.raises(ValueError, match="tree_mask"):
        va.verify_attention(q, ke, kv, idx, kvp, qop, tm[:3], SM_SCALE)
    with pytest.raises(ValueError, match="out"):
        va.verify_attention(q, ke, kv, idx, kvp, qop, tm, SM_SCALE, out=torch.empty(6, 8, 576, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="lse"):
        va.verify_attention(q, ke, kv, idx, kvp, qop, tm, SM_SCALE, lse=torch.empty(6, 8, dtype=torch.float16))
    with pytest.raises(ValueError, match="workspace"):
        va.verify_attention(q, ke, kv, idx, kvp, qop, tm, SM_SCALE, max_q_len=4, num_splits=4,
                            workspace=va.alloc_workspace(2, 8, 4, 5, "cpu"))
    # index tensors are read at base + i: a strided view is refused, not read as other entries
    with pytest.raises(ValueError, match="kv_indices: expected a contiguous tensor"):
        va.verify_attention(q, ke, kv, torch.stack([idx, idx], 1)[:, 0], kvp, qop, tm, SM_SCALE)
    with pytest.raises(ValueError, match="qo_indptr: expected a contiguous tensor"):
        va.verify_attention(q, ke, kv, idx, kvp, torch.stack([qop, qop], 1)[:, 0], tm, SM_SCALE)
    # draft lengths beyond max_q_len would leave rows unwritten and overrun the workspace: 6
    # tokens in 2 requests need max_q_len >= 3 (and max_q_len 0 is no width at all)
    for too_small in (0, 2):
        with pytest.raises(ValueError, match=f"max_q_len={too_small}: every request's draft length"):
            va.verify_attention(q, ke, kv, idx, kvp, qop, tm, SM_SCALE, max_q_len=too_small)
    # partial outputs are what the config stores: float32 here (the interpreter's config), bf16
    # with partials_bf16 (sm_90's), and the kernels are built for that one dtype
    part_o, part_lse, plan_buf = va.alloc_workspace(2, 8, 4, 4, "cpu")
    assert part_o.dtype == torch.float32
    with pytest.raises(ValueError, match="workspace: expected contiguous float32"):
        va.verify_attention(q, ke, kv, idx, kvp, qop, tm, SM_SCALE, max_q_len=4, num_splits=4,
                            workspace=(part_o.bfloat16(), part_lse, plan_buf))
    assert va.alloc_workspace(2, 8, 4, 4, "cpu", config=va.CONFIGS["sm90"])[0].dtype == torch.bfloat16


def test_cuda_required_outside_interpreter():
    case = make_case([10], [4], 8, device="cpu")
    if va._INTERPRET:
        pytest.skip("interpreter mode")
    with pytest.raises(ValueError, match="CUDA"):
        va.verify_attention(case["q"], case["k_extend"], case["kv_cache"], case["kv_indices"], case["kv_indptr"],
                            case["qo_indptr"], case["tree_mask"], SM_SCALE)


def test_gluon_archs_fall_back_to_the_triton_kernel_without_gluon(monkeypatch):
    """A Triton whose Gluon API differs must not break verify on sm_90 or sm_120: the
    Triton-language kernel serves instead (the Gluon modules are imported once, here made to
    fail)."""
    real_import = va.importlib.import_module

    def failing_import(name, package=None):
        if name.endswith("verify_gluon"):
            raise ImportError("cannot import name 'warpgroup_mma' (a different Triton)")
        return real_import(name, package)

    monkeypatch.setattr(va, "_GLUON_OK", None)
    monkeypatch.setattr(va.importlib, "import_module", failing_import)
    assert va.config_for_arch(9, 0) == va.SM90_TRITON and not va.SM90_TRITON.gluon
    # sm_120 falls back to a Triton-language tile for each pool dtype (fp8 staging needs a smaller one)
    assert va.config_for_arch(12, 0) == va.SM120_TRITON and not va.SM120_TRITON.mma2
    assert va.config_for_arch(12, 0, torch.float8_e4m3fn) == va.SM120_TRITON_FP8 != va.SM120_TRITON
    monkeypatch.setattr(va, "_GLUON_OK", None)
    monkeypatch.setattr(va.importlib, "import_module", real_import)
    assert va.config_for_arch(9, 0) == va.CONFIGS["sm90"] and va.CONFIGS["sm90"].gluon  # Triton 3.6 here
    assert va.config_for_arch(12, 0) == va.CONFIGS["sm120"] and va.CONFIGS["sm120"].mma2


def test_every_pool_runs_the_shipped_kernels():
    """Each arch's kernels read scaled pools, and each arch's one config reads fp8 pools too (on
    sm_90 the Gluon kernel's loader widens an fp8 pool's rows, session 8; on sm_120 all the warps
    of its 8-warp kernel do, session 10). sm_90's lock-step Gluon kernel reads unscaled bf16 only (the launcher refuses
    it other pools: test_validation_errors)."""
    for cfg in (va.CONFIGS["sm90"], va.SM90_TRITON, va.CONFIGS["sm120"], va.SM120_TRITON, va.SM120_TRITON_FP8,
                va.CONFIGS["sm80"]):
        assert va.takes_scales(va.split_kernel(cfg, 8)[0]), cfg
        assert va.takes_scales(va.split_kernel(cfg, 8, fp8_pool=True)[0]), cfg
    # sm_90: bf16 pools run 64-latent tiles in two buffers, S_j in its own iteration, 256 S-group
    # columns and Q and P in shared memory (session 28); a config with Q's first 384 columns and P
    # in registers (sessions 13 and 27) runs them for bf16 pools only. fp8 pools run the config's
    # tiles, buffers and S placement with 256 columns and Q and P in shared memory (session 29)
    _, bf16_const, _ = va.split_kernel(va.CONFIGS["sm90"], 8)
    assert (bf16_const["BLOCK_N"], bf16_const["NUM_STAGES"], bf16_const["S_AHEAD"]) == (64, 2, False)
    assert (bf16_const["S_COLS"], bf16_const["Q_REGS"], bf16_const["P_REGS"]) == (256, 0, False)
    q_in_registers = va.VerifyConfig(64, 32, 4, 4, 64, gluon=True, warp_specialized=True, s_cols=128, q_regs=3,
                                     p_regs=True)
    _, q_const, _ = va.split_kernel(q_in_registers, 8)
    assert (q_const["S_COLS"], q_const["Q_REGS"], q_const["P_REGS"]) == (128, 3, True)
    for cfg, layout in ((va.CONFIGS["sm90"], (64, 2, False)), (q_in_registers, (32, 4, True))):
        _, fp8_const, _ = va.split_kernel(cfg, 8, fp8_pool=True)
        assert (fp8_const["BLOCK_N"], fp8_const["NUM_STAGES"], fp8_const["S_AHEAD"]) == layout
        assert (fp8_const["S_COLS"], fp8_const["Q_REGS"], fp8_const["P_REGS"]) == (256, 0, False)
    # sm_120: bf16 pools run the two-team kernel (4 warps at launch, 12 in all), fp8 pools the
    # 8-warp kernel, which widens their tiles (session 12)
    teams, _, teams_opts = va.split_kernel(va.CONFIGS["sm120"], 8)
    mma2, _, mma2_opts = va.split_kernel(va.CONFIGS["sm120"], 8, fp8_pool=True)
    assert (teams.__name__, teams_opts["num_warps"]) == ("_verify_split_kernel_teams", 4)
    assert (mma2.__name__, mma2_opts["num_warps"]) == ("_verify_split_kernel_mma2", 8)
    for fp8 in (torch.float8_e4m3fn, torch.float8_e5m2):
        assert va.config_for_arch(12, 0, fp8) == va.config_for_arch(12, 0) == va.CONFIGS["sm120"]
        assert va.config_for_arch(9, 0, fp8) == va.config_for_arch(9, 0) == va.CONFIGS["sm90"]
        assert va.config_for_arch(8, 9, fp8) == va.config_for_arch(8, 9) == va.CONFIGS["sm80"]
    assert va.config_for_arch(12, 0) == va.config_for_arch(12, 0, torch.bfloat16) == va.CONFIGS["sm120"]
    assert not va.takes_scales(va.split_kernel(LOCK_STEP, 8)[0])
    assert va.is_plain_pool(torch.bfloat16) and not va.is_plain_pool(torch.float8_e4m3fn)
    assert not va.is_plain_pool(torch.bfloat16, k_scale=0.5) and not va.is_plain_pool(torch.bfloat16, v_scale=2.0)


@pytest.mark.parametrize("fields, message", [
    (dict(s_cols=64), "s_cols must be 128 or 256"),
    (dict(q_regs=4, s_cols=128), "q_regs 0, 1, 2 or 3"),
    (dict(q_regs=1), "q_regs needs s_cols=128"),
    (dict(num_stages=2), "s_ahead needs num_stages >= 3"),
])
def test_sm90_layout_fields_are_checked(fields, message):
    """The S group's column count and Q's registers (session 13), and S issued ahead with too few
    buffers (session 28): values the kernel has no code, registers or buffers for are refused with
    what to set, before anything compiles."""
    base = dict(block_m=64, block_n=32, num_warps=4, num_stages=4, min_chunk=64, gluon=True, warp_specialized=True)
    with pytest.raises(ValueError, match=message):
        va.VerifyConfig(**{**base, **fields})
    for ws_only in (dict(s_cols=128), dict(p_regs=True), dict(s_ahead=False)):
        with pytest.raises(ValueError, match="warp_specialized=True"):
            va.VerifyConfig(32, 32, 8, 2, mma2=True, **ws_only)
    assert va.VerifyConfig(**base, s_cols=128, q_regs=2).q_regs == 2
    assert not va.VerifyConfig(**dict(base, block_n=64, num_stages=2), s_ahead=False).s_ahead
    for teams_only in ("rope_lines", "sums_xor"):  # layouts of the two-team kernel's
        with pytest.raises(ValueError, match="teams=True"):
            va.VerifyConfig(32, 32, 8, 2, mma2=True, **{teams_only: True})


def test_merge_tile_follows_the_mean_partials():
    """Float32 partials: up to 32 a request (slices plus the draft block) a program per row
    pipelines 8 at a time; more are fetched in one memory round trip by the tile whose chunk holds
    them; more than any chunk holds loops. A config's own tile wins, and a plain tuple becomes a
    MergeTile."""
    cfg = dataclasses.replace(va.CONFIGS["sm90"], partials_bf16=False)
    rows = va.MergeTile(512, 8, 4)
    assert va.merge_tile(cfg, 66, 1) == va.MergeTile(64, 128, 1)  # 67: sm_90 at t = 16 on 132 SMs
    assert va.merge_tile(cfg, 33, 1) == va.MergeTile(64, 64, 1)  # 34: sm_120's 32-row blocks there
    assert va.merge_tile(cfg, 16, 1) == rows  # 17: t = 64
    assert va.merge_tile(cfg, 66, 8) == rows  # about 10 a request
    assert va.merge_tile(cfg, 31, 1) == rows and va.merge_tile(cfg, 32, 1) == va.MergeTile(64, 64)  # 32 | 33
    assert va.merge_tile(cfg, 400, 1) == va.MergeTile(64, 128)
    own = dataclasses.replace(cfg, merge_tile=(128, 8))
    assert va.merge_tile(own, 66, 1) == va.MergeTile(128, 8, 1) and own.merge_tile.stages == 1
    assert va.merge_kernel(8, False, rows, cfg)[2]["num_stages"] == 4


def test_bf16_partials_take_their_own_merge_tiles():
    """With bf16 partials the merge runs over half the warps, and from 33 to 64 partials 128 x 64 in
    two stages replaces 64 x 64 (RESULTS.md, session 32); the float32 table stays for float32
    partials, and the ahead-of-time build's list follows each config's table."""
    f32, b16 = (dataclasses.replace(va.CONFIGS["sm90"], partials_bf16=flag) for flag in (False, True))
    rows = va.MergeTile(512, 8, 4)
    assert va.merge_tile(b16, 66, 8) == va.merge_tile(b16, 16, 1) == va.merge_tile(b16, 66, 3) == rows  # 10, 17, 24
    assert va.merge_tile(b16, 66, 2) == va.MergeTile(128, 64, 2)  # 34.5: bs = 2
    assert va.merge_tile(f32, 66, 2) == va.MergeTile(64, 64, 1)
    assert va.merge_tile(b16, 33, 1) == va.MergeTile(128, 64, 2)  # 34: sm_120's 32-row blocks
    assert va.merge_tile(b16, 31, 1) == rows and va.merge_tile(b16, 32, 1) == va.MergeTile(128, 64, 2)  # 32 | 33
    assert va.merge_tile(b16, 66, 1) == va.MergeTile(64, 128, 1) == va.merge_tile(f32, 66, 1)  # 67
    assert va.merge_tiles(b16) == (rows, va.MergeTile(128, 64, 2), va.MergeTile(64, 128))
    assert va.merge_tiles(dataclasses.replace(b16, merge_tile=(64, 8))) == (va.MergeTile(64, 8),)
    assert va.merge_kernel(8, False, va.MergeTile(128, 64, 2), b16)[2] == dict(
        num_warps=va.MERGE_NUM_WARPS // 2, num_stages=2)


@pytest.mark.parametrize("cfg", [*va.CONFIGS.values(), va.SM90_TRITON, va.SM120_TRITON, va.SM120_TRITON_FP8,
                                 LOCK_STEP], ids=str)
def test_split_and_merge_cut_a_lone_requests_slices_alike(cfg):
    """A lone request's split programs cut their slices by their kernel's BLOCK_N and MIN_CHUNK
    and the merge counts them by its own (_request_slots): the two must agree for every pool."""
    for fp8_pool in (False, True):
        _, split_const, _ = va.split_kernel(cfg, 8, fp8_pool=fp8_pool)
        for tile in va.merge_tiles(cfg):
            _, merge_const, _ = va.merge_kernel(8, False, tile, cfg)
            for name in ("BLOCK_N", "MIN_CHUNK"):
                assert split_const[name] == merge_const[name], (fp8_pool, tile, name)


def test_dependent_launch_needs_sm90():
    """VerifyConfig.pdl on an older GPU (here the CPU interpreter's stand-in, sm_80) says what to do
    instead of failing in ptxas."""
    case = make_case([10], [4], 8, device="cpu")
    with pytest.raises(ValueError, match="pdl=1 .*needs sm_90 or later.*set pdl=0"):
        va.plan(case["q"], 1, 4, None, dataclasses.replace(va.CONFIGS["sm80"], pdl=1))
    with pytest.raises(ValueError, match="pdl must be 0"):
        dataclasses.replace(va.CONFIGS["sm90"], pdl=4)
