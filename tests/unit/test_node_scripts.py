"""The shell helpers the sglang role installs on a node, run here as the unit would run them."""

import importlib.machinery
import importlib.util
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

WAIT_HEALTHY = Path(__file__).resolve().parents[2] / "ansible" / "roles" / "sglang" / "files" / "sglang-wait-healthy"
CLOSED_PORT_URL = "http://127.0.0.1:9/health"  # discard port: nothing answers


def exited_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def wait_healthy(budget_s: int, mainpid: int | None, timeout: float):
    env = {**os.environ}
    env.pop("MAINPID", None)
    if mainpid is not None:
        env["MAINPID"] = str(mainpid)
    return subprocess.run(["sh", str(WAIT_HEALTHY), CLOSED_PORT_URL, str(budget_s)], env=env,
                          capture_output=True, text=True, timeout=timeout)


VERIFY_UNIT = WAIT_HEALTHY.parents[3] / "files" / "systemd-verify-unit"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
@pytest.mark.parametrize("line, ok", [("RestartSec=5", True), ("RestartSec=-1", False), ("RestartSecc=5", False),
                                      ("TimeoutStartSec=15min30x", False)],
                         ids=["good", "negative", "typo", "bad-duration"])
def test_the_unit_check_refuses_settings_systemd_would_ignore(tmp_path, line, ok):
    """systemd-analyze verify exits 0 on a setting it cannot parse ("..., ignoring"): the unit
    would run without it. The check the roles' `validate` runs fails it, naming the line."""
    unit = tmp_path / "rendered"
    unit.write_text(f"[Unit]\nDescription=x\n\n[Service]\nExecStart=/bin/true\n{line}\n")
    result = subprocess.run(["sh", str(VERIFY_UNIT), str(unit), "probe.service"], capture_output=True, text=True,
                            timeout=60)
    assert (result.returncode == 0) == ok, result.stderr
    if not ok:
        assert re.search(r"probe\.service:6: ", result.stderr), result.stderr


def test_gives_up_at_once_when_the_main_process_is_gone():
    gone = exited_pid()
    result = wait_healthy(600, gone, timeout=30)  # a 600 s budget: the timeout fails a wait
    assert result.returncode == 1
    assert re.search(rf"the engine's main process \({gone}\) exited after [01] s, before it was healthy; giving up",
                     result.stderr), result.stderr


def test_waits_out_the_budget_while_the_main_process_lives():
    started = time.monotonic()
    result = wait_healthy(2, os.getpid(), timeout=30)
    assert result.returncode == 1
    assert time.monotonic() - started >= 2.0  # it gave up only once the budget was spent
    # The script counts whole seconds (date +%s), so it gives up once more than the budget's whole
    # seconds have passed: it reports 3 s or more (a busy machine's tries take longer), never 2.
    reported = re.search(r"not healthy after (\d+) s \(last answer: 000\); giving up", result.stderr)
    assert reported and int(reported.group(1)) > 2, result.stderr


def test_without_mainpid_only_the_budget_applies():
    result = wait_healthy(1, None, timeout=30)
    assert result.returncode == 1 and "not healthy after" in result.stderr


PORT_FREE = WAIT_HEALTHY.parent / "sglang-port-free"


@pytest.mark.skipif(shutil.which("ss") is None, reason="no ss (iproute2) here")
def test_the_engine_does_not_start_while_another_server_holds_its_port():
    """The health gate takes any 200 on the port for the engine's: a server started by hand would
    make every run "healthy" while the engine dies on the GPUs it holds."""
    import socket

    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        held = subprocess.run(["sh", str(PORT_FREE), str(port)], capture_output=True, text=True, timeout=30)
    assert held.returncode == 1
    assert f"port {port} is already in use, so the engine is not started" in held.stderr
    assert "python" in held.stderr  # the listener is named (ss -p)
    free = subprocess.run(["sh", str(PORT_FREE), str(port)], capture_output=True, text=True, timeout=30)
    assert free.returncode == 0 and free.stderr == ""


ENGINE_NODE = Path(__file__).resolve().parents[2] / "ansible" / "files" / "sglang-engine-node"


