"""opsctl status where it cannot look: an unreadable config, and GPUs that answer "[N/A]"."""

import dataclasses
import json

import pytest
from click.testing import CliRunner

from opsctl.cli import cli
from opsctl.commands import status


def test_an_unreadable_config_is_unknown_with_a_reason(tmp_path, monkeypatch):
    config = tmp_path / "opsctl.yml"
    config.write_text("env_file: [unclosed\n")
    monkeypatch.setenv("OPSCTL_CONFIG", str(config))
    result = CliRunner().invoke(cli, ["status", "--json"])
    assert result.exit_code == 3  # Nagios UNKNOWN, not 1 (which monitoring reads as WARNING)
    report = json.loads(result.output)
    assert report["level"] == "UNKNOWN" and "is not valid YAML" in report["problems"][0]
    human = CliRunner().invoke(cli, ["status"])
    assert human.exit_code == 3 and "UNKNOWN" in human.output and "not valid YAML" in human.output


def test_an_unknown_model_preset_is_refused_with_what_to_do(tmp_path, monkeypatch):
    """A typo or a new model in opsctl_model_preset: every command says so up front (the guard
    would otherwise meet it in the middle of its first decision)."""
    from opsctl.model_shapes import PRESETS

    config = tmp_path / "opsctl.yml"
    config.write_text("model_preset: kimi-k2.5\n")
    monkeypatch.setenv("OPSCTL_CONFIG", str(config))
    result = CliRunner().invoke(cli, ["restart", "--fraction", "0.93"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "model_preset 'kimi-k2.5' is not a preset" in result.output and "opsctl_model_preset" in result.output
    report = json.loads(CliRunner().invoke(cli, ["status", "--json"]).output)
    assert report["level"] == "UNKNOWN" and "kimi-k2.5" in report["problems"][0]
    config.write_text("model_preset: DeepSeek-V3\n")  # presets are matched without case
    from opsctl.config import load_config
    assert load_config().model_preset == "DeepSeek-V3" and "deepseek-v3" in PRESETS


def test_the_roles_preset_choices_are_the_planners_presets():
    import yaml

    from opsctl.model_shapes import PRESETS
    from opsctl.render import REPO_ROOT

    specs = yaml.safe_load((REPO_ROOT / "ansible/roles/opsctl/meta/argument_specs.yml").read_text())
    assert specs["argument_specs"]["main"]["options"]["opsctl_model_preset"]["choices"] == sorted(PRESETS)


def test_gpu_fields_nvidia_smi_cannot_give_are_none(tmp_path, monkeypatch):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho '0, NVIDIA RTX PRO 6000 Blackwell, [N/A], 97887, [Not Supported]'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert status.gpu_summary() == [{"index": 0, "name": "NVIDIA RTX PRO 6000 Blackwell", "memory_used_mib": None,
                                     "memory_total_mib": 97887.0, "utilization_pct": None}]


def test_status_sends_the_engines_api_key(tmp_path, monkeypatch, node_config):
    """An engine with an API key answers /server_info only with it: status read the engine's
    figures as missing on such a node."""
    key_file = tmp_path / "api-key.yaml"
    key_file.write_text("api-key: sekrit\n")
    node_config(api_key_file=str(key_file))
    seen = {}

    def look(url, timeout_s, api_key=None):
        seen["api_key"] = api_key
        raise RuntimeError("stop here")
    monkeypatch.setattr(status, "look", look)
    monkeypatch.setattr(status, "unit_state", no_systemctl)
    try:
        status.collect(1.0)
    except RuntimeError:
        pass
    assert seen["api_key"] == "sekrit"


def no_systemctl(unit):
    raise FileNotFoundError("systemctl")


def dead_engine(monkeypatch, seen=None):
    """An engine that answers nothing, and a unit that is failed."""
    from opsctl import engine
    from opsctl.systemd import UnitState

    def look(url, timeout_s, api_key=None):
        if seen is not None:
            seen["api_key"] = api_key
        down = engine.Probe(url, False, None, None, "ConnectError: refused")
        return engine.EngineView(down, down, down, down)
    monkeypatch.setattr(status, "look", look)
    monkeypatch.setattr(status, "unit_state", lambda unit: UnitState(
        unit, "loaded", "failed", "failed", "exit-code", 5, 0, 1, "enabled", None, "run"))
    monkeypatch.setattr(status.journal, "tail", lambda unit, lines, timeout_s=10.0: [])


def test_text_from_the_engine_with_square_brackets_is_printed_as_it_is(monkeypatch, node_config):
    """Probe errors and journal text went through rich markup: "[/rank3]" crashed the report."""
    from opsctl import engine
    dead_engine(monkeypatch)

    def look(url, timeout_s, api_key=None):
        down = engine.Probe(url, False, None, None, "HTTP 503: [/rank3] [rank3]: detokenizer gone")
        return engine.EngineView(down, down, down, down)
    monkeypatch.setattr(status, "look", look)
    result = CliRunner().invoke(cli, ["status"], terminal_width=250)
    assert result.exit_code == 2, result.output
    assert "HTTP 503: [/rank3] [rank3]: detokenizer gone" in result.output


def test_an_unreadable_api_key_still_reports_a_dead_engine_as_critical(tmp_path, monkeypatch, node_config):
    """The health probes need no key (SGLang lets /health* through): a key file that this user
    cannot read (root-only, a monitoring agent's check) must not hide a dead engine as UNKNOWN."""
    key_file = tmp_path / "api-key.yaml"
    key_file.write_text("[not: a mapping")
    node_config(api_key_file=str(key_file))
    seen = {}
    dead_engine(monkeypatch, seen)
    result = CliRunner().invoke(cli, ["status", "--json"])
    report = json.loads(result.output)
    assert result.exit_code == 2 and report["level"] == "CRITICAL" and seen["api_key"] is None
    assert any("cannot read the engine's API key" in problem for problem in report["problems"])


def test_no_systemd_to_ask_is_unknown_and_a_hung_nvidia_smi_a_warning(monkeypatch, node_config):
    """`systemctl show` without a running systemd gives no properties: that is not knowing the
    unit's state (before, "unknown (unknown, result )" was CRITICAL). A hung nvidia-smi gave a
    traceback and exit 1; it is a WARNING, and a fault seen outranks what could not be looked at
    (UNKNOWN alone, it is 3: the next test)."""
    import subprocess

    from opsctl import engine
    node_config()
    up = engine.Probe("http://x/health", True, 200, 3.0)
    monkeypatch.setattr(status, "look", lambda url, timeout_s, api_key=None: engine.EngineView(up, up, up, up))
    monkeypatch.setattr(status.journal, "tail", lambda unit, lines, timeout_s=10.0: [])
    monkeypatch.setattr(status.shutil, "which", lambda name: "/usr/bin/" + name)

    def run(argv, **kwargs):
        if argv[0] == "systemctl":
            return subprocess.CompletedProcess(argv, 1, "", "System has not been booted with systemd")
        raise subprocess.TimeoutExpired(argv, kwargs.get("timeout"))  # nvidia-smi
    monkeypatch.setattr(subprocess, "run", run)
    result = CliRunner().invoke(cli, ["status", "--json"])
    report = json.loads(result.output)
    assert result.exit_code == 1 and report["level"] == "WARNING", report["problems"]
    assert any("systemctl gives no state" in problem for problem in report["problems"])
    assert any("nvidia-smi did not answer" in problem for problem in report["problems"])
    monkeypatch.setattr(status, "gpu_summary", lambda: "no GPU (nvidia-smi not found)")
    alone = CliRunner().invoke(cli, ["status", "--json"])
    assert alone.exit_code == 3 and json.loads(alone.output)["level"] == "UNKNOWN"



def test_a_restart_long_ago_is_no_warning(monkeypatch, node_config):
    """systemd counts restarts until the next manual start: a restart last week, after which the
    engine has served ever since, kept status at WARNING for good."""
    from datetime import datetime, timedelta, timezone

    from opsctl import engine
    from opsctl.systemd import UnitState
    node_config()
    up = engine.Probe("http://x/health", True, 200, 3.0)
    monkeypatch.setattr(status, "look", lambda url, timeout_s, api_key=None: engine.EngineView(up, up, up, up))
    monkeypatch.setattr(status.journal, "tail", lambda unit, lines, timeout_s=10.0: [])
    monkeypatch.setattr(status, "gpu_summary", lambda: "no GPU (nvidia-smi not found)")
    monkeypatch.setattr(status, "guard_summary", lambda config: {"state": "not installed", "problem": None})
    for minutes_up, level in ((10, "WARNING"), (60 * 24 * 7, "OK")):
        since = datetime.now(timezone.utc) - timedelta(minutes=minutes_up)
        monkeypatch.setattr(status, "unit_state", lambda unit, since=since: UnitState(
            unit, "loaded", "active", "running", "success", 2, 1, 0, "enabled", since, "run"))
        report = status.collect(1.0)
        assert report["level"] == level, report["problems"]
        assert report["unit"]["restarts"] == 2


def _plugin_log_lines(monkeypatch, verdicts):
    """The self-check lines the SGLang plugin itself logs for each TP rank's verdict, as the
    engine prints them into the journal (SGLang's `[time TPn] ` prefix before the message)."""
    import logging

    import torch
    from dflash_kernels import selfcheck, sglang_plugin

    lines = []
    for rank, (passed, detail) in enumerate(verdicts):
        verdict = selfcheck.SelfCheck(passed, "NVIDIA RTX PRO 6000 Blackwell Server Edition (sm_120)",
                                      "_verify_split_kernel_teams", 8, "bf16", 2.6e-3 if passed else float("nan"),
                                      1.4, detail)
        monkeypatch.setattr(selfcheck, "run", lambda *args, verdict=verdict: verdict)
        monkeypatch.setattr(sglang_plugin, "_CARD_VERDICTS", {})
        records = []
        handler = logging.Handler()
        handler.emit = records.append
        logger = logging.getLogger(sglang_plugin.__name__)
        logger.addHandler(handler)
        level, logger.level = logger.level, logging.INFO  # SGLang logs at INFO
        try:
            backend = type("Backend", (), {"device": "cpu", "num_head": 8, "num_draft_tokens": 16})()
            sglang_plugin.card_verdict(backend, type("Runner", (), {"kv_cache_dtype": torch.bfloat16})())
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
        (record,) = records
        lines.append(f"2026-12-02T07:0{rank}:00+0000 dflash-train sglang[7130]: "
                     f"[2026-12-02 07:0{rank}:00 TP{rank}] {record.getMessage()}")
    return lines


def _serving_node(monkeypatch, node_config, tmp_path, start_lines):
    from opsctl import engine
    from opsctl.systemd import UnitState
    node_config()
    (tmp_path / "sglang.env").write_text("SGLANG_MEM_FRACTION_STATIC=0.93\nDFLASH_VERIFY_KERNEL=1\n")
    up = engine.Probe("http://x/health", True, 200, 3.0)
    monkeypatch.setattr(status, "look", lambda url, timeout_s, api_key=None: engine.EngineView(up, up, up, up))
    monkeypatch.setattr(status.journal, "tail", lambda unit, lines, timeout_s=10.0: [])
    monkeypatch.setattr(status, "gpu_summary", lambda: "no GPU (nvidia-smi not found)")
    monkeypatch.setattr(status, "guard_summary", lambda config: {"state": "not installed", "problem": None})
    monkeypatch.setattr(status, "unit_state", lambda unit: UnitState(
        unit, "loaded", "active", "running", "success", 0, 1, 0, "enabled", None, "run-7"))
    asked = []
    monkeypatch.setattr(status.journal, "run_start",
                        lambda invocation, until: asked.append((invocation, until)) or start_lines)
    return asked


def test_a_verify_kernel_that_failed_its_self_check_is_a_warning(tmp_path, monkeypatch, node_config):
    """The plugin keeps SGLang's own verify path on a GPU where the kernel failed its on-card
    check: the engine serves, slower, and status says where and why."""
    lines = _plugin_log_lines(monkeypatch, [(True, ""), (False, "rows left unwritten or NaN"), (True, "")])
    asked = _serving_node(monkeypatch, node_config, tmp_path, lines)
    result = CliRunner().invoke(cli, ["status", "--json"])
    report = json.loads(result.output)
    assert asked == [("run-7", "The server is fired up and ready to roll!")]  # the current run's start
    assert result.exit_code == 1 and report["level"] == "WARNING"
    (problem,) = report["problems"]
    assert "failed its self-check on 1 of 3" in problem and "TP1: rows left unwritten or NaN" in problem
    assert [c["passed"] for c in report["verify_kernel"]["checks"]] == [True, False, True]
    human = CliRunner().invoke(cli, ["status"])
    assert "dflash kernel on 2 of 3" in human.output and "SGLang's own on 1" in human.output


def test_a_verify_kernel_that_passed_everywhere_is_ok(tmp_path, monkeypatch, node_config):
    lines = _plugin_log_lines(monkeypatch, [(True, "")] * 8)
    _serving_node(monkeypatch, node_config, tmp_path, lines)
    report = status.collect(1.0)
    assert report["level"] == "OK", report["problems"]
    checks = report["verify_kernel"]["checks"]
    assert len(checks) == 8 and all(c["passed"] and c["kernel"] == "_verify_split_kernel_teams" for c in checks)
    assert checks[0]["device"] == "NVIDIA RTX PRO 6000 Blackwell Server Edition (sm_120)" and checks[0]["detail"] == ""
    (tmp_path / "sglang.env").write_text("SGLANG_MEM_FRACTION_STATIC=0.93\n")  # switched off: not looked for
    report = status.collect(1.0)
    assert report["verify_kernel"] == {"switched_on": False, "checks": [], "problem": None}


def test_a_passed_check_that_compiled_its_kernels_still_serves_and_says_so(tmp_path, monkeypatch, node_config):
    """The image's prebuilt binaries did not serve this card or Triton: the kernel was compiled at
    the start (slower), and serves."""
    from dflash_kernels import selfcheck
    line = selfcheck.SelfCheck(True, "NVIDIA RTX PRO 6000 Blackwell Server Edition (sm_121)", "_verify_split_kernel_teams",
                               8, "bf16", 2.6e-3, 41.0, compiled=3).line()
    _serving_node(monkeypatch, node_config, tmp_path, [
        f"2026-12-02T07:00:00+0000 dflash-train sglang[7130]: [2026-12-02 07:00:00 TP0] dflash_kernels.sglang_plugin: "
        f"{line}; it serves target-verify"])
    report = status.collect(1.0)
    (check,) = report["verify_kernel"]["checks"]
    assert report["level"] == "OK" and check["passed"]
    assert check["detail"] == "3 kernel(s) compiled at first use, not prebuilt for this card and Triton"
    human = CliRunner().invoke(cli, ["status"], terminal_width=250)
    assert "self-check passed; 3 kernel(s) compiled at first use" in " ".join(human.output.split()), human.output


def test_a_gpu_process_counts_once_and_a_check_that_could_not_start_counts_as_failed(tmp_path, monkeypatch,
                                                                                      node_config):
    """A process checks once for each model it builds a backend for: TP0's two lines are one GPU,
    failed if either failed. A check that could not start logs no kernel ("?")."""
    from dflash_kernels import selfcheck
    tp0_pass, tp1_fail, tp2_pass = _plugin_log_lines(monkeypatch, [(True, ""), (False, "rows differ"), (True, "")])
    tp0_fail = tp1_fail.replace(" TP1] ", " TP0] ")
    could_not_start = selfcheck.SelfCheck(False, "?", "?", 0, "?", float("nan"), 0.0,
                                          "the check could not start: AttributeError: no num_head").line()
    tp1_broken = tp1_fail.split(" TP1] ")[0] + " TP1] dflash_kernels.sglang_plugin: " + could_not_start
    _serving_node(monkeypatch, node_config, tmp_path, [tp0_pass, tp0_fail, tp1_broken, tp2_pass])
    report = status.collect(1.0)
    checks = {c["tp_rank"]: c for c in report["verify_kernel"]["checks"]}
    assert sorted(checks) == [0, 1, 2]
    assert checks[0]["detail"] == "rows differ" and not checks[0]["passed"]
    assert checks[1]["kernel"] == "?" and checks[1]["detail"].startswith("the check could not start")
    assert checks[2]["passed"]
    (problem,) = report["problems"]
    assert "failed its self-check on 2 of 3" in problem and "TP0, TP1" in problem


def test_a_retraction_after_a_crash_does_not_hide_the_crash(tmp_path, monkeypatch, node_config):
    """A full KV pool retracts requests under load (no crash): the last crash shown is still the
    seed's OOM before it."""
    from pathlib import Path

    node_config()
    dead_engine(monkeypatch)
    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "oom"
    crash = (fixtures / "seed_journal.log").read_text().splitlines()
    retraction = (fixtures / "kv_pool.log").read_text().splitlines()[:1]
    monkeypatch.setattr(status.journal, "tail", lambda unit, lines, timeout_s=10.0: crash + retraction)
    report = json.loads(CliRunner().invoke(cli, ["status", "--json"]).output)
    assert report["last_incident"]["kind"] != "kv_pool_full"
    assert report["last_incident"]["classification"] in ("activation_spike", "fragmentation")


def test_a_guard_state_this_user_cannot_read_still_reports_a_dead_engine_as_critical(tmp_path, monkeypatch,
                                                                                      node_config):
    """The state folder is root's (0750): a monitoring agent's check sees the engine as it is and
    the guard as not known, not one UNKNOWN line for everything."""
    node_config()
    dead_engine(monkeypatch)

    def cannot_read(config, now=None):
        raise PermissionError(13, "Permission denied", "/var/lib/opsctl/guard-state.json")
    monkeypatch.setattr(status, "guard_summary", cannot_read)
    result = CliRunner().invoke(cli, ["status", "--json"])
    report = json.loads(result.output)
    assert result.exit_code == 2 and report["level"] == "CRITICAL"
    assert report["guard"]["state"] == "unknown"
    assert any("the guard's state cannot be read" in p and "Permission denied" in p for p in report["problems"])
    human = CliRunner().invoke(cli, ["status"])
    assert human.exit_code == 2 and "guard" in human.output and "unknown" in human.output


def _busy_engine(monkeypatch, batch_age_s, running, kind="Prefill"):
    """/health and /health_generate time out (a long prefill holds them), /metrics answers; the
    journal's last batch line is `kind`'s, logged `batch_age_s` ago."""
    from datetime import datetime, timedelta, timezone

    from opsctl import engine
    from opsctl.systemd import UnitState

    slow = engine.Probe("http://x/health", False, None, None, "no answer within 2 s")
    metrics = engine.Probe("http://x/metrics", True, 200, 3.0, None,
                           f'sglang:num_running_reqs{{tp_rank="0"}} {running}\nsglang:num_queue_reqs{{tp_rank="0"}} 0\n')
    monkeypatch.setattr(status, "look", lambda url, timeout_s, api_key=None: engine.EngineView(
        slow, dataclasses.replace(slow, url="http://x/health_generate"), slow, metrics))
    monkeypatch.setattr(status, "unit_state", lambda unit: UnitState(
        unit, "loaded", "active", "running", "success", 0, 42, 0, "enabled", None, "run"))
    stamp = (datetime.now(timezone.utc) - timedelta(seconds=batch_age_s)).strftime("%Y-%m-%dT%H:%M:%S%z")
    prefix = f"{stamp} node sglang[42]: [2026-12-05 09:00:00 TP0] "
    line = prefix + (f"Prefill batch, #new-seq: 1, #new-token: 4096, #cached-token: 0, token usage: 0.61, "
                     f"#running-req: {running}, #queue-req: 0" if kind == "Prefill" else
                     f"Decode batch, #running-req: {running}, #token: 190000, token usage: 0.95, gen throughput "
                     "(token/s): 31.02, #queue-req: 0")
    monkeypatch.setattr(status.journal, "tail", lambda unit, lines, timeout_s=10.0: [line])
    monkeypatch.setattr(status, "gpu_summary", lambda: "no GPU (nvidia-smi not found)")
    monkeypatch.setattr(status, "guard_summary", lambda config: {"state": "not installed", "problem": None})


def test_a_busy_engine_is_not_critical(monkeypatch, node_config):
    """SGLang answers /health between forward passes: a 4,096-token chunk near 185k takes about
    14 s, so a 2 s probe timed out and paged on-call for a healthy engine at work. Requests
    running and a batch logged within a minute: busy, OK, and said so."""
    node_config()
    _busy_engine(monkeypatch, batch_age_s=12, running=1, kind="Decode")
    result = CliRunner().invoke(cli, ["status", "--json"])
    report = json.loads(result.output)
    assert result.exit_code == 0, report["problems"]
    assert any(problem.startswith("busy: health, health_generate did not answer within 2 s while 1 request(s) run")
               for problem in report["problems"])


def test_a_lone_long_prefill_is_busy_although_sglangs_gauges_read_zero(monkeypatch, node_config):
    """SGLang 0.5.23 counts a request whose prefill is being chunked neither as running nor as
    queued (scheduler.chunked_req; PrefillStats takes the running batch's requests), so the seed's
    lone 185k prompt read 0 and 0 for its minutes of prefill: status paged CRITICAL."""
    node_config()
    _busy_engine(monkeypatch, batch_age_s=12, running=0, kind="Prefill")
    result = CliRunner().invoke(cli, ["status", "--json"])
    report = json.loads(result.output)
    assert result.exit_code == 0, report["problems"]
    assert any(problem.startswith("busy: health, health_generate did not answer within 2 s while a prefill is in "
                                  "progress and the scheduler logged a prefill batch 1")  # (12 s ago, or 13)
               for problem in report["problems"]), report["problems"]


@pytest.mark.parametrize("batch_age_s, running, kind", [(600, 1, "Prefill"), (600, 0, "Prefill"), (12, 0, "Decode")],
                         ids=["no-batch-for-10-min", "no-prefill-for-10-min", "nothing-runs-after-decoding"])
def test_slow_probes_without_work_in_progress_are_still_critical(monkeypatch, node_config, batch_age_s, running,
                                                                 kind):
    node_config()
    _busy_engine(monkeypatch, batch_age_s, running, kind)
    result = CliRunner().invoke(cli, ["status", "--json"])
    assert result.exit_code == 2 and json.loads(result.output)["level"] == "CRITICAL"


@pytest.mark.parametrize("new_tokens, busy", [(4096, True), (2656, False)], ids=["a-whole-chunk", "a-last-chunk"])
def test_a_prompts_last_chunk_with_nothing_running_after_it_is_no_work(monkeypatch, node_config, new_tokens, busy):
    """SGLang logs each chunk as it ends: a whole chunk (the engine's --chunked-prefill-size, from
    its start in the journal) means more follow; a shorter one was the prompt's last, and with
    nothing running since, an engine that stops answering is hung, not busy (for a minute)."""
    node_config()
    _busy_engine(monkeypatch, batch_age_s=12, running=0, kind="Prefill")
    line = status.journal.tail("u", 1)[0].replace("#new-token: 4096,", f"#new-token: {new_tokens},")
    start = (line.split(" TP0] ")[0] + " TP0] max_total_num_tokens=195011, chunked_prefill_size=4096, "
             "max_prefill_tokens=16384, max_running_requests=48, context_len=200000, available_gpu_mem=5.86 GB")
    monkeypatch.setattr(status.journal, "tail", lambda unit, lines, timeout_s=10.0: [start, line])
    result = CliRunner().invoke(cli, ["status", "--json"])
    assert (result.exit_code, json.loads(result.output)["level"]) == ((0, "OK") if busy else (2, "CRITICAL"))


def test_a_health_probes_own_prefill_is_not_work_in_progress(monkeypatch, node_config):
    """/health_generate on an idle engine logs a 1-token prefill: a hung idle engine whose last
    line is a probe's is not busy."""
    node_config()
    _busy_engine(monkeypatch, batch_age_s=12, running=0, kind="Prefill")
    line = status.journal.tail("u", 1)[0].replace("#new-token: 4096,", "#new-token: 1,")
    monkeypatch.setattr(status.journal, "tail", lambda unit, lines, timeout_s=10.0: [line])
    result = CliRunner().invoke(cli, ["status", "--json"])
    assert result.exit_code == 2 and json.loads(result.output)["level"] == "CRITICAL"


def test_a_check_that_breaks_is_unknown_not_a_warning(monkeypatch, node_config):
    """Any failure of the check itself (a parser meeting what it did not foresee) exited 1,
    which monitoring reads as WARNING, even for a dead engine: it is UNKNOWN (3)."""
    node_config()

    def broken(config, engine_url=None):
        raise ValueError("not enough values to unpack")
    monkeypatch.setattr(status, "collect", lambda timeout_s: broken(None))
    result = CliRunner().invoke(cli, ["status", "--json"])
    assert result.exit_code == 3 and "the check itself failed (ValueError" in result.output


def test_an_nvidia_smi_line_status_cannot_read_is_said_not_a_traceback(tmp_path, monkeypatch):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'WARNING: infoROM is corrupted at gpu 0000:01:00.0'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert status.gpu_summary().startswith("nvidia-smi gave a line status cannot read")


def test_a_part_of_the_check_that_breaks_leaves_a_dead_engine_critical(monkeypatch, node_config):
    """Only some failures were handled inside the check: any other, in the guard's state or the
    verify kernel's, turned a dead engine's CRITICAL into UNKNOWN."""
    node_config()
    dead_engine(monkeypatch)

    def broken(config, unit=None):
        raise TypeError("'NoneType' object is not subscriptable")
    monkeypatch.setattr(status, "guard_summary", broken)
    monkeypatch.setattr(status, "verify_kernel_summary", broken)
    result = CliRunner().invoke(cli, ["status", "--json"])
    report = json.loads(result.output)
    assert result.exit_code == 2 and report["level"] == "CRITICAL", report["problems"]
    assert any("the guard's state cannot be read" in problem for problem in report["problems"])
    human = CliRunner().invoke(cli, ["status"])
    assert human.exit_code == 2 and "not known (TypeError" in human.output


def test_a_server_that_trickles_its_answer_is_no_answer_within_the_timeout():
    """httpx's timeout bounds each read, not the probe: a server sending a byte every 0.2 s never
    tripped a 1 s timeout, and `opsctl status` hung for as long as the server kept it up."""
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from opsctl import engine

    stop = threading.Event()

    class Trickle(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "25")  # 5 s at this pace
            self.end_headers()
            for _ in range(25):
                if stop.wait(0.2):
                    return
                try:
                    self.wfile.write(b"x")
                    self.wfile.flush()
                except OSError:  # the probe gave up and closed its connection
                    return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        started = time.monotonic()
        view = engine.look(f"http://127.0.0.1:{server.server_address[1]}", timeout_s=1.0)
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
    assert elapsed < 2.0
    for probe in (view.health, view.health_generate, view.server_info, view.metrics):
        assert not probe.ok and probe.error == "no answer within 1 s"  # status.busy_engine reads this prefix


def test_metrics_of_every_tp_rank_are_not_counted_again():
    """With --enable-metrics-for-all-schedulers each TP rank exports the same batch: summed, TP8
    read a token usage of 4.0 and a KV pool 8 times its size. Data-parallel groups still add up."""
    from opsctl.engine import parse_metrics

    ranks = "".join(f'sglang:token_usage{{model_name="k",pp_rank="0",tp_rank="{r}",moe_ep_rank="{r}"}} 0.5\n'
                    f'sglang:max_total_num_tokens{{model_name="k",pp_rank="0",tp_rank="{r}",moe_ep_rank="{r}"}} 195011\n'
                    for r in (3, 0, 1, 2))
    values = parse_metrics("# TYPE sglang:token_usage gauge\n# TYPE sglang:max_total_num_tokens gauge\n" + ranks)
    assert values["sglang:token_usage"] == 0.5 and values["sglang:max_total_num_tokens"] == 195011
    dp = ('# TYPE sglang:num_running_reqs gauge\n'
          'sglang:num_running_reqs{dp_rank="0",tp_rank="0"} 3\nsglang:num_running_reqs{dp_rank="0",tp_rank="1"} 3\n'
          'sglang:num_running_reqs{dp_rank="1",tp_rank="4"} 2\nsglang:num_running_reqs{dp_rank="1",tp_rank="5"} 2\n')
    assert parse_metrics(dp)["sglang:num_running_reqs"] == 5
