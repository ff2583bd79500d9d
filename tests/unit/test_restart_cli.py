"""opsctl restart / overrides: the errors a person sees before anything on the node changes."""

import contextlib
import json
import os
import signal as signals
import subprocess
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from opsctl.cli import cli
from opsctl.locking import engine_lock
from opsctl.restart import Terminated


@pytest.fixture
def node(tmp_path, monkeypatch):
    """A node's files under tmp_path: Ansible's env file, an override file, the state folder."""
    env_file, override = tmp_path / "sglang.env", tmp_path / "override.env"
    env_file.write_text("SGLANG_MEM_FRACTION_STATIC=0.93\nSGLANG_CHUNKED_PREFILL_SIZE=4096\n"
                        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n")
    override.write_text("# Managed by opsctl\nSGLANG_MEM_FRACTION_STATIC=0.94\n")
    config = tmp_path / "opsctl.yml"
    config.write_text(f"env_file: {env_file}\noverride_env_file: {override}\nstate_dir: {tmp_path / 'state'}\n")
    monkeypatch.setenv("OPSCTL_CONFIG", str(config))
    return tmp_path


@pytest.mark.parametrize("args, message", [
    (["--fraction", "1.3"], "1.3 is not a fraction: use a value strictly between 0 and 1"),
    (["--fraction", "0"], "0.0 is not a fraction"),
    (["--chunked-prefill-size", "-5"], "-5 is not a chunk size: use a positive token count"),
])
def test_restart_refuses_bad_values(node, args, message):
    result = CliRunner().invoke(cli, ["restart", *args])
    assert result.exit_code == 2
    assert message in result.output
    # Nothing changed: the override file is as it was, no history was written.
    assert (node / "override.env").read_text() == "# Managed by opsctl\nSGLANG_MEM_FRACTION_STATIC=0.94\n"
    assert not (node / "state" / "history.jsonl").exists()


def test_restart_refuses_while_another_change_holds_the_lock(node):
    with engine_lock(node / "state", "opsctl-guard: remediation"):
        result = CliRunner().invoke(cli, ["restart", "--fraction", "0.92"])
    assert result.exit_code == 2
    assert "another engine change is in progress" in result.output
    assert "opsctl-guard: remediation" in result.output


def test_a_user_who_may_not_take_the_lock_is_refused_with_what_to_do(node, monkeypatch):
    """Not root: the state folder is root's (0750). A refusal (exit 2: nothing changed), not a
    traceback with exit 1, which reads as "rolled back"."""
    from opsctl import locking

    class RootsLock:
        def __init__(self, path):
            self.path = path

        def acquire(self, timeout):
            raise PermissionError(13, "Permission denied", self.path)
    monkeypatch.setattr(locking, "FileLock", RootsLock)
    result = CliRunner().invoke(cli, ["restart", "--fraction", "0.92"])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert "need root on the node (sudo opsctl ...)" in result.output and "nothing was changed" in result.output
    assert (node / "override.env").read_text() == ORIGINAL_OVERRIDE


def test_an_override_file_that_cannot_be_written_is_refused_and_recorded(node, monkeypatch):
    from opsctl import restart as restart_module

    def read_only(path, text):
        raise PermissionError(13, "Permission denied", str(path))
    monkeypatch.setattr(restart_module, "write_override_text", read_only)
    starts = _fake_starts(monkeypatch, node, True)
    result = CliRunner().invoke(cli, ["restart", "--fraction", "0.92", "--force"])
    assert result.exit_code == 2 and "nothing was changed and the engine was not restarted" in result.output
    assert starts == [] and (node / "override.env").read_text() == ORIGINAL_OVERRIDE
    assert [r["outcome"] for r in _history(node)] == ["started", "refused"]


ORIGINAL_OVERRIDE = "# Managed by opsctl\nSGLANG_MEM_FRACTION_STATIC=0.94\n"


def _history(node):
    return [json.loads(line) for line in (node / "state" / "history.jsonl").read_text().splitlines()]


def _fake_starts(monkeypatch, node, *results):
    """start_and_wait answering from `results` in turn (a StartReport's ok flag, or an exception),
    recording the override file each start would read."""
    from opsctl import restart as restart_module
    seen = []

    def start(config, budget_s, progress):
        seen.append((node / "override.env").read_text())
        result = results[len(seen) - 1]
        if isinstance(result, BaseException):
            raise result
        return restart_module.StartReport(result, "healthy" if result else "the engine exited (status 1)",
                                          1.0, "ready" if result else "loading weights", [])
    monkeypatch.setattr(restart_module, "start_and_wait", start)
    return seen


def test_a_failed_start_rolls_back_to_the_previous_override_file(node, monkeypatch):
    seen = _fake_starts(monkeypatch, node, False, True)
    result = CliRunner().invoke(cli, ["restart", "--fraction", "0.91", "--force"])
    assert result.exit_code == 1, result.output
    assert "SGLANG_MEM_FRACTION_STATIC=0.91" in seen[0] and seen[1] == ORIGINAL_OVERRIDE
    assert (node / "override.env").read_text() == ORIGINAL_OVERRIDE
    assert [(r["event"], r["outcome"]) for r in _history(node)] == [
        ("restart", "started"), ("restart", "failed"), ("rollback", "ok")]


@pytest.mark.parametrize("error", [click.ClickException("systemctl restart sglang.service failed: timeout"),
                                   FileNotFoundError("journalctl")])
def test_a_restart_that_cannot_be_followed_restores_the_override_file(node, monkeypatch, error):
    _fake_starts(monkeypatch, node, error)
    result = CliRunner().invoke(cli, ["restart", "--fraction", "0.91", "--force"])
    assert result.exit_code == 3, result.output  # not 2: the file had been written
    assert "the previous override file is restored" in result.output and str(error) in result.output
    assert (node / "override.env").read_text() == ORIGINAL_OVERRIDE
    last = _history(node)[-1]
    assert (last["event"], last["outcome"], last["override_restored"]) == ("restart", "abandoned", True)


@pytest.mark.parametrize("stop, why", [(KeyboardInterrupt(), "interrupted"),
                                       (Terminated("SIGTERM"), "terminated by SIGTERM")])
def test_an_interrupted_restart_restores_the_override_file(node, monkeypatch, stop, why):
    """Ctrl-C, or SIGTERM (`terminations_unwind` makes it Terminated) once the file is written:
    the file is back, the history says why, exit 3, since the engine may run the new values
    until its next start."""
    _fake_starts(monkeypatch, node, stop)
    result = CliRunner().invoke(cli, ["restart", "--fraction", "0.91", "--force"])
    assert result.exit_code == 3 and f"could not be followed ({why})" in result.output
    assert (node / "override.env").read_text() == ORIGINAL_OVERRIDE
    assert _history(node)[-1]["why"] == why


def test_a_value_that_is_not_a_number_is_named_with_its_file(node):
    (node / "override.env").write_text("SGLANG_MEM_FRACTION_STATIC=0,94\n")
    result = CliRunner().invoke(cli, ["overrides", "--json"])  # (2 as for restart: 1 is "rolled back")
    assert result.exit_code == 2 and "SGLANG_MEM_FRACTION_STATIC='0,94' is not a number" in result.output
    assert str(node / "override.env") in result.output
    result = CliRunner().invoke(cli, ["restart", "--chunked-prefill-size", "2048"])
    assert result.exit_code == 2 and "overrides clear --no-restart" in result.output
    assert (node / "override.env").read_text() == "SGLANG_MEM_FRACTION_STATIC=0,94\n"
    # the way out the message names works on that file
    assert CliRunner().invoke(cli, ["overrides", "clear", "--no-restart"]).exit_code == 0
    assert CliRunner().invoke(cli, ["overrides", "--json"]).exit_code == 0


def test_overrides_show_their_source_and_ansible_value(node):
    result = CliRunner().invoke(cli, ["overrides"])
    assert result.exit_code == 0
    assert "mem_fraction_static = 0.94 (Ansible: 0.93)" in result.output
    shown = json.loads(CliRunner().invoke(cli, ["overrides", "--json"]).output)
    assert shown["overrides"]["mem_fraction_static"] == 0.94
    assert shown["effective"]["chunked_prefill_size"]["source"] == "ansible"


def test_overrides_clear_without_restart_rewrites_the_file_and_records_it(node):
    result = CliRunner().invoke(cli, ["overrides", "clear", "--no-restart", "--reason", "back to inventory"])
    assert result.exit_code == 0
    text = (node / "override.env").read_text()
    assert "SGLANG_MEM_FRACTION_STATIC" not in text and "back to inventory" in text
    record = json.loads((node / "state" / "history.jsonl").read_text().splitlines()[-1])
    assert record["event"] == "overrides-clear" and record["reason"] == "back to inventory"


def test_remote_targets_become_the_node_side_command(monkeypatch):
    from opsctl import remote

    monkeypatch.setattr("sys.stdout.isatty", lambda: False)
    target, rest = remote.split_target_args(["-H", "docker://dflash-train", "restart", "--fraction", "0.93"])
    assert target == {"host": "docker://dflash-train"} and rest == ["restart", "--fraction", "0.93"]
    assert remote.remote_command(target, rest) == [
        "docker", "exec", "--interactive", "dflash-train", "opsctl", "restart", "--fraction", "0.93"]
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)  # a monitoring run: no password prompt
    assert remote.remote_command({"host": "ssh://ops@gpu-7:2222"}, ["status", "--json"]) == [
        "ssh", "-o", "ConnectTimeout=10", "-o", "BatchMode=yes", "-p", "2222", "ops@gpu-7", "opsctl status --json"]
    with pytest.raises(click.UsageError, match="unknown target 'ftp://node'"):
        remote.remote_command({"host": "ftp://node"}, ["status"])
    with pytest.raises(click.UsageError, match="-l/--limit needs -i/--inventory"):
        remote.remote_command({"limit": "dflash-train"}, ["status"])


