"""Parsing SGLang's startup lines and the journal/engine prefixes around them."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsctl.startup_log import (
    EngineConfig,
    expandable_segments_from_env,
    last_sized_startup,
    parse_line,
    parse_server_args,
    parse_startups,
    split_records,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "oom"


def test_journal_short_line_with_engine_prefix():
    line = parse_line("May 31 10:05:32 dflash-train python[10990]: [2026-05-31 10:05:32 TP0] Scheduler hit an exception: x")
    assert (line.time, line.journal_time, line.host, line.ident, line.pid, line.tp_rank, line.engine_record) == (
        "2026-05-31 10:05:32", "May 31 10:05:32", "dflash-train", "python", 10990, 0, True)
    assert line.msg == "Scheduler hit an exception: x"


def test_short_iso_and_raw_lines():
    iso = parse_line("2026-05-29T14:02:11+0000 gpu-node-3 python3[4411]:   File \"x.py\", line 1")
    assert (iso.time, iso.pid, iso.engine_record, iso.msg) == ("2026-05-29T14:02:11+0000", 4411, False, '  File "x.py", line 1')
    raw = parse_line("[2026-05-27 16:40:02 DP0 TP5 EP5] hello")
    assert (raw.time, raw.tp_rank, raw.pid, raw.msg) == ("2026-05-27 16:40:02", 5, None, "hello")


def test_pasted_excerpt_is_split_into_records():
    flat = " ".join((FIXTURES / "seed_journal.log").read_text().splitlines())
    records = split_records(flat)
    assert len(records) == 2
    assert records[1].startswith("May 31 10:05:32 dflash-train python[10990]: torch.OutOfMemoryError")


def test_server_args_repr_and_dict_forms():
    old = parse_server_args("server_args=ServerArgs(model_path='/m', mem_fraction_static=0.93, chunked_prefill_size=4096, "
                            "tp_size=8, page_size=1, speculative_algorithm='DFLASH', kv_cache_dtype='auto')")
    assert old == EngineConfig(mem_fraction_static=0.93, chunked_prefill_size=4096, tp_size=8, page_size=1,
                               speculative_algorithm="DFLASH", kv_cache_dtype="auto", model_path="/m")
    new = parse_server_args("server_args={'tp_size': 8, 'mem_fraction_static': 0.94, 'chunked_prefill_size': 8192, "
                            "'speculative_algorithm': None}")
    assert (new.mem_fraction_static, new.chunked_prefill_size, new.tp_size, new.speculative_algorithm) == (0.94, 8192, 8, None)
    assert parse_server_args("no args here") is None
    broken = parse_server_args("server_args=ServerArgs(mem_fraction_static=oops, chunked_prefill_size=None")
    assert (broken.mem_fraction_static, broken.chunked_prefill_size) == (None, None)


def test_expandable_segments_env():
    assert expandable_segments_from_env("expandable_segments:True") is True
    assert expandable_segments_from_env("max_split_size_mb:128,expandable_segments:False") is False
    assert expandable_segments_from_env("max_split_size_mb:128") is False
    assert expandable_segments_from_env(None) is None


def test_startup_figures_of_the_093_start():
    facts = last_sized_startup((FIXTURES / "startup_093.log").read_text().splitlines())
    assert facts is not None
    assert (facts.load_begin_avail_gib, facts.load_end_avail_gib, facts.weights_gib) == (93.41, 19.12, 74.29)
    assert (facts.kv_tokens, facts.kv_size_gib, facts.kv_dtype) == (195011, 12.76, "torch.bfloat16")
    assert (facts.pool_end_avail_gib, facts.graph_gib, facts.graph_end_avail_gib) == (5.93, 0.71, 5.21)
    assert (facts.max_total_num_tokens, facts.chunked_prefill_size, facts.context_len) == (195011, 4096, 200000)
    assert facts.available_gpu_mem_gib == 5.21 and facts.ready
    assert (facts.config.mem_fraction_static, facts.config.tp_size, facts.config.speculative_algorithm) == (0.93, 8, "DFLASH")


def test_two_starts_in_one_log_and_new_graph_line_format():
    lines = (FIXTURES / "seed_node.log").read_text().splitlines()
    runs = parse_startups(lines)
    assert [run.config.mem_fraction_static for run in runs] == [0.94, 0.93]
    assert runs[0].ready and runs[0].tokens is None and runs[1].tokens == 195011
    new = parse_startups(["[2026-01-01 00:00:00 TP0] Capture decode CUDA graph end. elapsed=3.10 s, mem usage=0.42 GB, avail mem=6.00 GB.",
                          "[2026-01-01 00:00:01 TP0] max_total_num_tokens=1000, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=48, context_len=4096, available_gpu_mem=5.50 GB"])
    assert (new[0].graph_gib, new[0].graph_end_avail_gib, new[0].available_gpu_mem_gib) == (0.42, 6.0, 5.5)


def test_garbage_never_raises():
    assert parse_startups((FIXTURES / "garbage.log").read_text(errors="replace").splitlines())[0].tokens is None


@pytest.mark.parametrize("line, rank", [
    ("[2026-05-31 10:05:32 DP0 ATTN_CP0 TP3] Load weight begin. avail mem=93.41 GB", 3),
    ("[2026-05-31 10:05:32 MOE_DP0 TP1 EP1] Load weight begin. avail mem=93.41 GB", 1),
    ("[2026-05-31 10:05:32.123 TP0] Load weight begin. avail mem=93.41 GB", 0),  # SGLANG_LOG_MS
])
def test_every_prefix_sglang_writes_is_an_engine_record(line, rank):
    """configure_logger's ranks include ATTN_CP and MOE_DP, and SGLANG_LOG_MS adds milliseconds:
    unrecognised, such lines were taken for a traceback's continuation."""
    from opsctl.startup_log import iter_log_lines

    [record] = list(iter_log_lines([line]))
    assert record.engine_record and record.tp_rank == rank
    assert record.msg == "Load weight begin. avail mem=93.41 GB"
