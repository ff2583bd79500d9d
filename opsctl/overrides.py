"""opsctl's override file: the tuned values it changed, rendered from templates/."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import click

from opsctl.envfiles import ALLOC_CONF, CHUNK, FRACTION, read_env
from opsctl.render import render
from opsctl.startup_log import expandable_segments_from_env
from opsctl.state import atomic_write


@dataclasses.dataclass(frozen=True)
class TunedValues:
    """Values to override; None leaves Ansible's value in force."""

    mem_fraction_static: float | None = None
    chunked_prefill_size: int | None = None
    expandable_segments: bool | None = None

    def is_empty(self) -> bool:
        return all(value is None for value in dataclasses.astuple(self))

    def merged_over(self, base: TunedValues) -> TunedValues:
        """These values where set, else `base`'s."""
        return TunedValues(*(mine if mine is not None else theirs
                             for mine, theirs in zip(dataclasses.astuple(self), dataclasses.astuple(base), strict=True)))


def validate(values: TunedValues) -> None:
    """Reject values SGLang would refuse or that make no sense, with what to use instead."""
    fraction = values.mem_fraction_static
    if fraction is not None and not 0 < fraction < 1:
        raise click.BadParameter(f"{fraction} is not a fraction: use a value strictly between 0 and 1 "
                                 "(the seed's node runs 0.93)", param_hint="--fraction")
    chunk = values.chunked_prefill_size
    if chunk is not None and chunk != -1 and chunk <= 0:
        raise click.BadParameter(f"{chunk} is not a chunk size: use a positive token count (e.g. 4096) "
                                 "or -1 to disable chunked prefill", param_hint="--chunked-prefill-size")


def values_in(env: dict[str, str], source: str = "the environment file") -> TunedValues:
    """The tuned values an environment file sets; a value that is not a number is an error that
    names the file, the line and the way out (every restart and the guard read these files)."""
    def number(key: str, kind: type):
        if key not in env:
            return None
        try:
            return kind(env[key])
        except ValueError:
            raise click.ClickException(
                f"{source}: {key}={env[key]!r} is not {'a number' if kind is float else 'a whole number'}; "
                "correct that line (opsctl's override file can be rewritten with "
                "`opsctl overrides clear --no-restart`)") from None

    return TunedValues(
        mem_fraction_static=number(FRACTION, float),
        chunked_prefill_size=number(CHUNK, int),
        expandable_segments=expandable_segments_from_env(env.get(ALLOC_CONF)),
    )


def values_in_file(path: Path) -> TunedValues:
    return values_in(read_env(path), str(path))


def _one_line(text: str) -> str:
    """Free text for a comment line: a newline in it would start a live line of the file."""
    return " ".join(str(text).split())


def render_overrides(values: TunedValues, env_file: Path, written_by: str, reason: str) -> str:
    return render("sglang-override.env.j2", {
        **dataclasses.asdict(values),
        "env_file": env_file,
        "written_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "written_by": _one_line(written_by),
        "reason": _one_line(reason),
    })


def values_in_force(env_file: Path, override_file: Path) -> TunedValues:
    """The tuned values the engine's next start reads: opsctl's overrides over Ansible's file."""
    return values_in_file(override_file).merged_over(values_in_file(env_file))


def read_override_text(path: Path) -> str:
    """The override file's text, byte for byte ("" when there is none): what a rollback restores.
    One that cannot be read (or is not UTF-8: a hand edit in another encoding) is an error that
    says how to go on; opsctl never rewrites a file it could not read."""
    try:
        return path.read_text() if path.exists() else ""
    except (OSError, UnicodeDecodeError) as error:
        raise click.ClickException(
            f"cannot read {path}: {getattr(error, 'strerror', None) or error}. Fix the file (it must be UTF-8), or "
            "drop every override with `opsctl overrides clear --no-restart`; nothing was changed") from None


def write_override_text(path: Path, text: str) -> None:
    atomic_write(path, text, mode=0o644)
