"""Memory planner: SGLang's pool formula, calibration to the seed node, table, recommendation, CLI."""

from __future__ import annotations

import ast
import json
import math
import os
import re
import types
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from opsctl import model_shapes, planner
from opsctl.commands.plan import plan as plan_command
from opsctl.startup_log import GIB, MIB

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "oom"
KIMI = model_shapes.preset("kimi-k2.6")
SEED_BASE = planner.PlanInputs(gpu=planner.GpuSpec(94.97, 1.56), shape=KIMI, weights_gib=74.29, tp=8)
FRACTIONS = planner.fraction_range("0.90:0.96:0.01")


def _lines(name: str) -> list[str]:
    return (FIXTURES / name).read_text().splitlines()


@pytest.fixture(scope="module")
def seed_node() -> planner.PlanInputs:
    return planner.calibrate_from_log(_lines("seed_node.log"), SEED_BASE)


def test_cell_sizes():
    assert planner.kv_cell_bytes(KIMI, 8, include_draft=False) == 70_272  # (512 + 64) * 61 * 2
    assert planner.kv_cell_bytes(model_shapes.preset("deepseek-v3"), 8) == 70_272  # MLA: no TP divisor
    assert planner.draft_cell_bytes(KIMI.draft, 8) == 2_560  # max(1, 8 // 8) * 256 * 5 * 2
    assert planner.draft_cell_bytes(KIMI.draft, 1) == 20_480
    assert planner.kv_cell_bytes(KIMI, 8) == 72_832
    fp8 = model_shapes.ModelShape("x", num_layers=61, kv_dtype_bytes=1, kv_lora_rank=512, qk_rope_head_dim=64)
    assert planner.kv_cell_bytes(fp8) == 35_136


def test_non_mla_cell_divides_heads_across_tp(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                                  "hidden_size": 4096, "torch_dtype": "bfloat16"}))
    shape = model_shapes.shape_from_hf_config(tmp_path)
    assert (shape.is_mla, shape.num_kv_heads, shape.head_dim) == (False, 8, 128)
    assert planner.kv_cell_bytes(shape, 2) == 4 * 256 * 32 * 2
    assert planner.kv_cell_bytes(shape, 16) == 1 * 256 * 32 * 2  # fewer heads than ranks: one each


def test_hf_config_mla_and_errors(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"model_type": "kimi_k2", "num_hidden_layers": 61, "kv_lora_rank": 512,
                                "qk_rope_head_dim": 64}))
    assert planner.kv_cell_bytes(model_shapes.shape_from_hf_config(good)) == 70_272
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(model_shapes.ShapeError, match="not a readable JSON config"):
        model_shapes.shape_from_hf_config(bad)
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"num_hidden_layers": 61, "kv_lora_rank": 512}))
    with pytest.raises(model_shapes.ShapeError, match="'qk_rope_head_dim' is missing"):
        model_shapes.shape_from_hf_config(partial)
    with pytest.raises(model_shapes.ShapeError, match="no such file"):
        model_shapes.shape_from_hf_config(tmp_path / "absent.json")


def test_uncalibrated_formula():
    # rest = (93.41 - 74.29) - 93.41 * 0.07 GiB; tokens = rest // 72832
    rest = int(((93.41 - 74.29) - 93.41 * (1 - 0.93)) * GIB)
    assert planner.max_total_num_tokens(0.93, SEED_BASE) == rest // 72_832 == 185_482
    paged = planner.PlanInputs(gpu=SEED_BASE.gpu, shape=KIMI, weights_gib=74.29, tp=8, page_size=64)
    assert planner.max_total_num_tokens(0.93, paged) == 185_472
    assert planner.max_total_num_tokens(0.70, SEED_BASE) == 0
    with pytest.raises(planner.PlanError, match="use a fraction above 0.796"):
        planner.rest_bytes(0.70, SEED_BASE)


def test_calibration_reproduces_195011_and_predicts_neighbours(seed_node):
    assert planner.max_total_num_tokens(0.93, seed_node) == 195_011
    assert planner.max_total_num_tokens(0.92, seed_node) == 181_240
    assert planner.max_total_num_tokens(0.94, seed_node) == 208_782
    # Each 0.01 moves the pool by pre_model_load * 0.01 / cell = 93.41 GiB * 0.01 / 72832 tokens.
    assert 208_782 - 195_011 == pytest.approx(93.41 * 0.01 * GIB / 72_832, abs=1)
    assert seed_node.post_pool_gib == pytest.approx(93.41 * 0.07 - 5.21, abs=1e-4)  # + half a cell of rounding
    assert planner.headroom_bytes(0.93, seed_node) / GIB == pytest.approx(5.21, abs=1e-4)


