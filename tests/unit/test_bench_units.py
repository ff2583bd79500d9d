"""Pure parts of `opsctl bench`: prompts, floor, sample arithmetic, fit, report, compare."""

from __future__ import annotations

import csv

import pytest

from opsctl.bench import floor, prompts, report
from opsctl.bench.client import Chunk, StreamResult
from opsctl.bench.runner import (
    PointResult,
    RunResult,
    SettingsMismatch,
    SweepSettings,
    aggregate,
    check_resumable,
    default_timeout_s,
    fit_step_time,
    load_result,
    save_result,
    summarize,
)


@pytest.mark.parametrize(
    ("text", "tokens"),
    [("1k", 1000), ("1.4k", 1400), ("185k", 185000), ("32000", 32000), (" 8K ", 8000), ("1m", 1_000_000)],
)
def test_parse_context(text, tokens):
    assert prompts.parse_context(text) == tokens


@pytest.mark.parametrize("text", ["", "k", "8x", "-1k", "8"])
def test_parse_context_refuses(text):
    with pytest.raises(ValueError):
        prompts.parse_context(text)


def test_parse_contexts_keeps_order_and_refuses_duplicates():
    assert prompts.parse_contexts("1k,8k,32k,64k,128k,185k") == [1000, 8000, 32000, 64000, 128000, 185000]
    with pytest.raises(ValueError, match="duplicate"):
        prompts.parse_contexts("8k,8000")


@pytest.mark.parametrize(
    ("tokens", "label"), [(1400, "1.4k"), (11000, "11k"), (185000, "185k"), (1000, "1k"), (512, "512")]
)
def test_format_context(tokens, label):
    assert prompts.format_context(tokens) == label


def test_input_ids_exact_length_and_unique_from_first_token():
    a = prompts.make_input_ids(32000, "aaaa")
    b = prompts.make_input_ids(32000, "bbbb")
    assert len(a) == len(b) == 32000
    assert a[0] != b[0]  # the nonce leads: no common prefix for a radix cache
    assert a[prompts.NONCE_TOKENS :] == b[prompts.NONCE_TOKENS :]  # same filler: same content
    assert all(prompts.TOKEN_ID_LOW <= t < prompts.TOKEN_ID_HIGH for t in a)


def test_text_prompt_word_count_and_nonce_first():
    text = prompts.make_text(1000, "c0ffee")
    words = text.split()
    assert len(words) == 1000
    assert words[0] == "c0ffee"


def test_floor_kimi_k2_on_rtx_pro_6000():
    assert floor.KIMI_K2_KV_CELL_BYTES == 70_272
    f = floor.make_floor("rtx-pro-6000")
    # 185k tokens * 70,272 B = 13.0 GB per step; over 1.79 TB/s = 7.26 ms.
    assert f.step_ms(185_000) == pytest.approx(185_000 * 70_272 / 1.79e12 * 1e3)
    assert f.step_ms(185_000) == pytest.approx(7.263, abs=1e-3)
    assert f.ms_per_1k() == pytest.approx(0.03926, abs=1e-5)


def test_floor_bandwidth_override_and_unknown_gpu():
    assert floor.make_floor("h200").bandwidth_tbs == 4.8
    f = floor.make_floor("h200", bandwidth_tbs=4.24)
    assert f.bandwidth_tbs == 4.24 and "4.24" in f.label
    with pytest.raises(ValueError, match="unknown GPU"):
        floor.make_floor("a100")


def _stream(t_send, chunks, **meta):
    return StreamResult(
        t_send=t_send, t_end=chunks[-1][0], chunks=[Chunk(t, n, v) for t, n, v in chunks], meta=meta
    )


def test_summarize_plain_decode():
    # First token at 2.0 s, then 31 more tokens one per 50 ms.
    chunks = [(2.0 + 0.05 * i, i + 1, None) for i in range(32)]
    s = summarize(
        _stream(0.0, chunks, prompt_tokens=8000, completion_tokens=32, cached_tokens=0), 8000, 0, 8000, 32
    )
    assert s.ttft_s == pytest.approx(2.0)
    assert s.prefill_tok_s == pytest.approx(4000)
    assert s.decode_tok_s == pytest.approx(20.0)  # (32 - 1) / (31 * 0.05 s)
    assert s.step_ms == pytest.approx(50.0)
    assert s.accept_length is None
    assert s.decode_ctx_mean == pytest.approx(8000 + (1 + 32 - 1) / 2)
    assert s.flags == []