def test_an_operator_at_a_terminal_gets_one_on_the_node_so_ctrl_c_reaches_it(monkeypatch):
    """Without a terminal on the node, Ctrl-C only killed the local ssh: the node's restart went
    on unseen. At a terminal the node's opsctl now gets one (its Ctrl-C restores the file and
    exits 3); piped output gets none, so a --json document stays unmixed with stderr."""
    from opsctl import remote

    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    assert remote.remote_command({"host": "ssh://ops@gpu-7"}, ["restart", "--fraction", "0.92"]) == [
        "ssh", "-o", "ConnectTimeout=10", "-t", "ops@gpu-7", "opsctl restart --fraction 0.92"]
    assert remote.remote_command({"host": "docker://dflash-train"}, ["status"]) == [
        "docker", "exec", "--interactive", "--tty", "dflash-train", "opsctl", "status"]
    monkeypatch.setattr("sys.stdout.isatty", lambda: False)  # `opsctl -H ... status --json | jq`
    assert remote.remote_command({"host": "ssh://ops@gpu-7"}, ["status", "--json"]) == [
        "ssh", "-o", "ConnectTimeout=10", "ops@gpu-7", "opsctl status --json"]
    assert "--tty" not in remote.remote_command({"host": "docker://dflash-train"}, ["status", "--json"])