def test_calibration_holds_for_any_logged_count():
    lines = _lines("startup_093.log")
    for tokens in (1, 195_010, 195_011, 195_012, 250_000):
        log = [line.replace("195011", str(tokens)) for line in lines]
        assert planner.max_total_num_tokens(0.93, planner.calibrate_from_log(log, SEED_BASE)) == tokens


def test_oom_calibrates_the_spike(seed_node):
    # The OOM at 0.94 / chunk 8192 proves spike(8192) >= headroom(0.94) + tried - free. Only the
    # failed allocation (896 MiB) is known to scale with the chunk: the rest is the base, which a
    # smaller chunk does not shrink (before, halving the chunk was predicted to halve all of it).
    proven = planner.headroom_bytes(0.94, seed_node) + 896 * MIB - round(893.38 * MIB)
    assert seed_node.activation.ref_bytes == 896 * MIB
    assert seed_node.activation.base_bytes == proven - 896 * MIB
    assert planner.activation_spike_bytes(8192, seed_node) == proven
    assert planner.activation_spike_bytes(4096, seed_node) == proven - 448 * MIB
    # uncalibrated: the seed's 2.0 GiB in use while serving, and its 896 MiB buffer at 8192
    assert planner.activation_spike_bytes(8192) == 2 * GIB + 896 * MIB


def test_an_oom_with_its_fragmentation_leaves_the_seeds_base():
    """The whole message (oom_current.log: 1.40 GiB reserved but unallocated) takes the
    fragmentation out: 2.0 GiB in use besides the chunk's buffer, the default's own figure."""
    lines = _lines("startup_093.log") + _lines("oom_current.log")
    node = planner.calibrate_from_log(lines, SEED_BASE)
    assert node.activation.base_bytes / GIB == pytest.approx(2.0, abs=0.02)
    assert node.fragmentation_gib == pytest.approx(1.40)


def test_the_uncalibrated_planner_does_not_call_the_seeds_crash_safe():
    """Without the OOM in the log: 0.94 / chunk 8192 without expandable segments is what crashed
    the seed node; before, the planner's 896 MiB spike called it safe with 1.9 GiB to spare."""
    node = planner.calibrate_from_log(_lines("startup_093.log"), SEED_BASE)
    assert not planner.is_safe(0.94, 8192, node, expandable=False)
    assert planner.is_safe(0.93, 4096, node, expandable=True)  # the seed's fix
    assert not planner.is_safe(0.96, 4096, node, expandable=True)


def test_seed_table(seed_node):
    rows = planner.plan_table(seed_node, FRACTIONS, (4096, 8192), 200_000)
    got = [(r.fraction, r.tokens, round(r.headroom_bytes / GIB, 2), [c.safe for c in r.chunks]) for r in rows]
    assert got == [
        (0.90, 153_697, 8.01, [True, True]),
        (0.91, 167_469, 7.08, [True, True]),
        (0.92, 181_240, 6.14, [True, True]),
        (0.93, 195_011, 5.21, [True, True]),
        (0.94, 208_782, 4.28, [False, False]),  # the OOM's 3.40 GiB besides its buffer do not shrink
        (0.95, 222_553, 3.34, [False, False]),
        (0.96, 236_325, 2.41, [False, False]),
    ]
    assert rows[3].target_share == pytest.approx(0.975055)


def test_seed_recommendation(seed_node):
    # The seed's OOM (its message cut before the fragmentation figure) proved 3.40 GiB in use
    # besides the chunk's buffer, which 0.94 cannot leave room for with the margin; no fraction
    # of the 0.01 grid holds 200k safely, but 0.934, between its steps, does (it was reported
    # as "no safe fraction holds 200,000 tokens").
    best = planner.recommend(200_000, seed_node, FRACTIONS, (4096, 8192))
    assert (best.fraction, best.chunk, best.expandable_segments, best.tokens, best.meets_target) == (
        0.934, 8192, True, 200_519, True)
    assert planner.lowest_fraction_for(200_000, seed_node) == 0.934
    assert not planner.is_safe(0.94, 4096, seed_node) and planner.is_safe(0.934, 8192, seed_node)
    assert planner.max_total_num_tokens(0.933, seed_node) < 200_000 <= planner.max_total_num_tokens(0.934, seed_node)
    short = planner.recommend(300_000, seed_node, FRACTIONS, (4096, 8192))
    assert (short.fraction, short.chunk, short.meets_target) == (0.93, 8192, False)