def test_summarize_speculative_uses_verify_count():
    # 3 tokens per verify step, 30 ms per step; the first chunk came with the prefill.
    chunks = [(1.0 + 0.03 * i, 1 + 3 * i, i) for i in range(11)]
    s = summarize(
        _stream(
            0.0,
            chunks,
            prompt_tokens=1000,
            completion_tokens=31,
            cached_tokens=0,
            spec_verify_ct=10,
            spec_accept_length=3.1,
        ),
        1000,
        0,
        1000,
        31,
    )
    assert s.step_ms == pytest.approx(30.0)
    assert s.decode_tok_s == pytest.approx(100.0)
    assert s.accept_length == pytest.approx(3.1)


def test_summarize_flags_cache_hits_mismatch_and_short_output():
    chunks = [(1.0, 1, None), (1.1, 2, None)]
    s = summarize(
        _stream(0.0, chunks, prompt_tokens=990, completion_tokens=2, cached_tokens=512), 1000, 0, 1000, 8
    )
    assert s.flags == ["cached", "prompt_mismatch", "short_output"]
    assert not s.valid
    ok = summarize(
        _stream(0.0, chunks, prompt_tokens=990, completion_tokens=2, cached_tokens=0), 1000, 0, 1000, 2, 0.02
    )
    assert ok.flags == []  # within the 2% text tolerance


def _sample(ttft, step_ms, cached=0, ctx=8000):
    chunks = [(ttft + step_ms / 1e3 * i, i + 1, None) for i in range(8)]
    return summarize(
        _stream(0.0, chunks, prompt_tokens=ctx, completion_tokens=8, cached_tokens=cached), ctx, 0, ctx, 8
    )


def test_aggregate_medians_spread_and_cached_left_out():
    samples = [_sample(1.0, 10), _sample(1.2, 12), _sample(3.0, 40), _sample(0.01, 1, cached=7990)]
    p = aggregate(8000, samples)
    assert p.status == "ok" and p.n_valid == 3
    assert p.ttft_s == pytest.approx(1.2)
    assert p.step_ms == pytest.approx(12)
    assert p.spread["step_ms"] == pytest.approx([10, 40])
    only_cached = aggregate(8000, [_sample(0.01, 1, cached=7990)])
    assert only_cached.status == "cached" and only_cached.step_ms is None


def test_fit_recovers_line():
    points = [
        PointResult(c, "ok", decode_ctx_mean=c, step_ms=8.4 + 7.7 * c / 1000)
        for c in (1000, 8000, 32000, 128000)
    ]
    fit = fit_step_time(points)
    assert fit["ms_per_1k"] == pytest.approx(7.7)
    assert fit["ms_at_zero"] == pytest.approx(8.4)
    assert fit["r2"] == pytest.approx(1.0)
    assert fit_step_time(points[:1]) is None


def test_timeout_scales_with_context_and_history():
    assert default_timeout_s(185_000, 24) > 6.4 * 60 + 24 * 1.43  # the seed's slowest point fits
    assert default_timeout_s(1000, 32) < default_timeout_s(32000, 32) < default_timeout_s(128000, 32)
    prior = [PointResult(8000, "ok", prompt_tokens=8000, ttft_s=0.1, step_ms=1.0)]
    # 16k after 8k: 4 * (0.1 * 4 + 32 * 0.002) s, but at least 60 s.
    assert default_timeout_s(16000, 32, prior) == 60.0
    prior[0].ttft_s = 100.0
    assert default_timeout_s(16000, 32, prior) == pytest.approx(4 * (400 + 32 * 0.002))


def _result(step_by_ctx, ttft_by_ctx, gen=32):
    points = [
        PointResult(
            c,
            "ok",
            n_valid=1,
            prompt_tokens=c,
            decode_ctx_mean=c + 16,
            ttft_s=ttft_by_ctx[c],
            prefill_tok_s=c / ttft_by_ctx[c],
            decode_tok_s=1e3 / step_by_ctx[c],
            step_ms=step_by_ctx[c],
        )
        for c in step_by_ctx
    ]
    r = RunResult(SweepSettings(contexts=list(step_by_ctx), gen=gen), meta={}, points=points)
    r.floor = floor.make_floor("rtx-pro-6000").to_dict()
    r.fit = fit_step_time(points)
    return r


def test_compare_ratios_and_geomean():
    a = _result({1000: 10.0, 8000: 50.0}, {1000: 0.5, 8000: 4.0})
    b = _result({1000: 5.0, 8000: 12.5}, {1000: 0.5, 8000: 2.0})
    cmp = report.compare(a, b)
    assert [r["step_ms_ratio"] for r in cmp["points"]] == pytest.approx([0.5, 0.25])
    assert [r["ttft_s_ratio"] for r in cmp["points"]] == pytest.approx([1.0, 0.5])
    assert [r["decode_tok_s_ratio"] for r in cmp["points"]] == pytest.approx([2.0, 4.0])
    assert cmp["geomean_ratio"]["step_ms"] == pytest.approx((0.5 * 0.25) ** 0.5)
    assert cmp["warnings"] == []
    c = _result({1000: 5.0, 32000: 100.0}, {1000: 0.5, 32000: 9.0}, gen=64)
    cmp2 = report.compare(a, c)
    assert len(cmp2["points"]) == 1
    assert "gen differs: A 32, B 64" in cmp2["warnings"]
    assert any("8k only in A" in w and "32k only in B" in w for w in cmp2["warnings"])