def engine_node():
    """The node helper of site.yml and rollouts (a file without a .py suffix) as a module."""
    loader = importlib.machinery.SourceFileLoader("engine_node", str(ENGINE_NODE))
    node = importlib.util.module_from_spec(importlib.util.spec_from_loader("engine_node", loader))
    loader.exec_module(node)
    return node


def test_the_rollout_start_reads_only_the_new_runs_journal(monkeypatch):
    """The old run's crash as it is stopped (a hung engine's watchdog exception) must not fail the
    new start; the new run's lines and systemd's lines about it are read."""
    node = engine_node()
    records = [{"_SYSTEMD_INVOCATION_ID": "old", "MESSAGE": "[TP0] Scheduler hit an exception: Traceback"},
               {"INVOCATION_ID": "old", "MESSAGE": "sglang.service: Main process exited, code=killed"},
               {"INVOCATION_ID": "new", "MESSAGE": "Started sglang.service"},
               {"_SYSTEMD_INVOCATION_ID": "new", "MESSAGE": list(b"Load weight begin \xff")},
               {"_SYSTEMD_INVOCATION_ID": "new", "MESSAGE": ["set", list(b"twice")]}]
    asked = []

    def run(*argv):
        asked.append(argv)
        return "\n".join(json.dumps(record) for record in records) + "\n{cut off"
    monkeypatch.setattr(node, "run", run)
    assert node.new_run_lines("sglang.service", "c1", "old") == [
        "Started sglang.service", "Load weight begin \ufffd", "set twice"]
    assert asked[-1][-2:] == ("--after-cursor", "c1") and "--all" in asked[-1]
    assert len(node.new_run_lines("sglang.service", "c1", "")) == 5  # a systemd without run IDs


def test_the_rollout_probes_send_the_engines_api_key(tmp_path, monkeypatch):
    """An engine started with an API key answers 401 without it: the rollout's verify then took a
    healthy engine for a down one, and rolled it back (and failed that too)."""
    import http.server
    import threading

    class Engine(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.headers.get("Authorization") == "Bearer sekrit" else 401)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    node = engine_node()
    url = f"http://127.0.0.1:{server.server_address[1]}/server_info"
    try:
        monkeypatch.setenv("SGLANG_API_KEY_FILE", "")
        assert node.http(url)[0] == 401  # a node without a key file
        key_file = tmp_path / "api-key.yaml"
        key_file.write_text("api-key: sekrit\n")
        monkeypatch.setenv("SGLANG_API_KEY_FILE", str(key_file))
        assert node.http(url)[0] == 200
    finally:
        server.shutdown()
        server.server_close()


def test_the_copies_of_an_unfinished_run_are_kept_and_named(tmp_path):
    """A run stopped between its copies and its record (Ctrl-C during the drain) leaves the new
    files under an engine that runs the old ones: the next run must not copy the new files over
    the old ones and must say which run left them. A retry of one run's own probe goes on."""
    node = engine_node()
    backup, env = tmp_path / "backup", tmp_path / "sglang.env"
    env.write_text("SGLANG_MEM_FRACTION_STATIC=0.93\n")
    assert node.in_flight(str(backup), "run 1") == ""
    node.files([str(env)], str(backup))
    assert node.in_flight(str(backup), "run 1") == ""  # the probe's own retry
    env.write_text("SGLANG_MEM_FRACTION_STATIC=0.92\n")  # what the stopped run rendered
    assert node.in_flight(str(backup), "run 2") == "run 1"
    assert (backup / "sglang.env").read_text() == "SGLANG_MEM_FRACTION_STATIC=0.93\n"
    assert node.in_flight("-", "run 2") == ""  # --check takes no copies and sets no mark