def test_headroom_ladder(seed_node):
    ladder = planner.headroom_ladder(seed_node, [0.92, 0.94, 0.93])
    assert [(f, t) for f, t, _ in ladder] == [(0.94, 208_782), (0.93, 195_011), (0.92, 181_240)]


def test_default_chunk_ladder():
    assert [planner.default_chunked_prefill_size(g) for g in (16, 40, 94.97, 139.8, 180)] == [2048, 4096, 8192, 8192, 16384]


def test_fraction_range_errors():
    assert planner.fraction_range("0.90:0.92:0.01") == [0.9, 0.91, 0.92]
    assert planner.fraction_range("0.9,0.95") == [0.9, 0.95]
    # (0.9:inf:0.01 escaped as an OverflowError traceback; a step of 1e-9 built a billion rows)
    for bad in ("0.9:0.8:0.01", "a:b:c", "1.2", "0.9:0.95:0", "0.9:inf:0.01", "nan:0.95:0.01", "0.9:0.95:nan",
                "0.5:0.99:1e-9", "-1:0.5:0.1", "0.9:0.95:-inf"):
        with pytest.raises(planner.PlanError):
            planner.fraction_range(bad)


def test_log_without_a_sized_start():
    with pytest.raises(planner.PlanError, match="no engine start with a logged pool size"):
        planner.calibrate_from_log(_lines("seed_journal.log"), SEED_BASE)


# --- against the wheel's own code ---------------------------------------------------------------
# Set SGLANG_WHEEL to an sglang 0.5.23 wheel (pip download --no-deps sglang==0.5.23).
# The functions are taken out of the wheel's source with `ast` and run with stubs, so
# neither torch nor sglang is imported.

WHEEL = os.environ.get("SGLANG_WHEEL")
needs_wheel = pytest.mark.skipif(not WHEEL, reason="SGLANG_WHEEL not set")


def _function(source: str, qualname: str, namespace: dict):
    tree = ast.parse(source)
    *owners, name = qualname.split(".")
    body = tree.body
    for owner in owners:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == owner).body
    node = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == name)
    node.decorator_list = []
    module = ast.Module(body=[node], type_ignores=[])
    exec(compile(module, qualname, "exec"), namespace)
    return namespace[name]


def _read(path: str) -> str:
    with zipfile.ZipFile(WHEEL) as wheel:
        return wheel.read(path).decode()


@needs_wheel
def test_pool_formula_matches_the_wheel(seed_node):
    schedule = types.SimpleNamespace(mem_fraction_static=None, prefill_max_requests=None)
    ns = {
        "gc": types.SimpleNamespace(collect=lambda: None),
        "math": math,
        "get_available_gpu_memory": lambda *a, **k: seed_node.avail_gib,
        "get_parallel": lambda: types.SimpleNamespace(launch_world_size=8, world_group=types.SimpleNamespace(cpu_group=None)),
        "get_schedule": lambda: schedule,
        "get_exec": lambda: types.SimpleNamespace(graph=types.SimpleNamespace(cuda_graph_config=types.SimpleNamespace(
            prefill=types.SimpleNamespace(full_prefill_max_req=None, backend=None)))),
        "get_disagg": lambda: types.SimpleNamespace(disaggregation_mode="null"),
        "get_mm": lambda: types.SimpleNamespace(mm_feature_transport=None),
        "mm_runtime_reservation_gb": lambda **k: 0.0,
        "Backend": types.SimpleNamespace(FULL="full"),
    }
    profile = _function(_read("sglang/srt/mem_cache/kv_cache_configurator.py"),
                        "KVCacheConfigurator._profile_available_bytes", ns)
    pool_ns = {"MemoryPoolConfig": lambda max_total_num_tokens: max_total_num_tokens}
    sizes = _function(_read("sglang/srt/model_executor/pool_configurator.py"),
                      "DefaultPoolConfigurator.calculate_pool_sizes", pool_ns)
    fake_self = types.SimpleNamespace(device="cuda", gpu_id=0, mambaish_config=None, post_capture_kv_active=False,
                                      model_config=types.SimpleNamespace(is_multimodal=False),
                                      _fixed_overhead_bytes=0, _cell_size=seed_node.cell_bytes, _zero_kv_max_tokens=0)
    for fraction in FRACTIONS:
        schedule.mem_fraction_static = fraction
        available = profile(fake_self, seed_node.pre_gib)
        assert available == planner.rest_bytes(fraction, seed_node)
        assert sizes(fake_self, available, 1) == planner.max_total_num_tokens(fraction, seed_node)