def test_a_reader_that_went_away_does_not_stop_a_restart(node, monkeypatch):
    """A dropped ssh session closes the node's stderr: rich turned the broken pipe at the next
    progress line into SystemExit(1), abandoning the start with no rollback and exiting 1 ("rolled
    back"). Now the console goes quiet and the restart runs to its end, rollback included."""
    from opsctl import output
    from opsctl import restart as restart_module

    read_end, write_end = os.pipe()
    os.close(read_end)
    closed = output._Console(file=os.fdopen(write_end, "w"), force_terminal=False)
    monkeypatch.setattr("opsctl.commands.restart.err_console", closed)
    progress_lines = []

    def start(config, budget_s, progress):
        progress("loading weights", 1.0)  # written to the closed pipe
        progress_lines.append("after")
        return restart_module.StartReport(len(progress_lines) == 2, "the engine exited (status 1)", 1.0,
                                          "loading weights", [])
    monkeypatch.setattr(restart_module, "start_and_wait", start)
    try:
        result = CliRunner().invoke(cli, ["restart", "--fraction", "0.91", "--force"])
    finally:
        with contextlib.suppress(BrokenPipeError):
            closed.file.close()
    assert result.exit_code == 1, result.output  # rolled back, healthy again
    assert progress_lines == ["after", "after"] and closed.quiet
    assert [(r["event"], r["outcome"]) for r in _history(node)] == [
        ("restart", "started"), ("restart", "failed"), ("rollback", "ok")]
    assert (node / "override.env").read_text() == ORIGINAL_OVERRIDE


def test_a_dropped_session_lets_the_restart_run_to_its_end_silently(node, monkeypatch):
    """With a terminal (opsctl -H ssh:// gives the node's opsctl one), a dropped session is a
    SIGHUP: it used to abandon the restart halfway, the engine on the new values and the file put
    back. Now the restart goes on, rollback included, and prints nothing more."""
    from opsctl import output
    from opsctl import restart as restart_module

    monkeypatch.setattr(output.console, "quiet", False)
    monkeypatch.setattr(output.err_console, "quiet", False)
    starts = []

    def start(config, budget_s, progress):
        starts.append(1)
        if len(starts) == 1:
            signals.raise_signal(signals.SIGHUP)
        return restart_module.StartReport(len(starts) == 2, "the engine exited (status 1)", 1.0, "ready", [])
    monkeypatch.setattr(restart_module, "start_and_wait", start)
    result = CliRunner().invoke(cli, ["restart", "--fraction", "0.91", "--force"])
    assert result.exit_code == 1 and len(starts) == 2  # the failed start was rolled back
    assert output.err_console.quiet
    assert [(r["event"], r["outcome"]) for r in _history(node)] == [
        ("restart", "started"), ("restart", "failed"), ("rollback", "ok")]


def test_a_systemexit_while_following_a_start_restores_the_file_and_exits_3(node, monkeypatch):
    _fake_starts(monkeypatch, node, SystemExit(1))
    result = CliRunner().invoke(cli, ["restart", "--fraction", "0.91", "--force"])
    assert result.exit_code == 3 and "could not be followed (SystemExit: 1)" in result.output
    assert (node / "override.env").read_text() == ORIGINAL_OVERRIDE


def _ctrl_c_while_restoring(monkeypatch):
    """A Ctrl-C arrives while the previous override file is being written back."""
    from opsctl import restart as restart_module
    real_write = restart_module.write_override_text

    def write_with_ctrl_c(path, text):
        if text == ORIGINAL_OVERRIDE:
            signals.raise_signal(signals.SIGINT)
        real_write(path, text)
    monkeypatch.setattr(restart_module, "write_override_text", write_with_ctrl_c)


def test_a_second_ctrl_c_during_the_restore_is_held_off_until_the_file_is_back(node, monkeypatch):
    """The first Ctrl-C stops the start; a second one during the restore's write used to cancel
    it, leaving 0.91 in the file, and print "before anything changed" with exit 2."""

    _fake_starts(monkeypatch, node, KeyboardInterrupt())
    _ctrl_c_while_restoring(monkeypatch)
    result = CliRunner().invoke(cli, ["restart", "--fraction", "0.91", "--force"])
    assert result.exit_code == 3 and "could not be followed (interrupted)" in result.output, result.output
    assert (node / "override.env").read_text() == ORIGINAL_OVERRIDE
    assert _history(node)[-1]["outcome"] == "abandoned"


def test_ctrl_c_during_the_rollbacks_write_still_puts_the_previous_file_back(node, monkeypatch):

    seen = _fake_starts(monkeypatch, node, False, True)
    _ctrl_c_while_restoring(monkeypatch)
    result = CliRunner().invoke(cli, ["restart", "--fraction", "0.91", "--force"])
    assert result.exit_code == 3 and "the rollback's start could not be followed (interrupted)" in result.output
    assert len(seen) == 1 and (node / "override.env").read_text() == ORIGINAL_OVERRIDE
    assert [(r["event"], r["outcome"]) for r in _history(node)] == [
        ("restart", "started"), ("restart", "failed"), ("rollback", "abandoned")]


