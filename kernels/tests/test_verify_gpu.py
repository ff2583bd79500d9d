"""GPU correctness: against a float32 torch reference and SGLang's own extend_attention_fwd,
on fresh random inputs every run, with the output poisoned (NaN) before each call."""
import dataclasses
import importlib

import pytest
import torch
from cases import SM_SCALE, load_peer, make_case, rel_err, run_peer

va = importlib.import_module("dflash_kernels.verify_attention")
pytestmark = pytest.mark.gpu

# bf16 inputs, bf16 P in the P.V product and a bf16 output: the error against float32 lands
# between 1e-3 and 1e-2 (METHOD.md's band for bf16 operands); 1e-2 is the bound.
TOL = 1e-2
LSE_ATOL = 2e-3  # lse is ~log(L); computed in float32 from exact bf16 products


def _run(case, num_splits=None, config=None, with_lse=True, **options):
    """One launch on the case, output and lse poisoned first; options (the pool's scales,
    block_mask) go to the launcher."""
    n, h = case["q"].shape[:2]
    out = torch.full((n, h, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((n, h), float("nan"), dtype=torch.float32, device="cuda") if with_lse else None
    va.verify_attention(case["q"], case["k_extend"], case["kv_cache"], case["kv_indices"],
                        case["kv_indptr"], case["qo_indptr"], case["tree_mask"], SM_SCALE,
                        out=out, lse=lse, max_q_len=case["max_q_len"], num_splits=num_splits,
                        config=config, **options)
    return out, lse


def _check(case, out, lse, **scales):
    ref_o, ref_lse = va.reference_verify_attention(
        case["q"], case["k_extend"], case["kv_cache"], case["kv_indices"], case["kv_indptr"],
        case["qo_indptr"], case["blocks"], SM_SCALE, **scales)
    assert not torch.isnan(out).any(), "unwritten or NaN output"
    err = rel_err(out, ref_o)
    assert err < TOL, f"relative error {err:.2e}"
    if lse is not None:
        assert not torch.isnan(lse).any()
        assert torch.allclose(lse, ref_lse, atol=LSE_ATOL, rtol=0), \
            f"lse max abs err {(lse - ref_lse).abs().max():.2e}"
    return err


@pytest.mark.parametrize("t", [1, 16, 64])
@pytest.mark.parametrize("h", [8, 16])
@pytest.mark.parametrize("mask", ["chain", "tree"])
def test_single_request_vs_reference(t, h, mask):
    for L in (0, 1, 777, 4096, 33000):
        case = make_case([L], [t], h, mask=mask)
        _check(case, *_run(case))


@pytest.mark.parametrize("h", [8, 16])
def test_long_prefix_vs_reference(h):
    case = make_case([200_000], [16], h, mask="tree")
    _check(case, *_run(case))


@pytest.mark.parametrize("t", [1, 16, 64])
def test_mixed_batch_vs_reference(t):
    lens = [0, 5, 1000, 70_000, 31, 12_345, 200_000, 256]
    ts = [t, max(1, t // 2), t, 1, t, max(1, t - 3), t, t]
    case = make_case(lens, ts, 8, mask="tree")
    _check(case, *_run(case))


@pytest.mark.parametrize("page_size", [16, 64])
def test_paged_pool(page_size):
    case = make_case([3000, 50_000, 17], [16, 16, 16], 8, mask="tree", page_size=page_size)
    _check(case, *_run(case))


@pytest.mark.parametrize("config", [None, "sm120"])
@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_int64_indices_and_no_lse(kv_dtype, config):
    """SGLang's own index dtype through each arch's kernels (sm_120's narrow the slots to int32
    in registers): slices ending mid-tile, pool slots above 2**16."""
    scales = dict(k_scale=0.37, v_scale=1.9) if kv_dtype != torch.bfloat16 else {}
    case = make_case([9000, 100, 70_001], [16, 7, 16], 16, mask="tree", idx_dtype=torch.int64, kv_dtype=kv_dtype)
    assert int(case["kv_indices"].max()) > 2**16
    out, _ = _run(case, with_lse=False, config=config and va.CONFIGS[config], **scales)
    _check(case, out, None, **scales)


def test_unused_pool_slots_hold_nan():
    """Pool slots no request references may hold anything (a pool allocated with torch.empty,
    stale slots): fill them, slot 0 included, with NaN. Slices end mid-tile (lengths not
    multiples of 64), so the last tile of a slice has rows past its end."""
    case = make_case([1000, 77, 30_001], [16, 5, 16], 8, mask="tree", pool_extra=4096)
    kv, idx = case["kv_cache"], case["kv_indices"]
    used = torch.zeros(kv.shape[0], dtype=torch.bool, device="cuda")
    used[idx.long()] = True
    free = int(torch.nonzero(~used)[0])
    kv[free] = kv[0]  # move whatever uses slot 0 elsewhere, so slot 0 is unused
    idx[idx == 0] = free
    used[free], used[0] = True, False
    kv[~used] = float("nan")
    _check(case, *_run(case))


@pytest.mark.parametrize("num_splits", [1, 3, 200])
def test_split_counts(num_splits):
    case = make_case([40_000, 64], [16, 16], 8, mask="tree")
    _check(case, *_run(case, num_splits=num_splits))


@pytest.mark.parametrize("t", [1, 16, 64])
@pytest.mark.parametrize("h", [8, 16])
def test_vs_sglang(t, h):
    peer = load_peer()
    if peer is None:
        pytest.skip("SGLang peer kernels not fetched (fetch_peer.sh)")
    lens = [20_000, 3, 150_000] if t < 64 else [20_000, 3, 60_000]
    case = make_case(lens, [t, t, t], h, mask="tree")
    ours, _ = _run(case)
    theirs = torch.full_like(ours, float("nan"))
    run_peer(peer, case, theirs)
    ref_o, _ = va.reference_verify_attention(
        case["q"], case["k_extend"], case["kv_cache"], case["kv_indices"], case["kv_indptr"],
        case["qo_indptr"], case["blocks"], SM_SCALE)
    assert not torch.isnan(theirs).any()
    e_peer, e_ours, e_between = rel_err(theirs, ref_o), rel_err(ours, ref_o), rel_err(ours, theirs)
    print(f"t={t} h={h}: peer vs ref {e_peer:.2e}, ours vs ref {e_ours:.2e}, ours vs peer {e_between:.2e}")
    assert e_ours < TOL and e_between < TOL


@pytest.mark.parametrize("config", [None, "sm120"])
@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_pool_vs_reference_and_sglang(kv_dtype, config):
    """An fp8 pool with SGLang's k/v scales. Ours widens the pool to bf16 (exact), so it is held
    to the bf16 bound; SGLang's extend kernel casts q and P to fp8 as well, so against it the
    claim is only that ours is the closer of the two to the float32 reference."""
    scales = dict(k_scale=0.37, v_scale=1.9)
    case = make_case([20_000, 3, 70_000], [16, 16, 16], 8, mask="tree", kv_dtype=kv_dtype)
    ours, lse = _run(case, config=config and va.CONFIGS[config], **scales)
    e_ours = _check(case, ours, lse, **scales)
    peer = load_peer()
    if peer is None:
        pytest.skip("SGLang peer kernels not fetched (fetch_peer.sh)")
    theirs = run_peer(peer, case, torch.full_like(ours, float("nan")), **scales)
    ref_o, _ = va.reference_verify_attention(
        case["q"], case["k_extend"], case["kv_cache"], case["kv_indices"], case["kv_indptr"],
        case["qo_indptr"], case["blocks"], SM_SCALE, **scales)
    e_peer = rel_err(theirs, ref_o)
    print(f"{kv_dtype}: peer vs ref {e_peer:.2e}, ours vs ref {e_ours:.2e}")
    assert not torch.isnan(theirs).any() and e_ours <= e_peer


# sm_90's layout of sessions 4-12: 32-latent tiles in four buffers, S ahead, which fp8 pools ran
# until session 29 (their loader's four-buffer order: the next tile's copies, then the widening)
FOUR_BUFFERS = va.VerifyConfig(64, 32, 4, 4, 64, gluon=True, warp_specialized=True)


@pytest.mark.parametrize("config", [None, FOUR_BUFFERS], ids=["shipped", "four-buffers"])
@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16])
def test_scaled_pool_every_shape(kv_dtype, config):
    """Pools with scales through the shapes the candidates' test covers (t = 64 trees across a
    mask word, a request with no prefix, t = 1, slices ending mid-tile), a paged pool with 16
    heads and one request (whose programs cut their own slices), on the arch's own config (on
    sm_90 the loader widens fp8 rows itself, session 8), and in sm_90's four-buffer layout."""
    if config is not None and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon split kernel is written for sm_90 (wgmma)")
    scales = dict(k_scale=0.37, v_scale=1.9)
    for case in (make_case([0, 40_000, 333, 64], [64, 33, 16, 1], 8, mask="tree", kv_dtype=kv_dtype),
                 make_case([3000, 50_000, 17], [16, 16, 16], 16, mask="tree", page_size=16, kv_dtype=kv_dtype),
                 make_case([77_777], [16], 8, mask="tree", kv_dtype=kv_dtype)):
        _check(case, *_run(case, config=config, **scales), **scales)


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2])
def test_sm120_kernel_scaled_pool_every_shape(kv_dtype):
    """sm_120's Gluon kernel (mma.sync, so it runs here too) with a scaled pool of each dtype
    through the candidates' shapes (an fp8 pool's tiles widened by all warps, the draft blocks
    beside them copied as bf16), a paged pool and 16 heads."""
    scales = dict(k_scale=0.37, v_scale=1.9)
    for case in (make_case([0, 40_000, 333, 64], [64, 33, 16, 1], 8, mask="tree", kv_dtype=kv_dtype),
                 make_case([3000, 50_000, 17], [16, 16, 16], 16, mask="tree", page_size=16, kv_dtype=kv_dtype)):
        _check(case, *_run(case, config=va.CONFIGS["sm120"], **scales), **scales)


