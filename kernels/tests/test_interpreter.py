"""CPU: the kernels' logic (split plan, tree mask, online softmax, merge) through Triton's
interpreter on small problems, against the float32 reference. Fresh random inputs each run;
the output starts as NaN so an unwritten element fails."""

import pytest
from cases import interpreted_json, peer_dir, run_interpreted

TOL = 1e-2  # bf16 inputs, bf16 P and bf16 output (see test_verify_gpu.py)


def _run(spec):
    return interpreted_json("interp_check.py", spec)


SMALL = dict(block_m=16, block_n=16, num_warps=4, num_stages=1, min_chunk=16)


@pytest.mark.parametrize("spec", [
    # several requests of different lengths, empty prefixes, t = 1, random trees, several slices
    # each, merged two partials at a time (the merge's running maximum across chunks)
    dict(lens=[0, 300, 7, 0, 95], ts=[2, 3, 1, 2, 4], heads=8, num_splits=5,
         config=dict(SMALL, idx_ahead=True, merge_tile=(64, 2))),
    # chain mask, one slice only
    dict(lens=[500], ts=[5], heads=4, num_splits=1, mask="chain", config=SMALL),
    # one request, so no plan kernel: its programs cut 7 slices (the last one short) themselves,
    # and the merge counts them the same way; then an empty prefix (the draft block alone)
    dict(lens=[300], ts=[4], heads=2, num_splits=7, config=SMALL),
    dict(lens=[0], ts=[3], heads=2, num_splits=7, config=SMALL),
    # more slices than tokens; pages of 16; 128-column merge programs, four partials at a time
    dict(lens=[40, 33], ts=[3, 3], heads=2, num_splits=64, page_size=16,
         config=dict(SMALL, merge_tile=(128, 4))),
    # a 40-node tree: the packed mask spans two 32-bit words, with 64-wide tiles
    dict(lens=[70, 3], ts=[40, 33], heads=1, num_splits=2,
         config=dict(block_m=32, block_n=64, num_warps=4, num_stages=1, min_chunk=64, idx_ahead=True)),
    # a split kernel whose tiles are half the plan's BLOCK_N, as sm_90's fp8 pools ran in sessions
    # 28-29 (32-latent tiles under a plan of 64), over slices cut by the plan kernel (a batch). (A
    # single request's programs cut their slices by their own BLOCK_N and the merge counts them by
    # the config's, so one request needs the two equal, as every split kernel has them since
    # session 29.)
    dict(lens=[0, 300, 95, 33], ts=[2, 3, 4, 1], heads=4, num_splits=5, kv_dtype="float8_e4m3fn",
         k_scale=0.37, v_scale=1.9, split_block_n=16, config=dict(SMALL, block_n=32, min_chunk=32)),
    # an fp8 (e4m3) pool with SGLang's k/v scales: scaled prefix, unscaled bf16 draft block, each
    # in its own loop; far from 1 so that a scale applied to the wrong keys, or not at all, fails
    dict(lens=[0, 300, 95], ts=[2, 3, 4], heads=8, num_splits=5, kv_dtype="float8_e4m3fn",
         k_scale=0.37, v_scale=1.9, config=dict(SMALL, idx_ahead=True)),
    # e5m2 pages, chain mask
    dict(lens=[40, 33], ts=[3, 3], heads=2, num_splits=6, page_size=16, mask="chain",
         kv_dtype="float8_e5m2", k_scale=2.5, v_scale=0.6, config=SMALL),
    # a scaled bf16 pool: the single loop for both kinds of program, with the prefix's scales
    dict(lens=[200, 7], ts=[5, 2], heads=4, num_splits=4, k_scale=0.5, v_scale=3.0, config=SMALL),
    # chains of different lengths (one across the 32-bit word boundary) read from one shared
    # draft block (block_mask), each request from its row 0 (the GPU test covers all-visible
    # blocks, whose rows hold bits past a request's own length)
    dict(lens=[90, 0, 33], ts=[5, 35, 1], heads=2, num_splits=4, mask="chain", block_mask=True,
         config=dict(block_m=32, block_n=32, num_warps=4, num_stages=1, min_chunk=32)),
    # bf16 partial outputs (sm_90's): the merge's word pairs over a row tile with several chunks
    # (the running maximum), the one-round-trip tile, and a single request's own slices
    dict(lens=[0, 300, 7, 95], ts=[2, 3, 1, 4], heads=8, num_splits=5, partials_bf16=True,
         config=dict(SMALL, merge_tile=(512, 2, 1))),
    dict(lens=[40, 33], ts=[3, 3], heads=2, num_splits=64, partials_bf16=True, config=dict(SMALL, merge_tile=(64, 128))),
    dict(lens=[300], ts=[4], heads=2, num_splits=7, partials_bf16=True, config=SMALL),
    # and a tile of 128 columns looping over chunks of 4 in two stages (bf16's table: 128 x 64 in
    # two stages)
    dict(lens=[300, 90], ts=[4, 2], heads=2, num_splits=9, partials_bf16=True, config=dict(SMALL, merge_tile=(128, 4, 2))),
    # a lone request's bf16 partials from a workspace of NaN: the merge reads its own slots only
    # (3 slices of 16 in one chunk of 32; 7 slices over chunks of 2)
    dict(lens=[40], ts=[3], heads=2, num_splits=16, partials_bf16=True, poison_workspace=True,
         config=dict(SMALL, merge_tile=(64, 32))),
    dict(lens=[300], ts=[4], heads=2, num_splits=7, partials_bf16=True, poison_workspace=True,
         config=dict(SMALL, merge_tile=(512, 2, 1))),
], ids=["mixed-batch", "chain", "one-request-slices", "one-request-empty", "many-splits-paged", "tree-40",
        "half-tiles-plan-slices", "fp8-e4m3-scaled", "fp8-e5m2-paged", "bf16-scaled",
        "chains-one-block", "bf16-partials-rows", "bf16-partials-one-trip", "bf16-partials-one-request",
        "bf16-partials-column-chunks", "bf16-lone-request-poisoned", "bf16-lone-request-chunks-poisoned"])
