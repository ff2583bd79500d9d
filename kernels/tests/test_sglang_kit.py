"""GPU: the plugin inside SGLang's own attention test kit.

SGLang's wheel ships the kit its attention backends are tested with
(``sglang.test.kits.attention_unittest``): a mock model runner around SGLang's real
``MLATokenToKVPool`` and ``ReqToTokenPool``, a real ``ForwardBatch`` in TARGET_VERIFY mode
with DFlash's or EAGLE's verify input, a small DeepSeek-style MLA layer whose
``RadixAttention`` calls the backend, a float32 reference of the whole layer and SGLang's own
tolerances. Here that kit builds SGLang's real ``TritonAttnBackend`` with the plugin switched
on, so everything between SGLang and the kernel is SGLang's code: the backend's ``__init__``
(and the on-card check the plugin runs there), ``init_forward_metadata`` (kv_indices from the
pool's translator, the flat custom mask and its ``mask_indptr``), ``forward_extend``'s call
into the verify slot, and the CUDA-graph metadata path (static buffers, a padded batch).
Each test also asserts that the kernel served every verify call: a plugin that declined would
pass the kit on SGLang's own kernel.

Needs SGLang's Python files (the wheel's, unpacked, with their pure-Python dependencies) and
a GPU; skipped elsewhere (CI).
"""
import functools
import unittest

import pytest
import torch
from dflash_kernels import sglang_plugin as plugin

pytestmark = pytest.mark.gpu

kit = pytest.importorskip("sglang.test.kits.attention_unittest.runner_modes.speculative_target_verify_runner",
                          reason="SGLang's Python files are not importable here")
mla_kit = pytest.importorskip("sglang.test.kits.attention_unittest.attention_methods.mla_attention")
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402

# Kimi K2's latent: 512 + 64 (the kit's defaults are a toy 32 + 0)
MLA = dict(kv_lora_rank=512, qk_rope_head_dim=64, hidden_size=128, dtype=torch.bfloat16, device="cuda")


@pytest.fixture
def served(monkeypatch):
    """Switch the plugin on for backends built from here, and record every verify call the
    backend hands to it: (served, reason it declined)."""
    monkeypatch.setenv(plugin.ENV, "1")
    monkeypatch.delenv(plugin.SELFCHECK_ENV, raising=False)
    monkeypatch.setattr(plugin, "_CARD_VERDICTS", {})
    plugin.patch_backend_class(TritonAttnBackend)
    calls = []
    call = plugin.MlaVerify.__call__

    def recording_call(self, *args, **kwargs):
        result = call(self, *args, **kwargs)
        calls.append((result, self.last_reason))
        return result
    monkeypatch.setattr(plugin.MlaVerify, "__call__", recording_call)
    return calls


def _case(heads, prefix_lens, draft_len):
    return mla_kit.MLAAttentionCase(name=f"dflash_kit_h{heads}_t{draft_len}", backend="triton",
                                    forward_mode=ForwardMode.TARGET_VERIFY, num_heads=heads, page_size=1,
                                    prefix_lens=prefix_lens, extend_lens=(draft_len,) * len(prefix_lens))


def _assert_kernel_served(calls, heads, draft_len):
    assert calls, "the backend never called the verify slot"
    declined = [reason for ok, reason in calls if ok is not True]
    assert not declined, f"the kernel declined: {declined[:3]}"
    (verdict,) = [v for key, v in plugin._CARD_VERDICTS.items() if key[1:] == (heads, torch.bfloat16, draft_len)]
    assert verdict.passed, verdict.line()
    return verdict


def _as_rtx_pro_6000(monkeypatch):
    """Plan every call (and the on-card check) as on an RTX PRO 6000: sm_120's config (its
    mma.sync kernels, which an H200 runs too) and its 188 SMs."""
    import importlib
    va = importlib.import_module("dflash_kernels.verify_attention")
    monkeypatch.setattr(va, "_device_info", lambda device: (12, 0, 188))


@pytest.mark.parametrize("heads", [8, 16])
@pytest.mark.parametrize("mask", ["custom", "none"])
@pytest.mark.parametrize("arch", ["native", "sm120"])
def test_dflash_verify_in_sglangs_kit(served, monkeypatch, heads, mask, arch):
    """DFlash's chains, eager: with SGLang's flat custom mask (as the kit builds it) and without
    one (DFlash's worker in 0.5.23 passes none: the backend's causal flag decides); with this
    card's config and with sm_120's."""
    if arch == "sm120":
        _as_rtx_pro_6000(monkeypatch)
    if mask == "none":
        make_input = kit._make_spec_verify_input

        def without_mask(*args, **kwargs):
            spec = make_input(*args, **kwargs)
            spec.custom_mask = None
            return spec
        monkeypatch.setattr(kit, "_make_spec_verify_input", without_mask)
    case = _case(heads, (37, 0, 2900, 700), draft_len=16)
    kit.run_mla_eagle_verify_case(unittest.TestCase(), case, topk=1, spec_kind="dflash", max_context_len=2944, **MLA)
    verdict = _assert_kernel_served(served, heads, 16)
    assert arch == "native" or "teams" in verdict.kernel, verdict.kernel  # sm_120's two-team kernel ran