def test_the_rollout_restarts_under_opsctls_engine_lock(tmp_path, monkeypatch):
    """The rollout's restart holds the lock `opsctl restart` and the guard take: while it runs,
    opsctl names it and refuses its own change; once it is done, the lock is free again."""
    import click
    import pytest

    from opsctl import locking
    node = engine_node()
    seen = {}

    def restart_and_follow(unit, budget_s, stop_on_failure):
        seen["holder"] = locking.holder(tmp_path)
        with pytest.raises(click.ClickException, match="rollout r1"), locking.engine_lock(tmp_path, "opsctl restart"):
            pass
        return {"ok": True, "seconds": 1.0, "why": "healthy"}, 0
    monkeypatch.setattr(node, "restart_and_follow", restart_and_follow)
    assert node.start("sglang.service", 60, str(tmp_path), 0, "rollout r1") == (
        {"ok": True, "seconds": 1.0, "why": "healthy", "restarted": True}, 0)
    assert seen["holder"].startswith(f"rollout r1 (pid {os.getpid()}, since ")
    assert locking.holder(tmp_path) is None
    with locking.engine_lock(tmp_path, "opsctl restart"):  # free again
        pass


def test_the_rollout_waits_for_a_change_in_flight_then_gives_up(tmp_path, monkeypatch):
    """A guard remediation (or an operator's restart) holds the lock: the rollout waits for it, and
    restarts nothing when it does not end in time, naming it."""
    from opsctl import locking
    node = engine_node()
    restarted = []
    monkeypatch.setattr(node, "restart_and_follow", lambda unit, budget_s, **_: restarted.append(unit))
    with locking.engine_lock(tmp_path, "guard: oom remediation"):
        started = time.monotonic()
        result, status = node.start("sglang.service", 60, str(tmp_path), 1.5, "rollout r1")
    assert time.monotonic() - started >= 1.5
    assert status == 1 and not restarted and not result["ok"] and result["restarted"] is False
    assert "another engine change is in progress (guard: oom remediation (pid" in result["why"]
    assert "nothing was restarted" in result["why"]


@pytest.mark.parametrize("on_failure", ["stop", "leave"])
def test_a_start_that_dies_fails_at_once_and_stops_the_unit_only_when_told(tmp_path, monkeypatch, on_failure):
    """The engine logs a CUDA OOM while it loads: the start fails at that line, not at the end of
    the budget, and names the error rather than the scheduler's first line about it. "stop" (a
    rollout, or site.yml without the guard) ends the crash loop; "leave" (site.yml with the guard)
    keeps the engine lock until the dying run has exited, then leaves the unit as it is."""
    node = engine_node()
    # the unit as systemd shows it at each look: the old run, then the new one, which exits
    # (systemd waits to restart it) a few looks after its OOM
    states = [("old", "active", "running", 0)] + [("new", "activating", "start", 0)] * 5 + [
        ("new", "activating", "auto-restart", 1)]
    looks = []

    def unit_show(unit):
        run_id, active, sub, restarts = states[min(len(looks), len(states) - 1)]
        looks.append(sub)
        return {"InvocationID": run_id, "ActiveState": active, "SubState": sub, "NRestarts": str(restarts)}
    monkeypatch.setattr(node, "unit_show", unit_show)
    monkeypatch.setattr(node, "run", lambda *argv: "cursor: c1" if "--show-cursor" in argv else "")
    # the scheduler's exception first, the traceback's last line (the error) a moment later
    died = ["Load weight begin", "[TP0] Scheduler hit an exception: Traceback (most recent call last):"]
    lines = [[], ["Load weight begin"], died, died + ["torch.OutOfMemoryError: CUDA out of memory."]]
    reads = []

    def new_run_lines(unit, cursor, old_run):
        reads.append(cursor)
        return lines[min(len(reads), len(lines)) - 1]
    monkeypatch.setattr(node, "new_run_lines", new_run_lines)
    systemctl = []
    monkeypatch.setattr(node.subprocess, "run", lambda argv, **kwargs: systemctl.append(argv[1:]))
    monkeypatch.setattr(node.time, "sleep", lambda seconds: None)
    result, status = node.start("sglang.service", 900, str(tmp_path), 0, "ansible-playbook", on_failure)
    assert status == 1 and result["ok"] is False and result["restarted"] is True
    assert result["why"] == "torch.OutOfMemoryError: CUDA out of memory."
    assert len(reads) == 4  # three looks, the third sees the exception; then one more read for the error
    assert systemctl[0] == ["restart", "--no-block", "sglang.service"]
    stops = [argv for argv in systemctl if argv[0] == "stop"]
    assert result["stopped"] is (on_failure == "stop") and len(stops) == (on_failure == "stop")
    if on_failure == "leave":  # it looked until systemd counted the exit
        assert result["exited"] is True and looks[-1] == "auto-restart"
    else:
        assert result["exited"] is None and "auto-restart" not in looks