def test_markdown_table_has_the_seeds_shape():
    r = _result({1400: 8.4, 11000: 50.0, 185000: 1430.0}, {1400: 0.46, 11000: 4.3, 185000: 384.0})
    md = report.markdown_table(r).splitlines()
    assert md[0] == "| actual ctx | TTFT | prefill tok/s | decode tok/s | ms/step | floor ms/step | × floor |"
    assert md[2].startswith("| 1.4k | 0.46s | 3043 | 119.0 | 8.4 | 0.06 |")
    assert md[3].startswith("| 11k | 4.3s | 2558 | 20.0 | 50 |")
    assert md[4].startswith("| 185k | 6.4 min | 482 | 0.7 | 1430 | 7.26 | 197× |")


def test_csv_and_json_round_trip(tmp_path):
    r = _result({1000: 10.0, 8000: 50.0}, {1000: 0.5, 8000: 4.0})
    report.write_csv(r, tmp_path / "r.csv")
    with open(tmp_path / "r.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [int(x["context_requested"]) for x in rows] == [1000, 8000]
    assert float(rows[1]["step_ms"]) == 50.0
    assert float(rows[1]["floor_step_ms"]) == pytest.approx(floor.make_floor("rtx-pro-6000").step_ms(8016))
    save_result(r, tmp_path / "r.json")
    back = load_result(tmp_path / "r.json")
    assert back.settings == r.settings
    assert [p.step_ms for p in back.points] == [10.0, 50.0]
    assert not list(tmp_path.glob(".*.tmp"))  # the atomic write left no temp file


def test_resume_refuses_other_settings():
    r = _result({1000: 10.0}, {1000: 0.5})
    check_resumable(r, SweepSettings(contexts=[1000], gen=32))
    with pytest.raises(SettingsMismatch, match="gen: file has 32, asked 64"):
        check_resumable(r, SweepSettings(contexts=[1000], gen=64))


def test_to_model_time_divides_out_the_simulator_factor():
    r = _result({1000: 2.0, 8000: 10.0}, {1000: 0.1, 8000: 1.0})
    m = report.to_model_time(r, 0.25)
    assert [p.step_ms for p in m.points] == [8.0, 40.0]
    assert [p.ttft_s for p in m.points] == [0.4, 4.0]
    assert m.points[1].prefill_tok_s == pytest.approx(8000 / 4.0)
    assert m.points[1].decode_tok_s == pytest.approx(25.0)
    assert m.fit["ms_per_1k"] == pytest.approx(r.fit["ms_per_1k"] * 4)
    assert m.meta["time_factor"] == 0.25
    assert [p.step_ms for p in r.points] == [2.0, 10.0]  # the original is untouched


def test_the_results_meta_hides_the_engines_secrets():
    """SGLang 0.5.23's /server_info is its resolved server_args, API keys in clear (also in each
    internal state): `bench run` wrote them into its results file, which is shared and committed."""
    import json

    from opsctl.bench.client import BenchClient
    from opsctl.bench.runner import collect_meta

    info = {"version": "0.5.23", "api_key": "sk-live-1", "admin_api_key": "adm-2", "ssl_keyfile_password": None,
            "max_total_num_tokens": 195011, "tokenizer_path": "/models/Kimi-K2.6",
            "launch_command": "python3 -m sglang.launch_server --api-key sk-live-1 --tp 8",
            "internal_states": [{"api_key": "sk-live-1", "avg_spec_accept_length": 3.1}]}
    with BenchClient("http://127.0.0.1:9") as client:
        meta = collect_meta(client, info)
    text = json.dumps(meta)
    assert "sk-live-1" not in text and "adm-2" not in text
    assert meta["server_args"]["api_key"] == "***" and meta["server_args"]["ssl_keyfile_password"] is None
    assert meta["server_args"]["launch_command"] == "python3 -m sglang.launch_server --api-key *** --tp 8"
    assert meta["server_args"]["max_total_num_tokens"] == 195011  # (a field named like tokens is no secret)
    assert meta["internal_states"] == [{"api_key": "***", "avg_spec_accept_length": 3.1}]