def test_eagle_tree_verify_in_sglangs_kit(served):
    """A tree (the kit's root with two branches, EAGLE topk 2) through SGLang's custom mask."""
    case = _case(8, (1000, 5, 333), draft_len=3)
    kit.run_mla_eagle_verify_case(unittest.TestCase(), case, topk=2, spec_kind="eagle", max_context_len=1024, **MLA)
    _assert_kernel_served(served, 8, 3)


@pytest.mark.parametrize("heads", [8, 16])
@pytest.mark.parametrize("prefixes", [(1500, 64, 9, 300), (1500, 64)], ids=["full", "padded"])
def test_dflash_verify_through_sglangs_graph_metadata(served, monkeypatch, heads, prefixes):
    """The kit's CUDA-graph mode: the backend's static capture buffers (int64 qo_indptr, a uint8
    custom mask and its mask_indptr), a capture pass at the fill length, then a replay batch
    (full, or 2 requests padded to the captured 4) checked against the reference.

    The kit's eager pass on the graph fixture is left out: it misses its own reference for
    SGLang's kernel too, by the same amounts as for ours (0.2-0.3 against 0.03 on the H200;
    bench/sglang_kit/eager_leg.py). By the kit's code (0.5.23), its fixture lays the prefix out
    on shuffled pages, and the graph mode then writes the prefix again at the plain layout's
    slots, over other tokens' rows, before that eager pass reads the shuffled ones."""
    adapter = kit.SpeculativeCudaGraphAdapter
    monkeypatch.setattr(kit, "SpeculativeCudaGraphAdapter",
                        functools.partial(adapter, run_graph_eager=False, compare_replay_to_graph_eager=False))
    case = _case(heads, prefixes, draft_len=16)
    kit.run_mla_eagle_verify_cuda_graph_case(unittest.TestCase(), case, topk=1, spec_kind="dflash",
                                             max_context_len=1600, cuda_graph_capture_batch_size=4, **MLA)
    _assert_kernel_served(served, heads, 16)
    assert len(served) == 2, "one capture pass and one replay pass"


@pytest.mark.parametrize("kernel", ["ours", "sglang"])
def test_dflash_verify_in_a_captured_cuda_graph(served, monkeypatch, kernel):
    """A real CUDA graph, as SGLang's graph runner makes one: the layer's forward captured once
    over the backend's static buffers (at the fill length, batch 4), then the replay batch's
    metadata written into those buffers (``init_forward_metadata_out_graph``), its inputs copied
    into the captured ones, and the graph replayed: the output must match the kit's reference.
    SGLang's own kernel runs the same steps, which checks the harness itself."""
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
    from sglang.test.kits.attention_unittest.runner_modes.cuda_graph_decode_runner import (
        _init_cuda_graph_capture_metadata,
        _init_cuda_graph_replay_metadata,
    )
    if kernel == "sglang":
        monkeypatch.setenv(plugin.ENV, "0")
    heads, bs, max_context_len = 8, 4, 1600
    case = _case(heads, (1500, 64, 9, 300), draft_len=16)
    fixture = mla_kit.build_mla_attention_fixture(unittest.TestCase(), case, max_context_len=max_context_len,
                                                  disable_cuda_graph=False, runner_batch_size=bs, **MLA)
    backend, device = fixture.backend, MLA["device"]

    def batch_for(spec_case, inputs):
        batch = mla_kit._make_forward_batch(spec_case, fixture.runner, max_context_len=max_context_len, device=device)
        kit._prepare_spec_verify_batch(spec_case, batch, topk=1, spec_kind="dflash", device=device)
        mla_kit.prepare_mla_runner_inputs(fixture, spec_case, batch, inputs, max_context_len=max_context_len)
        return batch

    fill = backend.get_cuda_graph_seq_len_fill_value()
    capture_case = mla_kit.make_mla_case_with_prefix_lens(case, "capture", (fill,) * bs)
    static_inputs = mla_kit.make_mla_random_inputs(capture_case, fixture, dtype=MLA["dtype"], device=device)
    capture_batch = batch_for(capture_case, static_inputs)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), forward_context(ForwardContext(attn_backend=backend)):
        _init_cuda_graph_capture_metadata(backend, bs, capture_batch)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up outside the graph, as SGLang's runner does
            mla_kit.run_mla_forward(fixture, capture_batch, static_inputs)
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(graph):
            static_out = mla_kit.run_mla_forward(fixture, capture_batch, static_inputs)

        replay_inputs = mla_kit.make_mla_random_inputs(case, fixture, dtype=MLA["dtype"], device=device)
        replay_batch = batch_for(case, replay_inputs)
        _init_cuda_graph_replay_metadata(backend, bs, replay_batch)
        static_inputs["input_hidden"].copy_(replay_inputs["input_hidden"])
        capture_batch.out_cache_loc.copy_(replay_batch.out_cache_loc)
        capture_batch.positions.copy_(replay_batch.positions)
        static_out.fill_(float("nan"))
        graph.replay()
    torch.cuda.synchronize()
    expected = kit._target_verify_expected_output(reference_fn=mla_kit.mla_attention_reference_with_custom_mask,
                                                  fixture=fixture, case=case, inputs=replay_inputs, topk=1,
                                                  spec_kind="dflash", device=device)
    torch.testing.assert_close(static_out, expected, atol=mla_kit.MLA_ATOL, rtol=mla_kit.MLA_RTOL)
    if kernel == "ours":
        _assert_kernel_served(served, heads, 16)
        assert len(served) == 2, "the warm-up and the captured call (a replay does not call Python)"
    else:
        assert not served