@needs_wheel
def test_dflash_cell_matches_the_wheel():
    source = _read("sglang/srt/speculative/dflash_utils.py")
    torch_stub = types.SimpleNamespace(_utils=types.SimpleNamespace(_element_size=lambda dtype: dtype))
    ns = {"torch": torch_stub, "Optional": object, "Any": object}
    draft_fn = _function(source, "dflash_draft_cell_size_per_token", ns)
    scale_fn = _function(source, "scale_kv_cell_size_per_token_for_dflash", ns)
    draft = KIMI.draft
    config = types.SimpleNamespace(get_num_kv_heads=lambda tp: max(1, draft.num_kv_heads // tp),
                                   head_dim=draft.head_dim, v_head_dim=draft.v_head_dim)
    for tp in (1, 2, 8, 16):
        draft_cell = draft_fn(draft_model_config=config, draft_num_layers=draft.num_layers, draft_kv_cache_dtype=2, tp_size=tp)
        assert draft_cell == planner.draft_cell_bytes(draft, tp)
        total = scale_fn(target_cell_size_per_token=70_272, target_num_layers=61,
                         draft_num_layers=draft.num_layers, draft_cell_size_per_token=draft_cell)
        assert total == planner.kv_cell_bytes(KIMI, tp)


# --- CLI ---------------------------------------------------------------------------------------


def test_cli_seed_node_table():
    result = CliRunner().invoke(plan_command, ["--model", "kimi-k2.6", "--calibrate-log", str(FIXTURES / "seed_node.log")])
    assert result.exit_code == 0, result.output
    assert "195,011" in result.output and "208,782" in result.output
    assert "Recommended: --mem-fraction-static 0.934 --chunked-prefill-size 8192" in result.output.replace("\n", " ")
    assert "safe: spike + 0.5 GiB margin <= headroom" in result.output
    assert re.search(r"│\s+0\.934 │\s+200,519 │", result.output)  # the recommended fraction has its row


def test_the_target_is_the_nodes_own(tmp_path, monkeypatch):
    """On a node whose config targets 185,000 tokens (production), plan judged by 200,000 while
    status, oom and restart judged by 185,000."""
    config = tmp_path / "opsctl.yml"
    config.write_text("context_target: 185000\n")
    monkeypatch.setenv("OPSCTL_CONFIG", str(config))
    result = CliRunner().invoke(plan_command, ["--calibrate-log", str(FIXTURES / "seed_node.log")], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "target 185,000 tokens" in result.output
    assert "Recommended: --mem-fraction-static 0.923 --chunked-prefill-size 8192" in result.output.replace("\n", " ")
    given = CliRunner().invoke(plan_command, ["--calibrate-log", str(FIXTURES / "seed_node.log"),
                                              "--context-target", "200000"], terminal_width=200)
    assert "target 200,000 tokens" in given.output


def test_cli_json():
    result = CliRunner().invoke(plan_command, ["--gpu-mem-gib", "94.97", "--weights-gib", "74.29", "--tp", "8",
                                               "--non-torch-gib", "1.56", "--chunk", "4096", "--json"])
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["cell_bytes"] == 72_832
    assert [row["tokens"] for row in data["rows"]][3] == 185_482
    assert data["rows"][0]["chunks"][0]["chunk"] == 4096


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "kimi-k2.6"], "give --gpu-mem-gib, --weights-gib and --tp"),
        (["--model", "kimi-k2.6", "--config", "x.json", "--gpu-mem-gib", "94", "--weights-gib", "70"], "give --model or --config, not both"),
        (["--config", "/nonexistent/config.json", "--gpu-mem-gib", "94", "--weights-gib", "70"], "no such file"),
        (["--gpu-mem-gib", "94", "--weights-gib", "70", "--fractions", "0.9:0.8:0.01"], "bad fraction range"),
        (["--gpu-mem-gib", "94", "--weights-gib", "95", "--tp", "8"], "do not fit"),
        (["--gpu-mem-gib", "94.97", "--weights-gib", "74.29"], "--weights-gib and --tp (the KV cell per GPU depends on it)"),
        (["--model", "llama"], "Invalid value for '--model'"),
        (["--calibrate-log", "/nonexistent/node.log"], "cannot read /nonexistent/node.log"),
    ],
)
def test_cli_usage_errors(args, message):
    result = CliRunner().invoke(plan_command, args)
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_cli_log_without_startup_is_an_error():
    result = CliRunner().invoke(plan_command, ["--calibrate-log", str(FIXTURES / "seed_journal.log")])
    assert result.exit_code == 2  # a usage error, as the README says
    assert "no engine start with a logged pool size" in result.output


