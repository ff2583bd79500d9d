"""Pure models of the engine simulator: memory (the seed's figures), timing, the OOM message, the CLI."""

from __future__ import annotations

import pytest
from sglang_sim import memory, timing
from sglang_sim.args import parse_args
from sglang_sim.memory import GIB, MIB, GPUConfig, MemoryState, plan_kv

GPU = GPUConfig()


def test_kv_pool_sizes_match_the_seed_node():
    assert plan_kv(GPU, 0.93).max_total_num_tokens == 195011
    assert plan_kv(GPU, 0.92).max_total_num_tokens == 181182
    assert plan_kv(GPU, 0.94).max_total_num_tokens == 208840
    plan = plan_kv(GPU, 0.93)
    assert plan.target_cell_bytes == 70272
    assert plan.draft_cell_bytes == 2560  # 1 KV head/rank * (128 + 128) * 5 layers * 2 B
    assert round(plan.pre_model_load_gib, 2) == 93.80
    assert round(plan.weights_gib, 2) == 74.01
    assert round(plan.avail_after_graph_gib, 2) == 5.86
    assert round(plan.target_kv_bytes / GIB, 2) == 12.76


def test_pool_without_draft_and_page_size():
    assert plan_kv(GPU, 0.93, speculative_algorithm=None).max_total_num_tokens == 202115
    assert plan_kv(GPU, 0.93, page_size=64).max_total_num_tokens == 195008


def _run(fraction, chunk, expandable, prompts):
    """Feed prompts (no cache hits) through the memory model; return (survived, oom figures)."""
    state = MemoryState(GPU, plan_kv(GPU, fraction), expandable)
    for n in prompts:
        chunks = timing.chunks(n, chunk)
        for c in chunks:
            oom = state.check_chunk(c)
            if oom:
                return False, oom
        state.finish_request(max(chunks))
    return True, None


def test_seed_sequence_dies_on_the_32k_prefill():
    ok, oom = _run(0.94, 8192, False, [1024, 1024, 8192, 8192])
    assert ok
    ok, oom = _run(0.94, 8192, False, [1024, 1024, 8192, 8192, 32768])
    assert not ok
    assert oom.tried_bytes == 896 * MIB
    assert 880 * MIB < oom.free_bytes < 896 * MIB
    assert memory.format_size(oom.free_bytes) == "893.35 MiB"
    assert memory.format_size(oom.reserved_unallocated_bytes) == "1.40 GiB"


def test_fresh_server_survives_one_long_prompt_at_094():
    assert _run(0.94, 8192, False, [60000])[0]


@pytest.mark.parametrize(
    "fraction,chunk,expandable",
    [(0.93, 4096, True), (0.94, 4096, True), (0.94, 4096, False)],
)
def test_fixed_configs_survive_the_sweep(fraction, chunk, expandable):
    sweep = [1024, 8192, 32768, 65536, 131072, 185000] * 3
    assert _run(fraction, chunk, expandable, sweep) == (True, None)


def test_startup_failures():
    plan = plan_kv(GPU, 0.99)
    assert memory.startup_oom(GPU, plan, "graph") is None
    assert memory.startup_oom(GPU, plan, "warmup") is not None
    assert memory.startup_oom(GPU, plan_kv(GPU, 0.96), "warmup") is None
    with pytest.raises(memory.NoKVMemoryError) as err:
        plan_kv(GPU, 0.70)
    assert str(err.value) == (
        "Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.7. "
        "Raise --mem-fraction-static above 0.789 (minimum viable = 1 - available/pre = 0.7890). "
        "If using speculative decoding, draft weights are now counted."
    )


