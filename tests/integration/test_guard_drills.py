"""Fault drills of the guard on its own lab node (`dflash-guard`), deployed as the seed was:
0.94, chunk 8192, no expandable_segments, the guard on. Each drill starts from `reset`."""

import json
import os
import shlex
import subprocess
import time

import pytest
from guardlab import (
    HISTORY,
    SEED_CONFIG,
    SEED_VARS,
    node_for_guard,
    provision,
    records,
    reset,
    seed_crash,
    unit_active,
    wait_record,
)
from labnode import docker_available, lab_images_built

pytestmark = pytest.mark.lab

EXPANDABLE = {**SEED_CONFIG, "expandable_segments": True}
GUARD_STOPPED = "5f0c8d1b3e2a4c6f9a7b8e1d2c3f4a50"


@pytest.fixture(scope="module")
def guard_node(tmp_path_factory):
    if not docker_available() or not lab_images_built():
        pytest.skip("needs a running Docker engine and the lab images: run lab/build-images.sh")
    node = node_for_guard(tmp_path_factory.mktemp("guard-lab"))
    result = provision(node)
    assert result.returncode == 0, result.stdout[-4000:]
    assert node.sh("systemctl is-active opsctl-guard.service").stdout.strip() == "active"
    yield node
    node.set_faults()
    if not os.environ.get("KEEP_LAB"):
        node.destroy()


# True while sglang.service is starting a main process forked after the override file took `line`.
RESTART_IN_FLIGHT = """
import os, subprocess, sys, time
props = dict(line.split("=", 1) for line in subprocess.run(
    ["systemctl", "show", "sglang.service", "-p", "ActiveState", "-p", "SubState",
     "-p", "ExecMainStartTimestampMonotonic"], capture_output=True, text=True).stdout.split())
started = time.time() - (time.monotonic() - int(props["ExecMainStartTimestampMonotonic"]) / 1e6)
override = "/etc/sglang/override.env"
print(props["ActiveState"] == "activating" and props["SubState"] != "auto-restart"
      and sys.argv[1] in open(override).read() and started > os.stat(override).st_mtime)
"""


def restart_in_flight(node, line: str) -> bool:
    return node.sh(f"python3 -c {shlex.quote(RESTART_IN_FLIGHT)} {shlex.quote(line)}").stdout.strip() == "True"


def step_records(node, since, step_id):
    return [r for r in records(node)[since:] if r.get("step_id") == step_id]


def test_drill1_seed_oom_is_remediated_and_survives_185k(guard_node):
    node = guard_node
    since = reset(node)
    assert json.loads(node.opsctl("overrides", "--json").stdout)["effective"]["expandable_segments"]["value"] == "false"
    answers = seed_crash(node)
    assert all("error" not in a for a in answers[:4]) and "error" in answers[4]  # the 32k prompt killed it
    outcome = wait_record(node, since, lambda r: r["event"] == "outcome", timeout=60)
    assert outcome["outcome"] == "ok"
    story = [r for r in records(node)[since:] if r["event"] in ("incident", "decision", "action", "outcome")]
    assert [r["event"] for r in story] == ["incident", "decision", "action", "outcome"]
    incident, decision = story[0], story[1]
    assert incident["kind"] == "cuda_oom" and incident["cause"] in ("fragmentation", "activation_spike")
    assert "Tried to allocate 896.00 MiB" in incident["detail"]
    assert decision["rung"] == "expandable_segments"
    assert decision["from"] == SEED_CONFIG and decision["to"] == EXPANDABLE
    # The guard chose this config, it is in force, and the engine serves a 185k-token prompt on it.
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in node.file("/etc/sglang/override.env")
    assert unit_active(node)
    answer = node.generate(185_000, offset=50_000_000, timeout=120)
    assert answer.get("meta_info", {}).get("prompt_tokens") == 185_000, answer
    assert unit_active(node)
    status = json.loads(node.opsctl("guard", "status", "--json").stdout)
    assert status["state"] == "watching" and status["last_good"]["values"] == EXPANDABLE
    assert status["last_step"]["rung"] == "expandable_segments" and status["last_step"]["outcome"] == "ok"