# sm_120's 8-warp kernel (verify_mma2.py) for every pool; CONFIGS["sm120"] runs it for fp8 pools only
MMA2_8W = va.VerifyConfig(32, 32, 8, 2, mma2=True)


@pytest.mark.parametrize("config", [None, "sm120", "mma2"])
@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_rising_scores(kv_dtype, config):
    """Scores that rise steeply within every 256 keys (each key scaled by 1 ... 6 along them), so
    a row's running maximum rises by some 40 (log2) over several tiles of every slice, a few rows at a
    time, and the accumulators are rescaled mid-slice by tiny factors; the draft block's scores
    lie far below the prefix's. (A kernel that skipped those rescales fails it: RESULTS.md,
    session 11.)"""
    case = make_case([60_000, 5_000], [16, 16], 8, mask="tree", kv_dtype=kv_dtype)
    idx = case["kv_indices"].long()
    ramp = 1.0 + 5.0 * (torch.arange(idx.numel(), device="cuda") % 256) / 255.0
    case["kv_cache"][idx] = (case["kv_cache"][idx].float() * ramp[:, None]).to(kv_dtype)
    _check(case, *_run(case, config=MMA2_8W if config == "mma2" else config and va.CONFIGS[config]))


def test_pack_custom_mask_matches_sglang_layout():
    from cases import sglang_custom_mask
    case = make_case([100, 0, 5000], [16, 5, 64], 8, mask="tree", max_q_len=64)
    cm, mi = sglang_custom_mask(case)
    packed = va.pack_custom_mask(cm, mi, case["qo_indptr"], case["kv_indptr"], 64,
                                 num_tokens=case["q"].shape[0])
    assert torch.equal(packed, case["tree_mask"])


