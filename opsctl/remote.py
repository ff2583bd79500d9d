"""Run opsctl on a node from an operator's machine: the node's own opsctl does the work.

`opsctl -H docker://dflash-train status`, `opsctl -H ssh://ops@gpu-host restart --fraction 0.93`, or
`opsctl -i ansible/inventories/production -l dflash-train status` (the connection comes from the
inventory, through `ansible-inventory`). The node reads its own journal, unit and files, so a
command behaves the same from anywhere; its output and exit code come back unchanged.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import click

from opsctl.commands.status import UNKNOWN

TARGET_OPTIONS = {"-H": "host", "--host": "host", "-i": "inventory", "--inventory": "inventory",
                  "-l": "limit", "--limit": "limit"}


def _target_option(word: str) -> tuple[str, str | None] | None:
    """(name, value or None) of a target option in any of click's spellings: `-H X`, `-HX`,
    `--host X`, `--host=X`; None for any other word."""
    if word in TARGET_OPTIONS:
        return TARGET_OPTIONS[word], None
    flag, eq, value = word.partition("=")
    if eq and flag.startswith("--") and flag in TARGET_OPTIONS:
        return TARGET_OPTIONS[flag], value
    if len(word) > 2 and not word.startswith("--") and word[:2] in TARGET_OPTIONS:
        return TARGET_OPTIONS[word[:2]], word[2:]
    return None


def split_target_args(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """Take the target options that come before the command name; return them and the rest."""
    target: dict[str, str] = {}
    rest = list(argv)
    while rest and (option := _target_option(rest[0])) is not None:
        flag = rest.pop(0)
        name, value = option
        if value is None:
            if not rest:
                raise click.UsageError(f"{flag} needs a value")
            value = rest.pop(0)
        if not value:
            raise click.UsageError(f"{flag.partition('=')[0]} needs a value")
        target[name] = value
    return target, rest


def _ansible_inventory() -> str:
    """ansible-inventory of the Python environment opsctl runs in (a venv need not be activated),
    else the one on PATH."""
    beside = Path(sys.executable).parent / "ansible-inventory"
    return str(beside) if beside.is_file() else (shutil.which("ansible-inventory") or "ansible-inventory")


def _from_inventory(inventory: str, host: str) -> str:
    try:
        result = subprocess.run([_ansible_inventory(), "-i", inventory, "--host", host],
                                capture_output=True, text=True, check=False, timeout=60)
    except FileNotFoundError:
        raise _unreached("ansible-inventory is not installed here: it finds -l's host in the inventory "
                         "(install opsctl's dev extra, or give the node as -H ssh://HOST)") from None
    except subprocess.TimeoutExpired as exc:
        raise _unreached(f"ansible-inventory -i {inventory} did not answer within 60 s") from exc
    if result.returncode != 0:
        why = (result.stderr.strip().splitlines() or ["no message"])[-1]
        raise _unreached(f"host {host} not found in {inventory}: {why}")
    hostvars = json.loads(result.stdout)
    address = hostvars.get("ansible_host", host)
    if hostvars.get("ansible_connection", "ssh").endswith("docker"):
        return f"docker://{address}"
    user = hostvars.get("ansible_user")
    port = hostvars.get("ansible_port")
    if ":" in str(address) and not str(address).startswith("["):  # an IPv6 address: bracketed in a URL
        address = f"[{address}]"
    return f"ssh://{user + '@' if user else ''}{address}{':' + str(port) if port else ''}"


def _target_url(target: dict[str, str]):
    """The target as a parsed docker:// or ssh:// URL (a bare HOST is ssh)."""
    if "limit" in target and "inventory" not in target:
        raise click.UsageError("-l/--limit needs -i/--inventory")
    if "inventory" in target and "limit" not in target and "host" not in target:
        raise click.UsageError("-i/--inventory needs -l/--limit HOST: the inventory host to run on")
    url = target.get("host") or _from_inventory(target["inventory"], target.get("limit", ""))
    usage = "use docker://CONTAINER or ssh://[USER@]HOST[:PORT] (an IPv6 host in brackets: ssh://[2001:db8::1])"
    try:
        parsed = urlparse(url if "://" in url else f"ssh://{url}")
        parsed.port  # noqa: B018 - urlparse checks the port only when it is read
    except ValueError as error:  # a port that is not a number or out of range, an unclosed bracket
        raise click.UsageError(f"bad target {url!r} ({error}): {usage}") from None
    if parsed.scheme not in ("docker", "ssh"):
        raise click.UsageError(f"unknown target {url!r}: {usage}")
    if not (parsed.netloc if parsed.scheme == "docker" else parsed.hostname):
        raise click.UsageError(f"target {url!r} names no node: {usage}")
    return parsed


