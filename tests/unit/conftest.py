"""Shared by the unit tests."""

import pytest
import yaml


@pytest.fixture
def node_config(tmp_path, monkeypatch):
    """Write an opsctl.yml for a node whose files lie under tmp_path (env files that do not exist
    unless the test writes them), with `values` over those paths, and point opsctl at it."""
    def write(**values):
        config = {"env_file": str(tmp_path / "sglang.env"), "override_env_file": str(tmp_path / "override.env"),
                  "state_dir": str(tmp_path / "state"), **values}
        path = tmp_path / "opsctl.yml"
        path.write_text(yaml.safe_dump(config))
        monkeypatch.setenv("OPSCTL_CONFIG", str(path))
        return path
    return write
