"""A node config or env file that cannot be read gives each command its own "could not read"
code, never one that reads as a result (oom's 1 is "found", guard status's 1 "acting")."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from opsctl.cli import cli

SEED_OOM = str(Path(__file__).parents[1] / "fixtures" / "oom" / "oom_current.log")


@pytest.mark.parametrize("argv, code", [
    (["oom", "--file", SEED_OOM], 3),
    (["oom"], 3),
    (["guard", "status"], 3),
    (["guard", "status", "--json"], 3),
    (["overrides", "clear", "--no-restart"], 2),
])
def test_a_node_config_that_cannot_be_read(tmp_path, monkeypatch, argv, code):
    config = tmp_path / "opsctl.yml"
    config.write_text("env_file: [unclosed\n")
    monkeypatch.setenv("OPSCTL_CONFIG", str(config))
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == code, result.output
    assert str(config) in result.output


@pytest.mark.parametrize("argv, code", [
    (["oom", "--file", SEED_OOM], 3),
    (["guard", "status"], 3),
    (["overrides"], 2),
    (["plan", "--calibrate-log", SEED_OOM.replace("oom_current", "seed_node")], 0),  # (plan falls back)
])
def test_a_node_config_this_user_cannot_read(tmp_path, monkeypatch, argv, code):
    """Not bad YAML but a file that cannot be read (root's 0600 file, read by a monitoring user;
    here a directory): it escaped as a traceback, exit 1."""
    config = tmp_path / "opsctl.yml"
    config.mkdir()
    monkeypatch.setenv("OPSCTL_CONFIG", str(config))
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    if code:
        assert f"cannot read {config}" in result.output


def test_an_env_file_that_cannot_be_read_is_named_and_not_read_as_found(tmp_path, monkeypatch):
    env_dir = tmp_path / "sglang.env"
    env_dir.mkdir()  # (a directory: read_text fails, as a file root alone may read would)
    config = tmp_path / "opsctl.yml"
    config.write_text(f"env_file: {env_dir}\noverride_env_file: {tmp_path / 'override.env'}\n"
                      f"state_dir: {tmp_path / 'state'}\n")
    monkeypatch.setenv("OPSCTL_CONFIG", str(config))
    result = CliRunner().invoke(cli, ["oom"])
    assert result.exit_code == 3 and f"cannot read {env_dir}" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception


@pytest.mark.parametrize("argv, message", [
    (["status", "--jsn"], "No such option"),
    (["status", "--timeout", "0"], "Invalid value for '--timeout'"),
    (["status", "extra"], "unexpected extra argument"),
    (["guard", "status", "--jsn"], "No such option"),
])
def test_a_mistyped_status_check_is_unknown_not_critical(argv, message):
    """A monitoring config's typo never looked at the engine: UNKNOWN (3), as the Nagios plugin
    guidelines ask; click's usage code 2 would page as CRITICAL."""
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 3, result.output
    assert message in result.output


def test_other_commands_keep_clicks_usage_code():
    assert CliRunner().invoke(cli, ["oom", "--jsn"]).exit_code == 2
    assert CliRunner().invoke(cli, ["guard", "pause", "--jsn"]).exit_code == 2
    assert CliRunner().invoke(cli, ["status", "--help"]).exit_code == 0