REPLAY_LENGTHS = {3: ([5, 120_000, 0], [64_000, 1, 99_999], [7777, 7777, 120_000]),
                  # one request: no plan kernel, its programs cut their own slices
                  1: ([120_000], [0], [77_777], [5])}


@pytest.mark.parametrize("bs", [3, 1])
@pytest.mark.parametrize("config", [None, "sm120", "sm90-pdl3", "sm120-pdl3"])
def test_cuda_graph_replay(config, bs):
    """Capture once at static maxima, replay with other lengths, masks and inputs: the arch's
    own config, and sm_120's (its two-team kernel with mbarriers; mma.sync runs here too); each
    also with both kernels launched as dependents (VerifyConfig.pdl 3: edges of the graph)."""
    name, _, pdl = (config or "").partition("-pdl")
    if name == "sm90" and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon split kernel is written for sm_90 (wgmma)")
    cfg = dataclasses.replace(va.CONFIGS[name], pdl=int(pdl or 0)) if name else None
    h, t, max_L = 8, 16, 120_000
    static = make_case([max_L] * bs, [t] * bs, h, mask="tree", pool_extra=8192)
    ws = va.alloc_workspace(bs, h, t, 40, "cuda", config=cfg)
    idx_buf = torch.zeros(bs * max_L, dtype=torch.int32, device="cuda")
    out = torch.empty(bs * t, h, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(bs * t, h, dtype=torch.float32, device="cuda")
    s = {k: static[k].clone() for k in ("q", "k_extend", "kv_indptr", "qo_indptr", "tree_mask")}
    kv = static["kv_cache"]

    def call():
        va.verify_attention(s["q"], s["k_extend"], kv, idx_buf, s["kv_indptr"], s["qo_indptr"],
                            s["tree_mask"], SM_SCALE, out=out, lse=lse, workspace=ws,
                            max_q_len=t, num_splits=40, config=cfg)

    call()  # compile outside capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        call()
    for lens in REPLAY_LENGTHS[bs]:
        gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,))))
        pool = kv.shape[0]
        idx = [torch.randperm(pool, generator=gen)[:L] for L in lens]
        case = dict(static)
        case["kv_indices"] = torch.cat(idx).to(torch.int32).cuda()
        case["kv_indptr"] = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
        case["q"] = torch.randn_like(static["q"], dtype=torch.float32).to(torch.bfloat16)
        case["k_extend"] = torch.randn_like(static["k_extend"], dtype=torch.float32).to(torch.bfloat16)
        new = make_case([1] * bs, [t] * bs, h, mask="tree")  # fresh random trees
        case["blocks"], case["tree_mask"] = new["blocks"], new["tree_mask"]
        idx_buf[:case["kv_indices"].numel()].copy_(case["kv_indices"])
        for k in ("q", "k_extend", "kv_indptr", "tree_mask"):
            s[k].copy_(case[k])
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        _check(case, out, lse)