def test_drill2_hang_is_restarted_as_is(guard_node):
    node = guard_node
    since = reset(node)
    before = node.file("/etc/sglang/override.env")
    started = time.time()
    node.set_faults(hang_health_generate=True)
    decision = wait_record(node, since, lambda r: r["event"] == "decision", timeout=40)
    node.set_faults()
    # Quiet: nothing before the hang timeout (4 s in the lab), however many probes failed.
    assert decision["epoch"] - started >= 4.0
    assert decision["cause"] == "hang" and decision["rung"] == "as_is" and decision["to"] == decision["from"]
    outcome = wait_record(node, since, lambda r: r["event"] == "outcome", timeout=60)
    assert outcome["outcome"] == "ok"
    assert node.file("/etc/sglang/override.env").splitlines()[3:] == before.splitlines()[3:]
    code, report = node.status()
    assert report["health_generate"]["ok"] and report["guard"]["state"] == "watching", report["problems"]


def test_drill3_unknown_crash_bounded_restarts_then_stop_and_alert(guard_node):
    node = guard_node
    since = reset(node)
    node.set_faults(crash_after_seconds=200, crash_kind="illegal_memory_access")  # 2 s after ready, in the lab
    try:
        stopped = wait_record(node, since, lambda r: r["event"] == "stopped", timeout=120)
    finally:
        node.set_faults()
    new = records(node)[since:]
    decisions = [r for r in new if r["event"] == "decision"]
    assert len(decisions) == 3 and all(d["rung"] == "as_is" and d["to"] == d["from"] for d in decisions)
    assert all(r["cause"] == "not_memory" and r["kind"] == "illegal_memory_access"
               for r in new if r["event"] == "incident")
    assert "restarted as-is 3 time(s)" in stopped["reason"]
    assert stopped["config"] == SEED_CONFIG  # no config change
    alert = node.sh(f"journalctl MESSAGE_ID={GUARD_STOPPED} -o cat --no-pager").stdout
    assert "OPSCTL-GUARD-STOPPED" in alert
    assert node.opsctl("guard", "status").returncode == 2
    assert json.loads(node.opsctl("status", "--json").stdout)["guard"]["state"] == "stopped"


def test_drill4_crash_loop_exhausts_the_budget(guard_node):
    node = guard_node
    since = reset(node)
    node.set_faults(crash_at_start=True)
    try:
        node.sh("docker kill sglang")
        stopped = wait_record(node, since, lambda r: r["event"] == "stopped", timeout=150)
    finally:
        node.set_faults()
    new = records(node)[since:]
    outcomes = [r["outcome"] for r in new if r["event"] == "outcome"]
    assert outcomes == ["down"] * 4  # the lab's budget: 4 an hour
    assert all(r["rung"] == "as_is" for r in new if r["event"] == "decision")
    assert "budget is spent" in stopped["reason"]
    assert stopped["last_good"]["values"] == SEED_CONFIG
    status = json.loads(node.opsctl("guard", "status", "--json").stdout)
    assert status["state"] == "stopped" and status["budget_left"] == 0
    assert status["last_good"]["values"] == SEED_CONFIG


def test_drill5_guard_killed_mid_remediation_finishes_the_step(guard_node):
    node = guard_node
    since = reset(node)
    node.set_faults(slow_start_seconds=400)  # 4 s more per start, in the lab: time to kill the guard
    seed_crash(node, base=10)
    action = wait_record(node, since, lambda r: r["event"] == "action", timeout=30)
    # Kill it once its restart is under way: the override written and the engine starting on it.
    # (Killed before that, the guard rightly acts again on resume: tests/unit/test_guard_state.py.)
    node.wait_for(lambda: restart_in_flight(node, "expandable_segments:True"), timeout=30, interval=0.1)
    node.sh("systemctl kill --signal=SIGKILL opsctl-guard.service", check=True)
    node.set_faults()
    step = action["step_id"]
    outcome = wait_record(node, since, lambda r: r["event"] == "outcome" and r["step_id"] == step, timeout=90)
    assert outcome["outcome"] == "ok"
    events = [r["event"] for r in step_records(node, since, step)]
    assert events == ["decision", "action", "resumed-step", "outcome"]  # one decision: not repeated
    assert len([r for r in records(node)[since:] if r["event"] == "guard-started"]) == 1
    assert unit_active(node) and "expandable_segments:True" in node.file("/etc/sglang/override.env")
    assert json.loads(node.opsctl("guard", "status", "--json").stdout)["state"] == "watching"