def test_a_signal_held_off_during_the_write_reaches_the_guards_own_handler(node, monkeypatch):
    """The guard's SIGTERM handler sets its stop flag and lets the step finish: a SIGTERM held off
    while the override file was written must reach it (before, it was dropped or turned into
    Terminated, abandoning the step with no rollback), and the restart goes on."""
    from opsctl import restart as restart_module
    from opsctl.overrides import TunedValues

    stops = []
    previous = signals.signal(signals.SIGTERM, lambda signum, frame: stops.append(signum))
    try:
        real_write = restart_module.write_override_text

        def write_with_sigterm(path, text):
            signals.raise_signal(signals.SIGTERM)
            real_write(path, text)
        monkeypatch.setattr(restart_module, "write_override_text", write_with_sigterm)
        seen = _fake_starts(monkeypatch, node, True)
        from opsctl.config import load_config
        outcome = restart_module.restart(load_config(), TunedValues(0.91), reason="guard step 1: x", force=True,
                                         budget_s=10, wait_lock_s=0, progress=lambda *a: None)
    finally:
        signals.signal(signals.SIGTERM, previous)
    assert outcome.ok and stops == [signals.SIGTERM] and len(seen) == 1
    assert "SGLANG_MEM_FRACTION_STATIC=0.91" in (node / "override.env").read_text()


STARTUP_093 = (Path(__file__).parents[1] / "fixtures" / "oom" / "startup_093.log").read_text().splitlines()


@pytest.mark.parametrize("args, refused", [
    ([], False),                                          # a plain restart of a hung engine
    (["--chunked-prefill-size", "2048"], False),          # a safer chunk
    (["--fraction", "0.92"], True),                       # a smaller pool, further from the target
    (["--fraction", "0.932"], False),                     # a larger pool, still short: better, warned
])
def test_the_planner_refuses_only_a_change_that_makes_its_problem_worse(node, monkeypatch, args, refused):
    """A node on the default 200k target whose 0.93 start logged 195,011 tokens: a bare restart
    (or a smaller chunk) was refused for a fraction nobody was changing."""
    (node / "override.env").write_text("# Managed by opsctl\n")
    monkeypatch.setattr("opsctl.commands.restart._journal_lines", lambda: STARTUP_093)
    seen = _fake_starts(monkeypatch, node, True)
    result = CliRunner().invoke(cli, ["restart", *args])
    assert "of the 200,000-token target" in result.output
    if refused:
        assert result.exit_code == 2 and "the planner refuses this change" in result.output and seen == []
    else:
        assert result.exit_code == 0, result.output
        assert "the planner warns (the values in force already have this; not refused)" in result.output


@pytest.mark.parametrize("args, refused", [
    ([], False),                                          # a plain restart changes no value
    (["--fraction", "0.99"], True),                       # unchecked: would have gone through silently
    (["--chunked-prefill-size", "16384"], True),
    (["--chunked-prefill-size", "-1"], True),             # no chunking: the whole prompt at once
    (["--no-expandable-segments"], True),
    (["--fraction", "0.99", "--force"], False),
    (["--fraction", "0.92"], False),                      # what oom advises after a crash: less
    (["--chunked-prefill-size", "2048"], False),          # headroom taken, never refused
    (["--expandable-segments"], False),
])
def test_a_change_the_planner_cannot_check_needs_force(node, monkeypatch, args, refused):
    """No engine start in the journal (a new node, a rotated journal): the planner had no inputs
    and passed everything, so `--fraction 0.99` reached systemctl without a word."""
    monkeypatch.setattr("opsctl.commands.restart._journal_lines", lambda: [])
    seen = _fake_starts(monkeypatch, node, True)
    result = CliRunner().invoke(cli, ["restart", *args])
    if refused:
        assert result.exit_code == 2 and "the planner cannot check this change" in result.output
        assert seen == [] and (node / "override.env").read_text() == ORIGINAL_OVERRIDE
    else:
        assert result.exit_code == 0, result.output
        assert len(seen) == 1


@pytest.mark.parametrize("argv", [["--host=docker://dflash-train", "status"], ["-Hdocker://dflash-train", "status"],
                                  ["--host", "docker://dflash-train", "status"]])
def test_every_spelling_of_a_target_goes_to_the_node(argv):
    from opsctl import remote

    assert remote.split_target_args(argv) == ({"host": "docker://dflash-train"}, ["status"])


def test_target_mistakes_are_usage_errors_not_tracebacks(monkeypatch, capsys):
    """A mistyped target exits 2 (usage), or UNKNOWN (3) for a check: a monitoring config's typo
    must not page as CRITICAL. A bad port or bracket used to escape as a ValueError (exit 1,
    "rolled back" for a restart, WARNING for status)."""
    from opsctl import cli as cli_module

    for argv, message in ((["-H"], "-H needs a value"), (["--host=", "status"], "--host needs a value"),
                          (["-H", "bogus://x", "status"], "unknown target 'bogus://x'"),
                          (["-i", "inventory.ini", "status"], "-i/--inventory needs -l/--limit HOST"),
                          (["-H", "ssh://node:22x", "status"], "bad target 'ssh://node:22x'"),
                          (["-H", "ssh://node:99999", "restart", "--fraction", "0.9"], "bad target"),
                          (["-H", "ssh://[::1", "guard", "status"], "bad target 'ssh://[::1'"),
                          (["-H", "2001:db8::1", "oom"], "an IPv6 host in brackets"),
                          (["-H", "ssh://", "status"], "names no node"),
                          (["-H", "docker://", "status"], "names no node")):
        monkeypatch.setattr("sys.argv", ["opsctl", *argv])
        with pytest.raises(SystemExit) as exit_:
            cli_module.main()
        check = argv[-1] == "status"
        assert exit_.value.code == (3 if check else 2), argv
        assert message in capsys.readouterr().err, argv
    # a target option after the group (where main() does not look) is refused, not ignored
    result = CliRunner().invoke(cli, ["--limit", "dflash-train", "status"])
    assert result.exit_code == 2 and "before the command" in result.output
    # a typo before the command: UNKNOWN for a check, click's 2 elsewhere
    assert CliRunner().invoke(cli, ["--bogus", "status", "--json"]).exit_code == 3
    assert CliRunner().invoke(cli, ["--bogus", "guard", "status"]).exit_code == 3
    assert CliRunner().invoke(cli, ["--bogus", "restart"]).exit_code == 2
    assert CliRunner().invoke(cli, ["--bogus", "guard", "pause"]).exit_code == 2