def test_validation_errors():
    case = make_case([10], [4], 8)
    args = [case[k] for k in ("q", "k_extend", "kv_cache", "kv_indices", "kv_indptr", "qo_indptr", "tree_mask")]
    with pytest.raises(TypeError, match="q: expected bfloat16"):
        va.verify_attention(args[0].float(), *args[1:], SM_SCALE)
    with pytest.raises(ValueError, match="kv_cache"):
        va.verify_attention(*args[:2], args[2][:, :512], *args[3:], SM_SCALE)
    with pytest.raises(TypeError, match="kv_indptr"):
        va.verify_attention(*args[:4], args[4].long(), *args[5:], SM_SCALE)
    with pytest.raises(ValueError, match="tree_mask"):
        va.verify_attention(*args[:6], args[6][:2], SM_SCALE)


CANDIDATES = [
    va.VerifyConfig(64, 64, 8, 2, 64, True), va.VerifyConfig(64, 64, 8, 2, 64, False),
    va.VerifyConfig(64, 32, 8, 3, 64, True), va.VerifyConfig(64, 32, 8, 4, 64, True),
    va.VerifyConfig(64, 32, 8, 2), va.VerifyConfig(64, 16, 8, 4),
    va.VerifyConfig(32, 16, 4, 2), va.VerifyConfig(32, 32, 4, 2),  # sm_80's and SM120_TRITON_FP8; SM120_TRITON
    # sm_120's Gluon kernel over S^T as two teams (mma.sync runs on sm_90 too), with the rope part
    # as lines and the partial sums in the XOR layout; then each layout alone and session 13's
    va.CONFIGS["sm120"],
    va.VerifyConfig(32, 32, 8, 2, mma2=True, teams=True, rope_lines=True),
    va.VerifyConfig(32, 32, 8, 2, mma2=True, teams=True, sums_xor=True),
    va.VerifyConfig(32, 32, 8, 2, mma2=True, teams=True),
    MMA2_8W,  # the same in 8 warps, which sm_120 runs for fp8 pools
    va.VerifyConfig(32, 32, 4, 2, 64, True, 2.0), va.VerifyConfig(32, 16, 4, 3, 64, True, 2.0),
    va.VerifyConfig(16, 32, 4, 2, 64, True, 2.0),
    va.VerifyConfig(64, 64, 8, 1, 64, gluon=True),  # the Gluon split kernel (sm_90 only)
    # its warp-specialised twin, with the S group's 256 columns and Q in shared memory (what fp8
    # pools run; bf16 pools run CONFIGS["sm90"], 128 columns and part of Q in registers)
    va.VerifyConfig(64, 32, 4, 4, 64, gluon=True, warp_specialized=True),
    # Q's columns 0..383 in the S group's registers (session 27)
    va.VerifyConfig(64, 32, 4, 4, 64, gluon=True, warp_specialized=True, s_cols=128, q_regs=3),
    va.VerifyConfig(64, 32, 4, 4, 64, gluon=True, warp_specialized=True, s_cols=128, q_regs=3, p_regs=True),
    # S_j issued in its own iteration (no S ahead), over 32 and 64 latents (session 28)
    va.VerifyConfig(64, 32, 4, 4, 64, gluon=True, warp_specialized=True, s_cols=128, q_regs=3, p_regs=True,
                    s_ahead=False),
    va.VerifyConfig(64, 64, 4, 2, 64, gluon=True, warp_specialized=True, s_cols=128, q_regs=3, s_ahead=False),
    va.VerifyConfig(64, 64, 4, 2, 64, gluon=True, warp_specialized=True, s_cols=128, q_regs=1, s_ahead=False),
    va.VerifyConfig(64, 64, 4, 2, 64, gluon=True, warp_specialized=True, s_ahead=False),
    # its partial outputs in bf16, each MMA group staging its columns in shared memory (session 31)
    va.VerifyConfig(64, 64, 4, 2, 64, gluon=True, warp_specialized=True, s_ahead=False, partials_bf16=True),
    # programmatic dependent launch at each level (session 33), and sm_120's kernels with it
    *(dataclasses.replace(va.CONFIGS["sm90"], pdl=level) for level in (1, 2, 3)),
    dataclasses.replace(va.CONFIGS["sm120"], pdl=3),
    # the merge kernel over several chunks of partials (66 slices at 128k, 8 at a time)
    va.VerifyConfig(64, 32, 4, 4, 64, gluon=True, warp_specialized=True, merge_tile=(128, 8)),
]