def test_kernels_match_reference(spec):
    r = _run(spec)
    assert not r["nan"], "unwritten or NaN output"
    assert r["rel_err"] < TOL, r
    assert r["lse_err"] < 2e-3, r


def test_tree_mask_kernel_matches_its_torch_ops():
    """The plugin's tree-mask kernel against the torch ops it replaces: draft blocks across the
    32-bit word boundary, empty and long prefixes, random bits in the prefix columns."""
    assert run_interpreted("interp_masks.py").split() == ["4"]


def test_a_draft_longer_than_max_q_len_writes_nothing_past_its_slot():
    """max_q_len sizes the workspace and the mask; a request with more draft tokens (a caller's
    bug the launcher cannot see without reading qo_indptr) gets its first max_q_len tokens and no
    more: nothing is stored past its slot (the interpreter would fault), the other requests are
    right, and the tokens left over stay as they were (NaN here), so the bug shows."""
    r = _run(dict(lens=[25, 40], ts=[1, 5], heads=2, num_splits=3, max_q_len=3, config=SMALL))
    assert not r["stored_past_the_workspace"], r
    assert r["unwritten_tokens"] == [4, 5], r
    assert r["rel_err_written"] < TOL, r


needs_peer = pytest.mark.skipif(peer_dir() is None, reason="SGLang's kernels not found: run fetch_peer.sh, or "
                                "set SGLANG_WHEEL to the sglang 0.5.23 wheel (scripts/test.sh does)")


@needs_peer
@pytest.mark.parametrize("spec", [
    # random trees in a batch: empty prefixes, t = 1, prefixes of different lengths, 8 heads
    dict(lens=[0, 300, 7, 95], ts=[2, 5, 1, 4], heads=8, num_splits=5, config=SMALL),
    # a chain, 16 heads, one request over several slices (no plan kernel)
    dict(lens=[400], ts=[6], heads=16, num_splits=4, mask="chain", config=SMALL),
    # a 40-node tree (its mask spans two 32-bit words) over pages of 16, 64-wide tiles
    dict(lens=[70, 33], ts=[40, 17], heads=1, num_splits=3, page_size=16,
         config=dict(block_m=32, block_n=64, num_warps=4, num_stages=1, min_chunk=64, idx_ahead=True)),
], ids=["tree-batch-8-heads", "chain-16-heads", "tree-40-paged"])
def test_sglang_kernel_computes_what_ours_computes(spec):
    """SGLang's own extend_attention_fwd (its target-verify call, from the pinned release's files),
    run by the interpreter on the same inputs as ours: both land on the float32 reference, and on
    each other, at bf16 levels."""
    r = _run(dict(spec, peer=True))
    assert not r["nan"] and not r["peer_nan"], r
    assert r["rel_err"] < TOL and r["peer_rel_err"] < TOL, r
    assert r["ours_vs_peer"] < TOL, r


@needs_peer
@pytest.mark.parametrize("kv_dtype", ["bfloat16", "float8_e4m3fn"])
def test_pool_scales_mean_what_sglang_means(kv_dtype):
    """SGLang's own extend_attention_fwd, run by the interpreter on the same inputs, with k/v
    scales far from 1, lands where our reference does: its scores of pool keys carry k_scale,
    its P.V over pool values v_scale, and the draft block neither. With a bf16 pool both
    kernels are within the bf16 bound; with fp8, SGLang also casts q and P to fp8, so ours
    must only be the closer of the two."""
    r = _run(dict(lens=[50, 7], ts=[4, 3], heads=2, num_splits=3, kv_dtype=kv_dtype, k_scale=0.37, v_scale=1.9,
                  config=SMALL, peer=True))
    assert not r["nan"] and not r["peer_nan"], r
    assert r["rel_err"] < TOL, r
    if kv_dtype == "bfloat16":
        assert r["peer_rel_err"] < TOL, r
    else:
        assert r["rel_err"] < r["peer_rel_err"] < 0.2, r