def test_an_ipv6_inventory_address_becomes_a_bracketed_target(monkeypatch):
    from opsctl import remote

    answer = json.dumps({"ansible_host": "2001:db8::7", "ansible_user": "ops", "ansible_port": 2222})
    monkeypatch.setattr(remote.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a[0], 0, stdout=answer, stderr=""))
    command = remote.remote_command({"inventory": "inv.ini", "limit": "gpu-7"}, ["status"])
    assert command[-3:] == ["2222", "ops@2001:db8::7", "opsctl status"]


def test_a_missing_transport_is_a_clear_error(monkeypatch, capsys):
    from opsctl import cli as cli_module

    monkeypatch.setenv("PATH", "")
    monkeypatch.setattr("sys.argv", ["opsctl", "-H", "ssh://ops@gpu-7", "status"])
    with pytest.raises(SystemExit) as exit_:
        cli_module.main()
    assert exit_.value.code == 3 and "ssh is not installed here" in capsys.readouterr().err  # status: UNKNOWN


def test_an_inventory_host_that_cannot_be_found_is_unknown_to_status(monkeypatch, tmp_path, capsys):
    """-i/-l: ansible-inventory is the one beside opsctl's Python (no activated venv needed); a
    host it does not know, or no ansible-inventory at all, is UNKNOWN (3) to a check."""
    import sys

    from opsctl import cli as cli_module

    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    dflash-train:\n      ansible_connection: community.docker.docker\n")
    monkeypatch.setenv("PATH", "")  # found beside sys.executable, not on PATH
    monkeypatch.setattr("sys.argv", ["opsctl", "-i", str(inventory), "-l", "nosuch", "status"])
    with pytest.raises(SystemExit) as exit_:
        cli_module.main()
    assert exit_.value.code == 3 and "host nosuch not found in" in capsys.readouterr().err
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))  # no ansible-inventory beside it either
    with pytest.raises(SystemExit) as exit_:
        cli_module.main()
    assert exit_.value.code == 3 and "ansible-inventory is not installed here" in capsys.readouterr().err


def test_a_node_that_was_not_reached_exits_3_whatever_the_command(monkeypatch, capsys):
    """docker exec into a stopped container exits 1 (WARNING to a check, "found" to oom, "rolled
    back" to restart), ssh's failures 255: every command now exits 3, not known."""
    from opsctl import remote

    calls = []
    monkeypatch.setattr(remote.subprocess, "run", lambda argv, **kw: subprocess.CompletedProcess(
        argv, 1, "", "Error: No such container: dflash-train"))
    monkeypatch.setattr(remote.subprocess, "call", lambda argv: calls.append(argv) or 255)
    with pytest.raises(click.ClickException) as error:
        remote.run_remote({"host": "docker://dflash-train"}, ["status"])
    assert error.value.exit_code == 3 and "not running" in error.value.message and calls == []
    with pytest.raises(click.ClickException) as error:
        remote.run_remote({"host": "docker://dflash-train"}, ["restart", "--fraction", "0.93"])
    assert error.value.exit_code == 3 and "nothing was run on the node" in error.value.message
    assert remote.run_remote({"host": "ssh://ops@gpu-7"}, ["status"]) == 3
    assert "UNKNOWN: the node's opsctl was not reached (ssh exited 255)" in capsys.readouterr().err
    assert remote.run_remote({"host": "ssh://ops@gpu-7"}, ["oom"]) == 3
    assert "not reached, or the connection dropped (ssh exited 255)" in capsys.readouterr().err
    # the node's own answers come back as they are
    monkeypatch.setattr(remote.subprocess, "call", lambda argv: 1)
    assert remote.run_remote({"host": "ssh://ops@gpu-7"}, ["oom"]) == 1


def test_a_docker_engine_that_cannot_be_asked_is_not_blamed_on_the_container(monkeypatch):
    from opsctl import remote

    monkeypatch.setattr(remote.subprocess, "run", lambda argv, **kw: subprocess.CompletedProcess(
        argv, 1, "", "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"))
    with pytest.raises(click.ClickException) as error:
        remote.run_remote({"host": "docker://dflash-train"}, ["oom"])
    assert error.value.exit_code == 3
    assert "cannot ask the local Docker engine about node container dflash-train" in error.value.message


@pytest.mark.parametrize("error", [click.ClickException("systemctl restart sglang.service failed: timeout"),
                                   subprocess.TimeoutExpired(["systemctl", "show"], 10), KeyboardInterrupt()])
def test_a_rollback_that_cannot_be_followed_is_recorded_and_exits_3(node, monkeypatch, error):
    """The attempt failed and the rollback's start then fails to be followed: before, a
    systemctl timeout escaped as a traceback (exit 1) and a systemctl error exited 2, with no
    rollback record."""
    seen = _fake_starts(monkeypatch, node, False, error)
    result = CliRunner().invoke(cli, ["restart", "--fraction", "0.91", "--force"])
    assert result.exit_code == 3, result.output
    assert "the rollback's start could not be followed" in result.output
    assert seen[1] == ORIGINAL_OVERRIDE and (node / "override.env").read_text() == ORIGINAL_OVERRIDE
    assert [(r["event"], r["outcome"]) for r in _history(node)] == [
        ("restart", "started"), ("restart", "failed"), ("rollback", "abandoned")]


