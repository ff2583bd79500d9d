"""Our rendered SGLang flags and the facts in docs/reference against the real
SGLang 0.5.23 parser (built by scripts/sglang-real-env.sh into .venv-sglang)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import real_parser  # sibling module (rootdir-less test dir is on sys.path)

pytestmark = [
    pytest.mark.sglang_real,
    pytest.mark.skipif(
        not real_parser.available(),
        reason=f"{real_parser.VENV_DIR.name} missing: run scripts/sglang-real-env.sh first",
    ),
]

REPO_ROOT = Path(__file__).resolve().parents[2]

def production_argv(**overrides) -> list[str]:
    """The flags opsctl renders into the engine unit (the sglang role's defaults, then overrides)."""
    from opsctl.render import engine_argv

    return engine_argv(**overrides)


# The unit with every optional switch of the template on (a benchmark node's radix cache off).
EVERY_SWITCH = dict(sglang_disable_radix_cache=True, sglang_trust_remote_code=True, sglang_enable_metrics=True)


def expected_values(argv: list[str]) -> dict[str, object]:
    """What each flag of argv should parse to: "--a-b v" -> {"a_b": v}, "--flag" -> True."""
    out: dict[str, object] = {}
    i = 0
    while i < len(argv):
        dest = argv[i].lstrip("-").replace("-", "_")
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[dest] = argv[i + 1]
            i += 2
        else:
            out[dest] = True
            i += 1
    return out


def _same(parsed: object, written: object) -> bool:
    if written is True:
        return parsed is True
    if isinstance(parsed, bool):
        return False
    if isinstance(parsed, (int, float)):
        return float(parsed) == float(written)  # type: ignore[arg-type]
    return str(parsed) == written


@pytest.fixture(scope="module")
def real():
    argvs = {
        "ours": production_argv(),
        "every_switch": production_argv(**EVERY_SWITCH),
        "tp_alias": ["--model-path", "m", "--tp", "4"],
        "cuda_graph_max_bs": ["--model-path", "m", "--cuda-graph-max-bs", "48"],
        "cuda_graph_max_bs_decode": ["--model-path", "m", "--cuda-graph-max-bs-decode", "48"],
        "unknown": ["--model-path", "m", "--no-such-flag"],
        "bad_choice": ["--model-path", "m", "--attention-backend", "nope"],
        "defaults": ["--model-path", "m"],
        "api_key": ["--model-path", "m", "--api-key", "sk-SECRET-1234"],
    }
    names = list(argvs)
    results = real_parser.parse_many([argvs[n] for n in names])
    return {n: (argvs[n], r) for n, r in zip(names, results, strict=True)}


def test_real_parser_is_0_5_23():
    assert real_parser.version() == "0.5.23"


@pytest.mark.parametrize("which", ["ours", "every_switch"])
def test_rendered_flags_accepted_with_meant_values(real, which):
    argv, res = real[which]
    assert res["ok"], res
    ns = res["namespace"]
    for dest, want in expected_values(argv).items():
        assert dest in ns, f"--{dest} parsed into no field of the same name"
        assert _same(ns[dest], want), f"{dest}: parsed {ns[dest]!r}, rendered {want!r}"


def test_tp_is_alias_of_tp_size(real):
    _, res = real["tp_alias"]
    assert res["ok"], res
    assert res["namespace"]["tp_size"] == 4


def test_cuda_graph_max_bs_is_ambiguous(real):
    _, res = real["cuda_graph_max_bs"]
    assert not res["ok"] and res["exit_code"] == 2
    assert "ambiguous option: --cuda-graph-max-bs" in res["error"]
    _, ok = real["cuda_graph_max_bs_decode"]
    assert ok["ok"], ok


@pytest.mark.parametrize(
    "which,fragment",
    [("unknown", "unrecognized arguments: --no-such-flag"), ("bad_choice", "invalid choice")],
)
def test_bad_argv_exits_2(real, which, fragment):
    _, res = real[which]
    assert not res["ok"] and res["exit_code"] == 2
    assert fragment in res["error"]


def test_parse_time_defaults_are_unresolved(real):
    # The GPU-dependent defaults are filled in at resolution time, not by argparse.
    ns = real["defaults"][1]["namespace"]
    assert ns["chunked_prefill_size"] is None
    assert ns["mem_fraction_static"] is None
    assert ns["api_key"] is None


GIB = 1024.0


CHUNKED_CASES = [
    (16, 2048), (24, 4096), (48, 4096), (80, 8192), (94.97, 8192), (139.8, 8192), (180, 16384)
]  # fmt: skip
FRACTION_CASES = [
    (94.97, 8, []),
    (94.97, 8, ["--chunked-prefill-size", "4096"]),
    (94.97, 1, ["--max-running-requests", "48"]),
    (139.8, 8, []),
    (40, 2, []),
]


@pytest.fixture(scope="module")
def memory():
    """Real handle_gpu_memory_settings() results, all cases in one subprocess."""
    chunked = [(["--model-path", "m", "--tp", "8"], g * GIB) for g, _ in CHUNKED_CASES]
    fraction = [(["--model-path", "m", "--tp", str(tp), *extra], g * GIB) for g, tp, extra in FRACTION_CASES]
    res = real_parser.memory_defaults_many(chunked + fraction)
    return res[: len(chunked)], res[len(chunked) :]


@pytest.mark.parametrize("i", range(len(CHUNKED_CASES)))
def test_default_chunked_prefill_by_gpu_memory(memory, i):
    res = memory[0][i]
    assert res["ok"], res
    assert res["chunked_prefill_size"] == CHUNKED_CASES[i][1], CHUNKED_CASES[i]


def _doc_fraction(gpu_mib, chunked, tp, decode_max_bs, mla):
    # docs/reference formula: reserved = 512 + max(chunked,2048)*1.5 + tp*pp/8*1024
    # + cuda-graph reserve (decode max_bs * 2; prefill graphs are off by default),
    # at least 10 GiB on GPUs over 60 GiB.
    reserved = 512 + max(chunked, 2048) * 1.5 + tp / 8 * 1024 + decode_max_bs * 2
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mib - reserved) / gpu_mib, 3)