@pytest.mark.parametrize("cfg", CANDIDATES, ids=str)
def test_every_candidate_config(cfg):
    """Every config the benchmark may pick computes the same function (trees over t = 64 cross
    the 32-bit word boundary of the packed mask)."""
    if cfg.gluon and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon split kernel is written for sm_90 (wgmma)")
    case = make_case([0, 40_000, 333, 64], [64, 33, 16, 1], 8, mask="tree")
    _check(case, *_run(case, config=cfg))


@pytest.mark.parametrize("causal", [True, False], ids=["chains", "all-visible"])
@pytest.mark.parametrize("config,kv_dtype", [
    (None, torch.bfloat16), (None, torch.float8_e4m3fn),  # sm_90's warp-specialised kernel, both loaders
    ("sm120", torch.bfloat16), ("sm120", torch.float8_e4m3fn),  # sm_120's teams, and its 8-warp kernel
    ("triton", torch.bfloat16), ("gluon-lockstep", torch.bfloat16),
], ids=["sm90", "sm90-fp8", "sm120", "sm120-fp8", "triton", "gluon-lockstep"])
def test_shared_draft_block(config, kv_dtype, causal):
    """The plugin's mask for calls without a custom mask (DFlash's chains): one draft block's rows
    that every request reads from its row 0 (block_mask), in every split kernel. Requests of
    different draft lengths (one across the 32-bit word boundary, one of 1), a table longer
    than the batch's longest, an empty prefix."""
    cfg = {None: None, "sm120": va.CONFIGS["sm120"], "triton": va.SM90_TRITON,
           "gluon-lockstep": va.VerifyConfig(64, 64, 8, 1, 64, False, gluon=True)}[config]
    if cfg is not None and cfg.gluon and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon split kernel is written for sm_90 (wgmma)")
    scales = dict(k_scale=0.37, v_scale=1.9) if kv_dtype != torch.bfloat16 else {}
    case = make_case([0, 40_000, 333, 5000], [16, 35, 1, 40], 8, mask="chain", kv_dtype=kv_dtype)
    if not causal:
        case["blocks"] = [torch.ones_like(block) for block in case["blocks"]]
    shared = dict(case, tree_mask=va.draft_block_mask(64, causal, "cuda"))
    _check(case, *_run(shared, config=cfg, block_mask=True, **scales), **scales)


