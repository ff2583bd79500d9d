"""The tuned values in force: Ansible's environment file, opsctl's override file, and which wins."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from opsctl.render import parse_env_file
from opsctl.startup_log import expandable_segments_from_env

FRACTION = "SGLANG_MEM_FRACTION_STATIC"
CHUNK = "SGLANG_CHUNKED_PREFILL_SIZE"
ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"


@dataclasses.dataclass(frozen=True)
class Setting:
    """One tuned value: what is in force, where it came from, and what Ansible's file says."""

    name: str
    value: str | None
    source: str  # "ansible", "override" or "unset"
    ansible_value: str | None

    @property
    def drift(self) -> bool:
        """An override is in force with a value different from Ansible's."""
        return self.source == "override" and self.value != self.ansible_value


@dataclasses.dataclass(frozen=True)
class EffectiveConfig:
    mem_fraction_static: Setting
    chunked_prefill_size: Setting
    expandable_segments: Setting

    def settings(self) -> list[Setting]:
        return [self.mem_fraction_static, self.chunked_prefill_size, self.expandable_segments]


def read_env(path: Path) -> dict[str, str]:
    """An env file's variables ({} when there is none); one that cannot be read is an error
    that names it (every command reports it with its own "could not read" code)."""
    try:
        return parse_env_file(path.read_text()) if path.exists() else {}
    except (OSError, UnicodeDecodeError) as error:
        raise click.ClickException(f"cannot read {path}: {getattr(error, 'strerror', None) or error}") from None


def _expandable(alloc_conf: str | None) -> str | None:
    """'true'/'false' from a PYTORCH_CUDA_ALLOC_CONF value such as 'expandable_segments:True'."""
    enabled = expandable_segments_from_env(alloc_conf)
    return None if enabled is None else str(enabled).lower()


def effective_config(env_file: Path, override_file: Path) -> EffectiveConfig:
    ansible, override = read_env(env_file), read_env(override_file)

    def setting(name: str, key: str, convert=lambda v: v) -> Setting:
        ansible_value = convert(ansible.get(key))
        if key in override:
            return Setting(name, convert(override[key]), "override", ansible_value)
        return Setting(name, ansible_value, "ansible" if key in ansible else "unset", ansible_value)

    return EffectiveConfig(
        mem_fraction_static=setting("mem_fraction_static", FRACTION),
        chunked_prefill_size=setting("chunked_prefill_size", CHUNK),
        expandable_segments=setting("expandable_segments", ALLOC_CONF, _expandable),
    )
