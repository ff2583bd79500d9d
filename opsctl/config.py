"""What opsctl operates on this node: read from /etc/opsctl/opsctl.yml (written by Ansible)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import click
import yaml

DEFAULT_CONFIG_FILE = Path("/etc/opsctl/opsctl.yml")


@dataclasses.dataclass(frozen=True)
class GuardConfig:
    """The guard's limits (the `guard:` section; see `opsctl/guard/policy.py` for how they are used)."""

    budget_per_hour: int = 5  # remediations (restarts the guard makes) per sliding hour
    backoff_initial_s: float = 5.0  # wait before the 2nd remediation in the hour, doubling after
    backoff_max_s: float = 300.0
    max_blind_restarts: int = 3  # as-is restarts per hour for a death of unknown cause or a hang
    hang_timeout_s: float = 120.0  # /health_generate failing this long (unit active) is a hang
    probe_interval_s: float = 10.0
    probe_timeout_s: float = 30.0
    chunk_floor: int = 2048  # the ladder halves --chunked-prefill-size down to this
    fraction_step: float = 0.01
    fraction_max: float = 0.95  # the highest fraction the guard raises to after a no-KV start
    webhook_url: str = ""
    command_hook: str = ""


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
    api_key_file: str = ""  # the engine's --config YAML holding its api-key; "" when it has none
    guard: GuardConfig = dataclasses.field(default_factory=GuardConfig)

    def api_key(self) -> str | None:
        """The engine's API key (its /server_info and /generate need it), or None."""
        if not self.api_key_file:
            return None
        try:
            data = yaml.safe_load(Path(self.api_key_file).read_text())
        except (OSError, yaml.YAMLError) as error:
            raise click.ClickException(f"cannot read the engine's API key from {self.api_key_file}: {error}") from None
        key = data.get("api-key", data.get("api_key")) if isinstance(data, dict) else None
        return str(key) if key else None


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
            raise click.ClickException(
                f"{path} is not valid YAML ({error}); re-run the playbook to rewrite it"
            ) from None
        except (OSError, UnicodeDecodeError) as error:  # (every command reports it with its own code)
            hint = " (root's file: sudo opsctl ...)" if isinstance(error, PermissionError) else ""
            raise click.ClickException(f"cannot read {path}: {getattr(error, 'strerror', None) or error}{hint}") from None
    known = {field.name for field in dataclasses.fields(NodeConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise click.ClickException(f"{path}: unknown keys {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    if "OPSCTL_STATE_DIR" in os.environ:
        values["state_dir"] = os.environ["OPSCTL_STATE_DIR"]
    for name in _PATH_FIELDS & set(values):
        values[name] = Path(values[name])
    if "guard" in values:
        values["guard"] = _guard_config(path, values["guard"] or {})
    if "model_preset" in values:
        # checked here, not where the planner first needs it: the guard would meet it mid-decision
        from opsctl.model_shapes import PRESETS, ShapeError, preset

        try:
            preset(str(values["model_preset"]))
        except ShapeError:
            raise click.ClickException(f"{path}: model_preset {values['model_preset']!r} is not a preset "
                                       f"(known: {', '.join(sorted(PRESETS))}); set opsctl_model_preset "
                                       "in the inventory and re-run the playbook") from None
    return NodeConfig(**values)


def _guard_config(path: Path, values: dict) -> GuardConfig:
    known = {field.name for field in dataclasses.fields(GuardConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise click.ClickException(f"{path}: unknown guard keys {', '.join(unknown)} "
                                   f"(known: {', '.join(sorted(known))})")
    casts = {"int": int, "float": float, "str": lambda value: "" if value is None else str(value)}
    typed = {}
    for field in dataclasses.fields(GuardConfig):
        if field.name in values:
            try:
                typed[field.name] = casts[field.type](values[field.name])
            except (TypeError, ValueError):
                raise click.ClickException(f"{path}: guard.{field.name} must be a {field.type}, "
                                           f"got {values[field.name]!r}") from None
    return GuardConfig(**typed)