def test_the_api_key_in_sglangs_logged_server_args_never_reaches_the_controller():
    """The start helper hands the new run's last journal lines to Ansible (its output, a
    rollout's ansible.log and host records, off the node): SGLang logs the key in server_args."""
    helper = engine_node()
    line = ("[2026-12-05 09:00:01] server_args=ServerArgs(model_path='/models/Kimi-K2.6', api_key='sk-live-123', "
            "admin_api_key=\"adm'in\", port=30000)")
    assert helper.redacted(line) == ("[2026-12-05 09:00:01] server_args=ServerArgs(model_path='/models/Kimi-K2.6', "
                                     "api_key='***', admin_api_key=\"***\", port=30000)")
    assert helper.redacted("launch: python -m sglang.launch_server --api-key sk-live-123 --port 30000") == (
        "launch: python -m sglang.launch_server --api-key *** --port 30000")
    assert helper.redacted('{"api_key": "sk-live-123"}') == '{"api_key": "***"}'
    assert helper.redacted("api_key=None, port=30000") == "api_key=None, port=30000"


def test_the_drain_waits_for_waiting_requests_and_a_prefill_sglangs_gauges_do_not_count(monkeypatch):
    """A lone 185k prefill reads 0 running and 0 waiting in SGLang 0.5.23 (the request being
    chunked is in neither): the drain returned at once and the restart killed minutes of prefill.
    Waiting requests were not counted either."""
    node = engine_node()
    polls = [  # (/metrics, the journal's last 20 s)
        ("sglang:num_running_reqs{tp_rank=\"0\"} 0.0\nsglang:num_queue_reqs{tp_rank=\"0\"} 0.0\n",
         "[TP0] Prefill batch, #new-seq: 1, #new-token: 4096, #cached-token: 90112, token usage: 0.48, "
         "#running-req: 0, #queue-req: 0"),
        ("sglang:num_running_reqs{tp_rank=\"0\"} 1.0\nsglang:num_queue_reqs{tp_rank=\"0\"} 0.0\n", ""),
        ("sglang:num_running_reqs{tp_rank=\"0\"} 0.0\nsglang:num_queue_reqs{tp_rank=\"0\"} 2.0\n", ""),
        ("sglang:num_running_reqs{tp_rank=\"0\"} 0.0\nsglang:num_queue_reqs{tp_rank=\"0\"} 0.0\n",
         "[TP0] Prefill batch, #new-seq: 1, #new-token: 1, #cached-token: 0, token usage: 0.48, "
         "#running-req: 0, #queue-req: 0"),  # a health probe's own prefill: no work
    ]
    step = {"metrics": 0, "journal": 0}
    journal_calls = []

    def http(url, body=None, timeout=10.0):
        text = polls[min(step["metrics"], len(polls) - 1)][0]
        step["metrics"] += 1
        return 200, text

    def run(*argv):
        journal_calls.append(argv)
        text = polls[min(step["journal"], len(polls) - 1)][1]
        step["journal"] += 1
        return text
    monkeypatch.setattr(node, "http", http)
    monkeypatch.setattr(node, "run", run)
    result = node.drain("http://engine", "sglang.service", 60, 0.01)
    assert (result["running_at_start"], result["prefill_at_start"]) == (0, True)
    assert (result["running_at_end"], result["prefill_at_end"], result["timed_out"]) == (0, False, False)
    assert step["metrics"] == 4  # the prefill, the decode, the waiting requests, then idle
    assert journal_calls[0][:3] == ("journalctl", "-u", "sglang.service") and "-20s" in journal_calls[0]
