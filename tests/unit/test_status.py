"""opsctl status where it cannot look: an unreadable config, and GPUs that answer "[N/A]"."""

import json

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
    monkeypatch.setattr(status.journal, "tail", lambda unit, lines: [])


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
    traceback and exit 1."""
    import subprocess

    from opsctl import engine
    node_config()
    up = engine.Probe("http://x/health", True, 200, 3.0)
    monkeypatch.setattr(status, "look", lambda url, timeout_s, api_key=None: engine.EngineView(up, up, up, up))
    monkeypatch.setattr(status.journal, "tail", lambda unit, lines: [])
    monkeypatch.setattr(status.shutil, "which", lambda name: "/usr/bin/" + name)

    def run(argv, **kwargs):
        if argv[0] == "systemctl":
            return subprocess.CompletedProcess(argv, 1, "", "System has not been booted with systemd")
        raise subprocess.TimeoutExpired(argv, kwargs.get("timeout"))  # nvidia-smi
    monkeypatch.setattr(subprocess, "run", run)
    result = CliRunner().invoke(cli, ["status", "--json"])
    report = json.loads(result.output)
    assert result.exit_code == 3 and report["level"] == "UNKNOWN", report["problems"]
    assert any("systemctl gives no state" in problem for problem in report["problems"])
    assert any("nvidia-smi did not answer" in problem for problem in report["problems"])



def test_a_restart_long_ago_is_no_warning(monkeypatch, node_config):
    """systemd counts restarts until the next manual start: a restart last week, after which the
    engine has served ever since, kept status at WARNING for good."""
    from datetime import datetime, timedelta, timezone

    from opsctl import engine
    from opsctl.systemd import UnitState
    node_config()
    up = engine.Probe("http://x/health", True, 200, 3.0)
    monkeypatch.setattr(status, "look", lambda url, timeout_s, api_key=None: engine.EngineView(up, up, up, up))
    monkeypatch.setattr(status.journal, "tail", lambda unit, lines: [])
    monkeypatch.setattr(status, "gpu_summary", lambda: "no GPU (nvidia-smi not found)")
    monkeypatch.setattr(status, "guard_summary", lambda config: {"state": "not installed", "problem": None})
    for minutes_up, level in ((10, "WARNING"), (60 * 24 * 7, "OK")):
        since = datetime.now(timezone.utc) - timedelta(minutes=minutes_up)
        monkeypatch.setattr(status, "unit_state", lambda unit, since=since: UnitState(
            unit, "loaded", "active", "running", "success", 2, 1, 0, "enabled", since, "run"))
        report = status.collect(1.0)
        assert report["level"] == level, report["problems"]
        assert report["unit"]["restarts"] == 2