def test_drill6_operator_restart_during_a_remediation_does_not_interleave(guard_node):
    node = guard_node
    since = reset(node)
    history_since = len(records(node, HISTORY))
    node.set_faults(slow_start_seconds=400)
    seed_crash(node, base=20)
    wait_record(node, since, lambda r: r["event"] == "action", timeout=30)
    refused = node.opsctl("restart", "--reason", "operator drill, no wait")
    assert refused.returncode == 2 and "another engine change is in progress" in refused.stderr
    assert "opsctl-guard" in refused.stderr
    queued = subprocess.Popen(["docker", "exec", node.name, "opsctl", "restart", "--wait-lock", "120",
                               "--reason", "operator drill"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    node.set_faults()
    _, err = queued.communicate(timeout=180)
    assert queued.returncode == 0, err
    history = [(r["actor"], r["outcome"]) for r in records(node, HISTORY)[history_since:] if r["event"] == "restart"]
    assert history == [("opsctl-guard", "started"), ("opsctl-guard", "ok"), ("root", "started"), ("root", "ok")]
    new = records(node)[since:]
    assert [r["event"] for r in new].count("decision") == 1  # the operator's restart is not a death
    assert any(r["event"] == "standing-by" for r in new)
    assert unit_active(node)


def test_drill7_an_operators_stop_past_the_grace_is_not_a_death(guard_node):
    """`systemctl stop` while a long request runs: the engine waits for it on SIGTERM, `docker
    stop`'s grace (10 s in the lab) runs out, the container is killed (137) and the unit ends
    "failed" with no job pending, as a death does. The guard restarted such an engine."""
    node = guard_node
    since = reset(node)
    body = json.dumps({"text": "a long answer", "sampling_params": {"max_new_tokens": 2_000_000, "ignore_eos": True}})
    request = subprocess.Popen(["docker", "exec", node.name, "curl", "-s", "-m", "120", "-X", "POST",
                                "http://127.0.0.1:30000/generate", "-H", "Content-Type: application/json", "-d", body],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(2)  # the request decodes
        assert node.sh("systemctl stop sglang.service", timeout=60).returncode == 0
        props = node.sh("systemctl show sglang.service -p ActiveState -p ExecMainStatus").stdout
        assert "ActiveState=failed" in props and "ExecMainStatus=137" in props, props  # the drill's premise
        seen = wait_record(node, since, lambda r: r["event"] == "stopped-on-request", timeout=30)
        time.sleep(5)  # a guard that took it for a death would have decided by now
    finally:
        request.kill()
    assert seen["exit_status"] == 137
    assert not [r for r in records(node)[since:] if r["event"] in ("incident", "decision", "action")]
    assert node.sh("systemctl is-active sglang.service").stdout.strip() == "failed"
    assert node.opsctl("guard", "status").returncode == 0  # watching, nothing to do


def test_drill8_a_failed_start_with_the_guard_paused_is_stopped_not_left_to_crash_loop(guard_node):
    """site.yml left a start that failed to the unit's restart policy and the guard whenever the
    guard was enabled: paused (a rollout interrupted) or stopped, nobody took over, and the engine
    loaded its model again and again on values that cannot start."""
    node = guard_node
    reset(node)
    assert node.opsctl("guard", "pause", "--reason", "drill 8").returncode == 0
    try:
        failed = node.provision("-e", json.dumps({**SEED_VARS, "sglang_mem_fraction_static": 0.99,
                                                  "sglang_override_policy": "clear"}))
        assert failed.returncode != 0, failed.stdout[-3000:]
        assert "The unit was stopped (the guard is paused)." in failed.stdout, failed.stdout[-3000:]
        node.wait_for(lambda: node.sh("systemctl is-active sglang.service").stdout.strip() in ("inactive", "failed"),
                      timeout=30)
    finally:
        assert provision(node).returncode == 0  # the seed's values again
        node.opsctl("guard", "resume", "--reason", "drill 8 done")