def _plan_tokens(args):
    result = CliRunner().invoke(plan_command, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return {round(row["fraction"], 3): row["tokens"] for row in json.loads(result.output)["rows"]}


def test_a_bf16_nodes_log_plans_an_fp8_pool_at_twice_the_tokens():
    """The README's command: the free memory is solved with the logged engine's cell (bf16),
    the pool planned with fp8's, the draft's too (SGLang gives the DFlash draft the target's KV
    dtype). Before, the calibration reproduced the log's count whatever dtype was asked for."""
    log = str(FIXTURES / "startup_093.log")
    bf16 = _plan_tokens(["--calibrate-log", log, "--fractions", "0.93"])
    fp8 = _plan_tokens(["--calibrate-log", log, "--kv-dtype", "fp8_e4m3", "--fractions", "0.93"])
    assert bf16[0.93] == 195_011
    assert abs(fp8[0.93] - 2 * 195_011) <= 1  # (the pool is centred in the byte interval of the logged count)


def test_an_fp8_nodes_log_is_planned_in_fp8(tmp_path):
    """An fp8 node's own log, without --kv-dtype: its count is reproduced and the neighbouring
    fractions move at fp8's rate, twice bf16's (before: at bf16's)."""
    text = (FIXTURES / "startup_093.log").read_text()
    assert "dtype: torch.bfloat16, #tokens: 195011" in text and "kv_cache_dtype='auto'" in text
    fp8_log = tmp_path / "fp8.log"
    fp8_log.write_text(text.replace("torch.bfloat16", "torch.float8_e4m3fn").replace("195011", "390022")
                       .replace("kv_cache_dtype='auto'", "kv_cache_dtype='fp8_e4m3'"))
    bf16 = _plan_tokens(["--calibrate-log", str(FIXTURES / "startup_093.log"), "--fractions", "0.93,0.94"])
    fp8 = _plan_tokens(["--calibrate-log", str(fp8_log), "--fractions", "0.93,0.94"])
    assert fp8[0.93] == 390_022
    assert abs((fp8[0.94] - fp8[0.93]) - 2 * (bf16[0.94] - bf16[0.93])) <= 2


def test_the_table_shows_fractions_as_given():
    result = CliRunner().invoke(plan_command, ["--calibrate-log", str(FIXTURES / "startup_093.log"),
                                               "--fractions", "0.930:0.936:0.002"])
    assert result.exit_code == 0
    assert all(f in result.output for f in ("0.93 ", "0.932", "0.934", "0.936"))


def test_a_float32_checkpoint_has_a_2_byte_kv_cache(tmp_path):
    """SGLang serves a float32 checkpoint in float16 under --kv-cache-dtype auto
    (`_get_and_verify_dtype`), so its KV cache takes 2 bytes an element, not 4."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
                                  "hidden_size": 2048, "torch_dtype": "float32"}))
    assert model_shapes.shape_from_hf_config(config).kv_dtype_bytes == 2
    assert model_shapes.shape_from_hf_config(config, kv_dtype="fp8_e4m3").kv_dtype_bytes == 1


def test_a_log_with_no_memory_before_the_weights_is_a_clear_error():
    lines = [line.replace("Load weight begin. avail mem=93.41 GB", "Load weight begin. avail mem=0.00 GB")
             for line in _lines("startup_093.log")]
    with pytest.raises(planner.PlanError, match="leaves nothing to size a pool from"):  # (was ZeroDivisionError)
        planner.calibrate_from_log(lines, SEED_BASE)
