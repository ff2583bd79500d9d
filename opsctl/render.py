"""Render the unit and environment files from templates/, the one source Ansible uses too.

Ansible renders the unit and the tuned environment file with its `template` module; opsctl
renders the override file with the same Jinja2 templates, and tests render all of them to
check what the unit really passes to SGLang.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jinja2
import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
ROLE_DEFAULTS = REPO_ROOT / "ansible" / "roles" / "sglang" / "defaults" / "main.yml"
ROLE_VARS = REPO_ROOT / "ansible" / "roles" / "sglang" / "vars" / "main.yml"


def templates_dir() -> Path:
    """The templates folder: the checkout's, else the copy shipped inside the package."""
    checkout = REPO_ROOT / "templates"
    if checkout.is_dir():
        return checkout
    # Installed: pyproject.toml ships templates/ as the package data folder opsctl/_templates.
    return Path(__file__).resolve().parent / "_templates"


def _ansible_bool(value: Any) -> bool:
    """Ansible's `bool` filter: extra vars arrive as strings ("false", "no", "0" are false)."""
    if isinstance(value, str):
        return value.strip().lower() in ("yes", "on", "1", "true", "y", "t")
    return bool(value)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(templates_dir()),
        undefined=jinja2.StrictUndefined,  # a missing variable is an error, not an empty string
        keep_trailing_newline=False,  # as Ansible's template module
        trim_blocks=True,
    )
    env.filters["bool"] = _ansible_bool
    return env


def render(template: str, variables: dict[str, Any]) -> str:
    """Render one template (file name inside templates/) with `variables`."""
    return _environment().get_template(template).render(**variables)


def role_settings(**overrides: Any) -> dict[str, Any]:
    """The sglang role's defaults and derived vars, with `overrides` applied.

    Mirrors what Ansible does for this role: defaults, then the inventory (here: overrides),
    then vars/main.yml, whose `__`-prefixed entries are Jinja expressions of the others.
    """
    settings = yaml.safe_load(ROLE_DEFAULTS.read_text())
    settings.update(overrides)
    env = _environment()
    for name, expression in yaml.safe_load(ROLE_VARS.read_text()).items():
        settings[name] = _evaluate(env, expression, settings)
    return settings


def _evaluate(env: jinja2.Environment, expression: Any, settings: dict[str, Any]) -> Any:
    if not isinstance(expression, str) or "{{" not in expression:
        return expression
    inner = expression.strip()
    if inner.startswith("{{") and inner.endswith("}}"):
        # A whole-value expression keeps its type (a list stays a list), as in Ansible.
        return env.compile_expression(inner[2:-2].strip())(**settings)
    return env.from_string(expression).render(**settings)


def parse_env_file(text: str) -> dict[str, str]:
    """KEY=VALUE lines of a systemd EnvironmentFile (comments and blanks skipped)."""
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        values[key.strip()] = value.strip().strip('"')
    return values


# systemd's C escapes (systemd.syntax(7)); any other escaped character stands for itself
_C_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "s": " "}


def _split_words(command: str) -> list[str]:
    """A command line split into words as systemd splits it: at whitespace outside quotes,
    with C escapes in and out of quotes."""
    words: list[str] = []
    word: list[str] = []
    quote, in_word, index = None, False, 0
    while index < len(command):
        char = command[index]
        if char == "\\" and index + 1 < len(command):
            word.append(_C_ESCAPES.get(command[index + 1], command[index + 1]))
            in_word, index = True, index + 2
            continue
        if quote:
            if char == quote:
                quote = None
            else:
                word.append(char)
        elif char in "\"'":
            quote, in_word = char, True
        elif char in " \t\r\n":  # systemd's separators (not every character Python calls space)
            if in_word:
                words.append("".join(word))
            word, in_word = [], False
        else:
            word.append(char)
            in_word = True
        index += 1
    if quote:
        raise ValueError(f"ExecStart has an unbalanced {quote} quote")
    if in_word:
        words.append("".join(word))
    return words


def exec_start_argv(unit_text: str, environment: dict[str, str]) -> list[str]:
    """The ExecStart command line of a rendered unit as systemd runs it (systemd.service(5),
    "Command lines"): %% is %, words are split and unquoted, then ${VAR} is expanded within a
    word, a word $VAR becomes the value's own words, and $$ is $."""
    joined = unit_text.replace("\\\n", " ")
    match = re.search(r"^ExecStart=(.*)$", joined, flags=re.MULTILINE)
    if match is None:
        raise ValueError("the unit has no ExecStart= line")
    argv: list[str] = []
    for word in _split_words(match.group(1).replace("%%", "%")):
        alone = re.fullmatch(r"\$(\w+)", word)
        if alone:
            argv.extend(environment.get(alone.group(1), "").split())
            continue
        argv.append(re.sub(r"\$\$|\$\{(\w+)\}",
                           lambda var: "$" if var.group(1) is None else environment.get(var.group(1), ""), word))
    return argv


def engine_argv(**overrides: Any) -> list[str]:
    """The SGLang flags the rendered unit passes to the engine (everything after the image)."""
    settings = role_settings(**overrides)
    environment = parse_env_file(render("sglang.env.j2", settings))
    argv = exec_start_argv(render("sglang.service.j2", settings), environment)
    return argv[argv.index(settings["sglang_image"]) + 1 :]
