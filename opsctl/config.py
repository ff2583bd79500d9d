"""What opsctl operates on this node: read from /etc/opsctl/opsctl.yml (written by Ansible)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import click
import yaml

DEFAULT_CONFIG_FILE = Path("/etc/opsctl/opsctl.yml")


@dataclasses.dataclass(frozen=True)
class NodeConfig:
    unit: str = "sglang.service"
    engine_url: str = "http://127.0.0.1:30000"
    env_file: Path = Path("/etc/sglang/sglang.env")
    override_env_file: Path = Path("/etc/sglang/override.env")
    state_dir: Path = Path("/var/lib/opsctl")
    context_target: int = 200_000
    model_preset: str = "kimi-k2.6"
    start_timeout_s: float = 900.0


_PATH_FIELDS = {"env_file", "override_env_file", "state_dir"}


def load_config(path: Path | None = None) -> NodeConfig:
    """Read the node's config; a missing file means the defaults (a node set up by hand).

    OPSCTL_CONFIG names another file; OPSCTL_STATE_DIR overrides the state folder (tests).
    """
    path = path or Path(os.environ.get("OPSCTL_CONFIG", DEFAULT_CONFIG_FILE))
    values: dict = {}
    if path.exists():
        try:
            values = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as error:
            raise click.ClickException(f"{path} is not valid YAML ({error}); re-run the playbook to rewrite it")
    known = {field.name for field in dataclasses.fields(NodeConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise click.ClickException(f"{path}: unknown keys {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    if "OPSCTL_STATE_DIR" in os.environ:
        values["state_dir"] = os.environ["OPSCTL_STATE_DIR"]
    for name in _PATH_FIELDS & set(values):
        values[name] = Path(values[name])
    return NodeConfig(**values)