@pytest.mark.parametrize("i", range(len(FRACTION_CASES)))
def test_default_mem_fraction_matches_doc_formula(memory, i):
    gpu_gib, tp, _ = FRACTION_CASES[i]
    gpu_mib = gpu_gib * GIB
    res = memory[1][i]
    assert res["ok"], res
    want = _doc_fraction(gpu_mib, res["chunked_prefill_size"], tp, res["decode_cuda_graph_max_bs"], mla=True)
    assert res["mem_fraction_static"] == pytest.approx(want, abs=1e-9), res


def test_api_key_has_no_env_alternative_and_is_not_redacted(real, tmp_path):
    secret = "sk-SECRET-1234"
    _, res = real["api_key"]
    assert res["ok"], res
    assert res["namespace"]["api_key"] == secret
    # repr(ServerArgs) hides only watermark secrets; launch_command (shown by
    # /server_info) redacts only --watermark-config.
    assert secret in res["repr"]
    assert secret in res["launch_command"]
    # No environment variable is read for it.
    from_env = real_parser.parse_many(
        [["--model-path", "m"]], env={"SGLANG_API_KEY": secret, "API_KEY": secret}
    )[0]
    assert from_env["namespace"]["api_key"] is None
    # --config FILE keeps it off the command line, but the merged argv (and so
    # launch_command) carries it again.
    cfg = tmp_path / "sglang.yaml"
    cfg.write_text(f"api-key: {secret}\n")
    via_config = real_parser.parse_many([["--model-path", "m", "--config", str(cfg)]])[0]
    assert via_config["ok"], via_config
    assert secret in via_config["launch_command"]


# --- engine simulator vs real parser ---------------------------------------

SIM_DIR = REPO_ROOT / "images" / "engine-sim"


def _sim_parse(argv: list[str]) -> tuple[bool, int | None]:
    """(accepted, exit_code) from the simulator's own parser."""
    if str(SIM_DIR) not in sys.path:
        sys.path.insert(0, str(SIM_DIR))
    args = importlib.import_module("sglang_sim.args")
    try:
        import contextlib
        import io

        with contextlib.redirect_stderr(io.StringIO()):
            args.parse_args(list(argv))
    except SystemExit as exc:
        return False, exc.code
    return True, 0


def compare_with_sim(argvs: list[list[str]]) -> list[tuple[list[str], dict, tuple[bool, int | None]]]:
    """For each argv: (argv, real result, (sim accepted, sim exit code))."""
    real = real_parser.parse_many(argvs)
    return [(a, r, _sim_parse(a)) for a, r in zip(argvs, real, strict=True)]


@pytest.mark.skipif(not (SIM_DIR / "sglang_sim" / "args.py").exists(), reason="engine simulator not present")
def test_simulator_parser_agrees_with_real(real):
    argvs = [
        production_argv(),
        production_argv(**EVERY_SWITCH),
        ["--model-path", "m", "--tp", "4"],
        ["--model-path", "m", "--no-such-flag"],
        ["--model-path", "m", "--cuda-graph-max-bs", "48"],
        ["--model-path", "m", "--cuda-graph-max-bs-decode", "48"],
        ["--model-path", "m", "--attention-backend", "nope"],
        ["--model-path", "m", "--speculative-algorithm", "DDTREE"],
        ["--model-path", "m", "--api-key", "k"],
    ]
    for argv, res, (sim_ok, sim_code) in compare_with_sim(argvs):
        assert sim_ok == res["ok"], (argv, res, sim_code)
        if not sim_ok:
            assert sim_code == res["exit_code"] == 2, (argv, res, sim_code)