def remote_command(target: dict[str, str], args: list[str]) -> list[str]:
    """The local command that runs `opsctl ARGS` on the target node."""
    return _command(_target_url(target), args)


def _command(parsed, args: list[str]) -> list[str]:
    # An operator at a terminal gets one on the node too: Ctrl-C there reaches the node's opsctl
    # (a restart then puts the previous override file back and exits 3, as on the node). A
    # dropped session (a hangup with a terminal, a closed pipe without) does not stop a restart:
    # it runs to its end, rollback included. Piped output gets no terminal, so stdout stays the
    # node's stdout alone (a --json document, unmixed with stderr).
    terminal = sys.stdin.isatty() and sys.stdout.isatty()
    if parsed.scheme == "docker":
        return ["docker", "exec", "--interactive", *(["--tty"] if terminal else []), parsed.netloc, "opsctl", *args]
    if parsed.scheme == "ssh":
        port = ["-p", str(parsed.port)] if parsed.port else []
        login = f"{parsed.username}@{parsed.hostname}" if parsed.username else parsed.hostname
        # A dead host must not hold a check for ssh's minutes; without a terminal (a monitoring
        # run) a password prompt would wait for ever.
        options = ["-o", "ConnectTimeout=10", *([] if sys.stdin.isatty() else ["-o", "BatchMode=yes"])]
        return ["ssh", *options, *(["-t"] if terminal else []), *port, login, "opsctl " + shlex.join(args)]


# A node that was not reached exits 3 whatever the command: "not known" for status (a Nagios
# check: docker exec's 1 would read as WARNING, ssh's 255 as nothing at all), oom and guard
# status, "could not be followed" for a restart; never a code that reads as the node's answer
# (oom's 1 is "found", restart's 1 "rolled back").
EXIT_UNREACHED = UNKNOWN
SSH_FAILED = 255  # ssh's own exit status when it fails (the node's opsctl never exits 255)


def _unreached(message: str) -> click.ClickException:
    error = click.ClickException(f"{message}; nothing was run on the node")
    error.exit_code = EXIT_UNREACHED
    return error


def _check_container(container: str) -> None:
    """docker exec's own failure (exit 1) would pass for the node's answer: ask first."""
    inspect = subprocess.run(["docker", "container", "inspect", "--format", "{{.State.Running}}", container],
                             capture_output=True, text=True, check=False, timeout=30)
    why = (inspect.stderr or inspect.stdout).strip()
    if inspect.returncode != 0 and "no such" not in why.lower():
        raise _unreached(f"cannot ask the local Docker engine about node container {container} ({why})")
    if inspect.stdout.strip() != "true":
        raise _unreached(f"node container {container} is not running ({why or 'stopped'})")


def run_remote(target: dict[str, str], args: list[str]) -> int:
    parsed = _target_url(target)
    command = _command(parsed, args)
    try:
        if parsed.scheme == "docker":
            _check_container(parsed.netloc)
        code = subprocess.call(command)
    except FileNotFoundError as exc:
        raise _unreached(f"{command[0]} is not installed here: it carries the command to the node "
                         f"(install it, or run opsctl on the node itself)") from exc
    except subprocess.TimeoutExpired as exc:
        raise _unreached("docker did not answer within 30 s") from exc
    if args[:1] == ["status"] and code not in (0, 1, 2, 3):
        click.echo(f"UNKNOWN: the node's opsctl was not reached ({command[0]} exited {code})", err=True)
        return EXIT_UNREACHED
    if parsed.scheme == "ssh" and code == SSH_FAILED:
        click.echo(f"the node's opsctl was not reached, or the connection dropped (ssh exited {code}); "
                   "what it did is not known here", err=True)
        return EXIT_UNREACHED
    return code