def test_overrides_clear_is_refused_with_exit_2_while_another_change_holds_the_lock(node):
    with engine_lock(node / "state", "opsctl-guard: remediation"):
        result = CliRunner().invoke(cli, ["overrides", "clear", "--no-restart"])
    assert result.exit_code == 2 and "another engine change is in progress (opsctl-guard: remediation" in result.output
    assert (node / "override.env").read_text() == ORIGINAL_OVERRIDE


def test_a_reason_with_newlines_stays_in_its_comment(node):
    """--reason is free text in a comment line of an EnvironmentFile: a newline in it must not
    start a live line (before: it set PYTORCH_CUDA_ALLOC_CONF and the chunk to garbage)."""
    from opsctl.overrides import TunedValues, render_overrides, values_in
    from opsctl.render import parse_env_file
    reason = "ticket 42\nPYTORCH_CUDA_ALLOC_CONF=garbage\r\nSGLANG_CHUNKED_PREFILL_SIZE=abc"
    text = render_overrides(TunedValues(0.92), node / "sglang.env", "root\nX=1", reason)
    assert parse_env_file(text) == {"SGLANG_MEM_FRACTION_STATIC": "0.92"}
    assert values_in(parse_env_file(text)) == TunedValues(0.92)
    assert "ticket 42 PYTORCH_CUDA_ALLOC_CONF=garbage SGLANG_CHUNKED_PREFILL_SIZE=abc" in text


def test_a_stale_lock_info_file_names_no_holder(node):
    """The info file of a holder killed before it could remove it (SIGKILL, a reboot): its pid
    gone, or reused by another process, is no holder; the guard would otherwise stand by for ever."""
    import os

    from opsctl import locking
    state = node / "state"
    state.mkdir()
    info = state / locking.INFO_FILE
    me = os.getpid()
    with engine_lock(state, "opsctl restart"):
        assert locking.holder(state).startswith("opsctl restart (pid ")
        assert locking.holder(state, other_than=me) is None  # the guard does not stand by for itself
    info.write_text(json.dumps({"holder": "opsctl restart", "pid": me, "pid_start": "1", "since": "03:00:00"}))
    assert locking.holder(state) is None  # the pid now belongs to another process (this one)
    info.write_text(json.dumps({"holder": "opsctl restart", "pid": 2**22 + 1, "since": "03:00:00"}))
    assert locking.holder(state) is None  # no such process


def _start_and_wait(monkeypatch, looks, batches=()):
    """start_and_wait over a unit that shows `looks` ((active, sub, run) or (active, sub, run, job)
    each) in turn, while the journal hands over `batches` of (run, line) entries, one batch a pass.
    Returns the report and how many looks it took."""
    from opsctl import journal
    from opsctl import restart as restart_module
    from opsctl.config import load_config
    from opsctl.systemd import UnitState

    states = iter([UnitState("sglang.service", "loaded", look[0], look[1], "success", 0, 1, 0, "enabled", None,
                             look[2], look[3] if len(look) > 3 else "")
                   for look in looks])
    taken = []
    monkeypatch.setattr(restart_module, "unit_state", lambda name: taken.append(next(states)) or taken[-1])
    monkeypatch.setattr(restart_module, "_systemctl", lambda *args: None)
    monkeypatch.setattr(restart_module.journal, "cursor", lambda name: None)
    pending = [[journal.Entry(text, run) for run, text in batch] for batch in batches]

    class Follower:
        def __init__(self, *args):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def new_entries(self):
            return pending.pop(0) if pending else []
    monkeypatch.setattr(restart_module.journal, "JournalFollower", Follower)
    monkeypatch.setattr(restart_module.time, "sleep", lambda s: None)
    return restart_module.start_and_wait(load_config(), 60.0, lambda phase, elapsed: None), len(taken)


def test_the_old_run_still_active_is_not_taken_for_a_healthy_start(node, monkeypatch):
    """`systemctl restart --no-block` only queues the job: a first look may still see the old
    run, active. Only an active new run (a new InvocationID) counts as healthy."""
    report, looks = _start_and_wait(monkeypatch, [
        ("active", "running", "old"),  # read before the restart
        ("active", "running", "old"), ("deactivating", "stop-sigterm", "old"),
        ("activating", "start-post", "new"), ("active", "running", "new")])
    assert report.ok and looks == 5  # not at the second look, the old run's


def test_the_old_run_failing_its_stop_is_not_taken_for_a_failed_start(monkeypatch):
    """A restart whose stop step fails (`docker stop` of a container already gone) shows the old
    run "failed" while systemd still holds the job that starts the new run (seen on systemd 252)."""
    report, looks = _start_and_wait(monkeypatch, [
        ("activating", "start", "old"),  # read before the restart
        ("deactivating", "stop", "old", "1212"), ("failed", "failed", "old", "1212"),
        ("activating", "start", "new", "1212"), ("active", "running", "new")])
    assert report.ok and looks == 5, report.reason


@pytest.mark.parametrize("active, sub", [("failed", "failed"), ("inactive", "dead")])
def test_a_job_that_ends_without_a_new_run_fails_the_start_at_once(monkeypatch, active, sub):
    """systemd refused the start (its start limit, a dependency that failed): the old run, no job
    left. Without this the restart waited out its whole budget (15 minutes in production)."""
    report, looks = _start_and_wait(monkeypatch, [
        (active, sub, "old"), (active, sub, "old"), ("active", "running", "old")])
    assert not report.ok and looks == 2
    assert report.reason.startswith("systemd did not start the engine (result: success)")