def test_activation_and_fragmentation():
    assert memory.activation_bytes(8192) == 896 * MIB
    assert memory.activation_bytes(4096) == 448 * MIB  # linear, as the MoE dispatch buffer
    state = MemoryState(GPU, plan_kv(GPU, 0.93), expandable_segments=True)
    state.finish_request(8192)
    assert state.fragmentation_bytes == 0
    assert memory.expandable_segments_enabled({"PYTORCH_ALLOC_CONF": "expandable_segments:True"})
    assert memory.expandable_segments_enabled(
        {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64,expandable_segments:True"}
    )
    assert not memory.expandable_segments_enabled({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"})


def test_oom_message_matches_pytorch_format():
    expected = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 896.00 MiB. GPU 0 has a total "
        "capacity "
        "of 94.97 GiB of which 893.38 MiB is free. Process 10973 has 700.00 MiB memory in use. Including "
        "non-PyTorch memory, this process has 93.40 GiB memory in use. Of the allocated memory 90.12 GiB is "
        "allocated by PyTorch, with 1.20 GiB allocated in private pools (e.g., CUDA Graphs), and 1.40 GiB is "
        "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
        "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )
    info = memory.OOMInfo(
        tried_bytes=896 * MIB,
        total_bytes=round(94.97 * GIB),
        free_bytes=round(893.38 * MIB),
        other_process_bytes=700 * MIB,
        process_in_use_bytes=round(93.40 * GIB),
        allocated_bytes=round(90.12 * GIB),
        private_pool_bytes=round(1.20 * GIB),
        reserved_unallocated_bytes=round(1.40 * GIB),
    )
    assert memory.oom_message(info, other_pid=10973) == expected
    assert memory.format_size(1024) == "1024 bytes"
    assert memory.format_size(1025) == "1.00 KiB"


# The seed's benchmark (TP8, C = 1, chunks of 4096): context tokens and TTFT in seconds.
SEED_TTFT_S = [(1427, 0.46), (11402, 4.3), (31952, 17.6), (63903, 51.0), (127802, 186.0), (185000, 384.0)]


@pytest.mark.parametrize("tokens, seed_s", SEED_TTFT_S, ids=[f"{t // 1000}k" for t, _ in SEED_TTFT_S])
def test_prefill_model_is_within_12_percent_of_every_seed_ttft(tokens, seed_s):
    """Two constants (a per-token cost and an attention term growing with the position) against
    six measured points: the bound the timing module states, at every point of the table."""
    assert timing.prefill_seconds(tokens, 0, 4096) == pytest.approx(seed_s, rel=0.12)


def test_timing_model_fits_the_seed_table():
    # a chunk after a prefix pays for its own tokens and for attention over the prefix
    assert timing.prefill_chunk_seconds(1, 8191) > timing.prefill_chunk_seconds(1, 0)
    assert timing.prefill_seconds(8192, 8191, 4096) == pytest.approx(timing.prefill_chunk_seconds(1, 8191))
    # chunking leaves the total nearly unchanged (the attention term depends on positions only)
    assert timing.prefill_seconds(32768, 0, 4096) == pytest.approx(timing.prefill_seconds(32768, 0, -1), rel=1e-9)
    assert timing.chunks(10000, 4096) == [4096, 4096, 1808]
    assert timing.chunks(10000, -1) == [10000]
    for ctx, ms in [(1427, 8.4), (11402, 50), (31952, 159), (63903, 357), (127802, 714), (185000, 1430)]:
        assert timing.decode_step_seconds(ctx) == pytest.approx(ms / 1000)
    assert timing.decode_step_seconds(100) == pytest.approx(0.0084)
    assert timing.decode_steps(17, 1.0) == 16
    assert timing.decode_steps(17, 2.5) == 7  # 16 tokens at 2.5 per step: 2, 3, 2, 3, 2, 3, 1
    ttft, total = timing.generate_seconds(1427, 3, chunk_size=4096)
    assert total == pytest.approx(ttft + timing.decode_step_seconds(1428) + timing.decode_step_seconds(1429))


def test_cli_matches_sglang(capsys):
    args = parse_args(["--model-path", "/m", "--tp", "8", "--context-length", "200k", "--mem-frac", "0.93"])
    assert (args.tp_size, args.context_length, args.mem_fraction_static) == (8, 200000, 0.93)
    assert args.port == 30000 and args.host == "127.0.0.1" and args.watchdog_timeout == 300
    with pytest.raises(SystemExit) as exc:
        parse_args(["--model-path", "/m", "--no-such-flag", "1"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.endswith("sglang serve: error: unrecognized arguments: --no-such-flag 1\n")
    with pytest.raises(SystemExit) as exc:
        parse_args(["--model-path", "/m", "--cuda-graph-max-bs", "8"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.endswith(
        "sglang serve: error: ambiguous option: --cuda-graph-max-bs could match "
        "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill\n"
    )
    with pytest.raises(SystemExit):
        parse_args(["--model-path", "/m", "--attention-backend", "nope"])
    assert "argument --attention-backend: invalid choice: 'nope'" in capsys.readouterr().err