def test_tree_mask_kernel_matches_pack_custom_mask():
    """The plugin's one-kernel packing of SGLang's custom mask (DDTree's trees) against
    pack_custom_mask's torch ops: random bits in every column (only the draft ones may be read),
    draft blocks across the 32-bit word boundary, prefixes up to 200k, batches up to 48."""
    from cases import random_custom_mask
    from dflash_kernels.sglang_plugin import packed_custom_mask
    for lengths, prefixes in (([16], [0]), ([16], [200_000]), ([1, 16, 3], [5, 0, 70_000]),
                              ([64, 33, 1, 40], [7, 1000, 0, 31]), ([5] * 48, list(range(0, 4800, 100)))):
        qo = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
        kv = torch.tensor([0, *torch.tensor(prefixes).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
        custom, mask_indptr = random_custom_mask(qo, kv)
        n_tok, mq = int(qo[-1]), max(lengths)
        got = packed_custom_mask(custom, mask_indptr, qo, kv, n_tok, mq)
        assert torch.equal(got, va.pack_custom_mask(custom, mask_indptr, qo, kv, mq, num_tokens=n_tok)), lengths


def _backend_call(case, custom_mask, causal, mask_indptr, t):
    """The verify fast path's arguments as SGLang's backend passes them (pool as (pool, 1, 576)
    with V a view of it; o, the fourth, is None here for the caller to fill in)."""
    kb = case["kv_cache"].reshape(-1, 1, 576)
    ke = case["k_extend"].reshape(-1, 1, 576)
    args = (case["q"], ke, ke[..., :512].contiguous(), None, kb, kb[..., :512], case["qo_indptr"],
            case["kv_indptr"], case["kv_indices"], custom_mask, causal, mask_indptr, t, 1.0, 1.0, SM_SCALE)
    kw = dict(logit_cap=0.0, sliding_window_size=-1, sinks=None, window_kv_offsets=None,
              xai_temperature_len=-1, max_bs=8)
    return args, kw


def _replayed_on_new_q(fn, case, args, kw, like):
    """The output of `fn` captured once in a CUDA graph, then replayed after q changed in place."""
    g_out = torch.full_like(like, float("nan"))
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn(*args[:3], g_out, *args[4:], **kw)
    case["q"].copy_(torch.randn_like(case["q"], dtype=torch.float32).to(torch.bfloat16))
    g_out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    return g_out


def test_sglang_plugin_serves_dflash_chains_without_a_custom_mask():
    """DFlash's own call (no custom mask, causal=True: the plugin builds the chain mask itself)
    against the float32 reference; then in a CUDA graph, replayed after q changes in place."""
    from dflash_kernels.sglang_plugin import MlaVerify
    h, t = 8, 16
    case = make_case([30_000, 77, 5000], [t, t, t], h, mask="chain", idx_dtype=torch.int64)
    args, kw = _backend_call(case, None, True, None, t)

    def reference():
        return va.reference_verify_attention(case["q"], case["k_extend"], case["kv_cache"], case["kv_indices"],
                                             case["kv_indptr"], case["qo_indptr"], case["blocks"], SM_SCALE)[0]
    fn = MlaVerify()
    ours = torch.full((case["q"].shape[0], h, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    assert fn(*args[:3], ours, *args[4:], **kw) is True, fn.last_reason
    assert not torch.isnan(ours).any() and rel_err(ours, reference()) < TOL
    assert rel_err(_replayed_on_new_q(fn, case, args, kw, ours), reference()) < TOL


def test_sglang_plugin_path_matches_sglang():
    """The plugin, called exactly as SGLang's backend calls its verify fast path (pool as
    (pool, 1, 576) with V a view of it, int64 kv_indices, bool custom_mask), against SGLang's
    extend_attention_fwd on the same inputs; then once more inside a CUDA graph."""
    from dflash_kernels.sglang_plugin import MlaVerify
    peer = load_peer()
    if peer is None:
        pytest.skip("SGLang peer kernels not fetched (fetch_peer.sh)")
    from cases import sglang_custom_mask
    h, t = 8, 16
    case = make_case([30_000, 77, 5000], [t, t, t], h, mask="tree", idx_dtype=torch.int64)
    cm, mi = sglang_custom_mask(case)
    args, kw = _backend_call(case, cm, False, mi, t)
    fn = MlaVerify()
    ours = torch.full((case["q"].shape[0], h, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    assert fn(*args[:3], ours, *args[4:], **kw) is True, fn.last_reason
    theirs = torch.full_like(ours, float("nan"))
    run_peer(peer, case, theirs)
    assert not torch.isnan(ours).any()
    assert rel_err(ours, theirs) < TOL
    g_out = _replayed_on_new_q(fn, case, args, kw, ours)
    run_peer(peer, case, theirs)
    torch.cuda.synchronize()
    assert rel_err(g_out, theirs) < TOL
    # a case it must not serve: tanh logit cap -> False, SGLang's kernel runs instead
    assert fn(*args[:3], ours, *args[4:], **dict(kw, logit_cap=30.0)) is False
    assert fn.last_reason == "logit cap"


def _forward_batch(lens, t, pool_rows, gen, trees=True):
    """One verify batch as SGLang's backend hands it to every layer: int64 kv_indices into the
    layers' pools, and DDTree's random trees as its flat custom mask and int64 mask_indptr (or
    DFlash's chains: no custom mask, causal)."""
    from cases import sglang_custom_mask
    bs = len(lens)
    case = dict(qo_indptr=torch.arange(0, t * bs + 1, t, dtype=torch.int32, device="cuda"),
                kv_indptr=torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda"),
                kv_indices=torch.randperm(pool_rows, generator=gen)[:sum(lens)].cuda())
    if trees:
        case["blocks"] = [va.tree_mask_from_parents(va.random_tree_parents(t, gen)).cuda() for _ in lens]
        case["custom_mask"], case["mask_indptr"] = sglang_custom_mask(case)
    else:
        case["blocks"] = [va.chain_tree_mask(t).cuda() for _ in lens]
        case["custom_mask"] = case["mask_indptr"] = None
    return case


def test_sglang_plugin_layers_of_a_forward_share_one_mask_and_plan():
    """Layers through the plugin as SGLang runs a verify forward (one batch's tensors, a pool per
    layer): the first layer packs the tree mask and plans, the others reuse both. Eager forwards
    of batches of trees and of chains; then a CUDA graph runner's sequence for two batch sizes on
    static buffers (two warm-ups and the capture each, one memory pool for both graphs), the
    graphs replayed in turn with new lengths, trees and inputs; then an eager forward again.
    Every layer of every forward against the float32 reference: a layer left on another batch's
    plan or mask fails it."""
    from dflash_kernels.sglang_plugin import MlaVerify
    h, t, layers, max_len = 8, 16, 4, 40_000
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,))))
    pool_rows = 3 * max_len + 1024
    pools = [torch.randn(pool_rows, 1, 576, generator=gen).to(torch.bfloat16).cuda() for _ in range(layers)]
    fn = MlaVerify()

    def forward(case, qs, kexts, outs):
        for layer in range(layers):
            kb, ke = pools[layer], kexts[layer].view(-1, 1, 576)
            served = fn(qs[layer], ke, ke[..., :512], outs[layer], kb, kb[..., :512], case["qo_indptr"],
                        case["kv_indptr"], case["kv_indices"], case["custom_mask"], case["custom_mask"] is None,
                        case["mask_indptr"], t, 1.0, 1.0, SM_SCALE, logit_cap=0.0, sliding_window_size=-1,
                        sinks=None, window_kv_offsets=None, xai_temperature_len=-1, max_bs=8)
            assert served is True, fn.last_reason

    def inputs(bs):
        qs = [torch.randn(bs * t, h, 576, generator=gen).to(torch.bfloat16).cuda() for _ in range(layers)]
        kexts = [torch.randn(bs * t, 576, generator=gen).to(torch.bfloat16).cuda() for _ in range(layers)]
        outs = [torch.full((bs * t, h, 512), float("nan"), dtype=torch.bfloat16, device="cuda") for _ in range(layers)]
        return qs, kexts, outs

    def check(case, qs, kexts, outs, what):
        torch.cuda.synchronize()
        for layer in range(layers):
            ref = va.reference_verify_attention(qs[layer], kexts[layer], pools[layer], case["kv_indices"],
                                                case["kv_indptr"], case["qo_indptr"], case["blocks"], SM_SCALE)[0]
            assert not torch.isnan(outs[layer]).any(), f"{what}, layer {layer}: unwritten or NaN output"
            assert rel_err(outs[layer], ref) < TOL, f"{what}, layer {layer}"

    def eager(lens, trees):
        case, io = _forward_batch(lens, t, pool_rows, gen, trees), inputs(len(lens))
        forward(case, *io)
        check(case, *io, f"eager {lens}")

    eager([30_000, 77, 5000], trees=True)  # eager: new tensors each forward
    eager([2, 39_000, 12_345, 600], trees=True)
    eager([21_000, 0, 9_999, 40_000], trees=False)

    # a graph runner's static buffers per batch size, sized for the longest batch and captured
    # on their own values; both graphs in one memory pool, as SGLang's runner shares one
    graphs, mempool = {}, None
    for bs in (3, 2):
        static = _forward_batch([max_len] * bs, t, pool_rows, gen)
        s = dict(static, kv_indices=static["kv_indices"].clone(), custom_mask=static["custom_mask"].clone())
        io = inputs(bs)
        for _ in range(2):
            forward(s, *io)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=mempool):
            forward(s, *io)
        mempool = g.pool()
        graphs[bs] = (g, s, io)
    for lens in ([5, max_len, 0], [21_000, 1], [7777, 7777, max_len], [max_len - 1, 333]):
        g, s, (qs, kexts, outs) = graphs[len(lens)]
        case = _forward_batch(lens, t, pool_rows, gen)
        for name in ("kv_indptr", "mask_indptr"):
            s[name].copy_(case[name])
        s["kv_indices"][:case["kv_indices"].numel()].copy_(case["kv_indices"])
        s["custom_mask"][:case["custom_mask"].numel()].copy_(case["custom_mask"])
        new_qs, new_kexts, _ = inputs(len(lens))
        for layer in range(layers):
            qs[layer].copy_(new_qs[layer])
            kexts[layer].copy_(new_kexts[layer])
            outs[layer].fill_(float("nan"))
        g.replay()
        check(case, qs, kexts, outs, f"graph replay {lens}")
    eager([600, 30_000, 2], trees=True)  # and eagerly again after the replays
