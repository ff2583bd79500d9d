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
    monkeypatch.setattr(status, "unit_state", lambda unit: None)
    try:
        status.collect(1.0)
    except RuntimeError:
        pass
    assert seen["api_key"] == "sekrit"
    key_file.write_text("[not: a mapping")
    result = CliRunner().invoke(cli, ["status", "--json"])
    assert "cannot read the engine's API key" in result.output