def test_a_new_run_that_died_fails_the_start_before_systemd_retries_it(monkeypatch):
    """Back in auto-restart with its start job over, the new run died: no waiting for RestartSec."""
    report, looks = _start_and_wait(monkeypatch, [
        ("active", "running", "old"), ("activating", "start-post", "new", "1300"),
        ("activating", "auto-restart", "new"), ("active", "running", "newer")])
    assert not report.ok and "exited" in report.reason and looks == 3


def test_a_crash_journald_hands_over_after_the_death_still_names_the_crash(monkeypatch):
    """systemd can report the run dead before journald delivers its last lines (seen in CI: the
    lab's OOM start read as "exited (status 137)"): the crash in those lines is the reason."""
    crash = [("new", "[2026-12-01 06:53:01 TP0] Scheduler hit an exception: Traceback (most recent call last):"),
             ("new", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 896.00 MiB."),
             ("new", "Received sigquit from a child process. It usually means the child failed.")]
    report, looks = _start_and_wait(monkeypatch, [
        ("active", "running", "old"), ("activating", "start", "new", "1300"),
        ("activating", "auto-restart", "new")],
        [[], [("new", "Load weight begin. avail mem=94.2 GB")], [], crash])
    assert not report.ok and looks == 3
    assert report.reason == "the engine crashed while loading weights", report.reason
    assert any("CUDA out of memory" in line for line in report.journal)


def test_a_run_in_auto_restart_is_waited_on_while_the_restart_job_is_queued(monkeypatch):
    """A run in auto-restart has died only once no job is queued: here (a systemd with no
    InvocationIDs, so every look is a "new" run) the queued restart job still starts the engine."""
    report, looks = _start_and_wait(monkeypatch, [
        ("activating", "auto-restart", ""), ("activating", "auto-restart", "", "1400"),
        ("activating", "start", "new", "1400"), ("active", "running", "new")])
    assert report.ok and looks == 4, report.reason


def _start_with_journal(monkeypatch, batches):
    """A restart whose run "old" is replaced by run "new", which turns active."""
    return _start_and_wait(monkeypatch, [
        ("active", "running", "old"), ("deactivating", "stop-sigterm", "old"), ("activating", "start", "new"),
        ("activating", "start-post", "new"), ("active", "running", "new")], batches)[0]


OLD_RUN_CRASH = [("old", "[2026-12-01 06:52:13 TP3] Scheduler hit an exception: Traceback (most recent call last):"),
                 ("old", "torch.distributed.DistBackendError: Watchdog caught collective operation timeout"),
                 ("old", "[2026-12-01 06:52:14] Received sigquit from a child process. It usually means the child failed."),
                 ("old", "sglang.service: Main process exited, code=killed, status=9/KILL")]


def test_a_fatal_line_of_the_old_run_does_not_fail_the_new_start(monkeypatch):
    """A hung engine that is being stopped can log its own crash (an NCCL watchdog's exception,
    the launcher's SIGQUIT line); that says nothing about the new files."""
    report = _start_with_journal(monkeypatch, [OLD_RUN_CRASH, [("new", "Load weight begin. avail mem=94.2 GB")],
                                               [("new", "The server is fired up and ready to roll!")]])
    assert report.ok, report.reason
    assert not any("Scheduler hit an exception" in line for line in report.journal)
    assert any("fired up" in line for line in report.journal)


def test_a_fatal_line_of_the_new_run_fails_the_start(monkeypatch):
    crash = [("new", "[2026-12-01 06:53:01 TP0] Scheduler hit an exception: Traceback (most recent call last):"),
             ("new", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 896.00 MiB."),
             ("new", "Received sigquit from a child process. It usually means the child failed.")]
    report = _start_with_journal(monkeypatch, [OLD_RUN_CRASH, crash])
    assert not report.ok and "crashed" in report.reason
    assert any("CUDA out of memory" in line for line in report.journal)
    assert not any("Watchdog caught" in line for line in report.journal)


def test_a_rollback_whose_file_cannot_be_written_says_the_file_still_holds_the_failed_values(node, monkeypatch):
    """A full disk as the rollback writes the previous file: the message said the previous
    override file was in place, and the next start by systemd ran the failed values."""
    seen = _fake_starts(monkeypatch, node, False, True)
    _full_disk_on_restore(monkeypatch)
    result = CliRunner().invoke(cli, ["restart", "--fraction", "0.91", "--force"])
    assert result.exit_code == 3 and len(seen) == 1
    assert "could not be put back and still holds the failed values" in " ".join(result.output.split())
    assert "the previous override file is in place" not in result.output
    assert _history(node)[-1]["override_restored"] is False


def _full_history_after(monkeypatch, outcomes):
    """append_record fails (a full disk) for the history records whose outcome is in `outcomes`."""
    from opsctl import restart as restart_module
    real_append = restart_module.append_record

    def append(path, record):
        if record["outcome"] in outcomes:
            raise OSError(28, "No space left on device", str(path))
        return real_append(path, record)
    monkeypatch.setattr(restart_module, "append_record", append)


def test_a_history_that_cannot_be_written_refuses_the_change_before_anything_changes(node, monkeypatch):
    """A change that cannot be recorded is not made: a refusal (exit 2), not an OSError
    traceback with exit 1, which reads as "rolled back"."""
    _full_history_after(monkeypatch, {"started"})
    starts = _fake_starts(monkeypatch, node, True)
    result = CliRunner().invoke(cli, ["restart", "--fraction", "0.91", "--force"])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert "No space left on device" in result.output and "nothing was changed" in result.output
    assert starts == [] and (node / "override.env").read_text() == ORIGINAL_OVERRIDE


def test_a_healthy_restart_whose_record_fails_still_exits_0_and_says_so(node, monkeypatch):
    _full_history_after(monkeypatch, {"ok"})
    _fake_starts(monkeypatch, node, True)
    result = CliRunner().invoke(cli, ["restart", "--fraction", "0.91", "--force"])
    assert result.exit_code == 0, result.output
    assert "could not record the restart (ok)" in " ".join(result.output.split())
    assert "SGLANG_MEM_FRACTION_STATIC=0.91" in (node / "override.env").read_text()


def test_a_failed_record_does_not_cancel_the_rollback(node, monkeypatch):
    """The failed start's record could not be written: the rollback's start used to be skipped
    (exit 3, the engine left on the failed values until its next start)."""
    _full_history_after(monkeypatch, {"failed"})
    seen = _fake_starts(monkeypatch, node, False, True)
    result = CliRunner().invoke(cli, ["restart", "--fraction", "0.91", "--force"])
    assert result.exit_code == 1, result.output  # rolled back
    assert len(seen) == 2 and seen[1] == ORIGINAL_OVERRIDE
    assert [(r["event"], r["outcome"]) for r in _history(node)] == [("restart", "started"), ("rollback", "ok")]


def _full_disk_on_restore(monkeypatch):
    """The override file can be written, but not put back as it was (the disk fills meanwhile)."""
    from opsctl import restart as restart_module
    real_write = restart_module.write_override_text

    def full_disk_on_restore(path, text):
        if text == ORIGINAL_OVERRIDE:
            raise OSError(28, "No space left on device", str(path))
        real_write(path, text)
    monkeypatch.setattr(restart_module, "write_override_text", full_disk_on_restore)


def test_an_abandoned_restart_whose_file_cannot_be_restored_says_so(node, monkeypatch):
    _fake_starts(monkeypatch, node, KeyboardInterrupt())
    _full_disk_on_restore(monkeypatch)
    result = CliRunner().invoke(cli, ["restart", "--fraction", "0.91", "--force"])
    output = " ".join(result.output.split())
    assert result.exit_code == 3 and "could not be put back (No space left on device)" in output, output
    assert "the previous override file is restored" not in output
    assert _history(node)[-1]["override_restored"] is False


@pytest.mark.parametrize("errno, strerror", [(28, "No space left on device"), (30, "Read-only file system")])
def test_a_state_folder_that_cannot_be_written_refuses_with_what_to_do(node, monkeypatch, errno, strerror):
    """The lock file cannot be made (disk errors remount a filesystem read-only): exit 2 with what
    to do, for a restart and for `overrides clear`, not a traceback with exit 1."""
    from opsctl import locking

    class BrokenLock:
        def __init__(self, path):
            self.path = path

        def acquire(self, timeout):
            raise OSError(errno, strerror, self.path)
    monkeypatch.setattr(locking, "FileLock", BrokenLock)
    for args in (["restart", "--fraction", "0.92", "--force"], ["overrides", "clear", "--no-restart"]):
        result = CliRunner().invoke(cli, args)
        output = " ".join(result.output.split())
        assert result.exit_code == 2 and isinstance(result.exception, SystemExit), output
        assert strerror in output and "full or read-only" in output and "Nothing was changed" in output
    assert (node / "override.env").read_text() == ORIGINAL_OVERRIDE


def test_an_override_file_that_is_not_utf8_is_refused_with_what_to_do(node):
    """A hand edit in Latin-1 (a comment will do): restart and `overrides clear` exited 1 with a
    UnicodeDecodeError traceback. The file is left as it is."""
    latin1 = b"# r\xe9duit\nSGLANG_MEM_FRACTION_STATIC=0.92\n"
    (node / "override.env").write_bytes(latin1)
    for args in (["restart", "--fraction", "0.91", "--force"], ["overrides", "clear"]):
        result = CliRunner().invoke(cli, args)
        output = " ".join(result.output.split())
        assert result.exit_code == 2 and isinstance(result.exception, SystemExit), output
        assert "it must be UTF-8" in output and "opsctl overrides clear --no-restart" in output
    assert (node / "override.env").read_bytes() == latin1


def test_a_folder_that_cannot_be_synced_after_the_rename_is_not_reported_as_no_change(tmp_path, monkeypatch, caplog):
    """Past the rename the new file is in force: a failed fsync of its folder must not raise, or
    a restart would say "nothing was changed" while the next start reads the new file."""
    from opsctl import state

    real_fsync = os.fsync

    def fsync(fd):
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            raise OSError(5, "Input/output error")
        real_fsync(fd)
    monkeypatch.setattr(state.os, "fsync", fsync)
    target = tmp_path / "override.env"
    state.atomic_write(target, "SGLANG_MEM_FRACTION_STATIC=0.9\n")
    assert target.read_text() == "SGLANG_MEM_FRACTION_STATIC=0.9\n"
    assert "could not be synced (Input/output error)" in caplog.text


def test_overrides_clear_without_restart_on_a_full_disk_is_refused(node, monkeypatch):
    from opsctl import overrides

    def full_disk(path, text, mode=0o644):
        raise OSError(28, "No space left on device", str(path))
    monkeypatch.setattr(overrides, "atomic_write", full_disk)
    result = CliRunner().invoke(cli, ["overrides", "clear", "--no-restart"])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert "No space left on device" in result.output and "nothing was changed" in result.output
    assert (node / "override.env").read_text() == ORIGINAL_OVERRIDE
