"""The guard's state file and audit log: a guard killed mid-remediation finishes the same step."""

import dataclasses
import time
from pathlib import Path

import pytest

from opsctl import oom
from opsctl.config import GuardConfig, NodeConfig
from opsctl.guard import policy
from opsctl.guard.daemon import ApplyResult, Guard, death_from
from opsctl.guard.state import STOPPED, GuardStore, held, summary, unalerted_damage
from opsctl.overrides import TunedValues
from opsctl.systemd import UnitState

SEED = TunedValues(0.94, 8192, False)


class FakeNode:
    def __init__(self, results):
        self.values = SEED
        self.results = list(results)
        self.applied = []
        self.rollback_texts = []
        self.serving = False
        self.override = "# Managed by opsctl\n"
        self.failed_steps = set()
        self.failed_journal = []

    def effective(self):
        return self.values

    def unit(self):
        return UnitState("sglang.service", "loaded", "activating", "auto-restart", "exit-code", 1, 0, 137, "enabled", None)

    def lock_holder(self):
        return None

    def override_text(self):
        return self.override

    def apply(self, values, reason, rollback_text=None):
        self.applied.append(values)
        self.rollback_texts.append(rollback_text)
        result = self.results.pop(0)
        if result.ok and not values.is_empty():
            self.values = values.merged_over(self.values)
        return result

    def lowest_fraction(self):
        return 0.926

    def wait_settled(self, budget_s):
        return self.serving

    def runs(self, values):
        return self.serving and self.values == values

    def failed_start(self, step_id, since):
        return {"journal": self.failed_journal} if step_id in self.failed_steps else None


@pytest.fixture
def setup(tmp_path):
    config = NodeConfig(state_dir=tmp_path, guard=GuardConfig(budget_per_hour=4, backoff_initial_s=0.0))
    store = GuardStore(tmp_path)
    alerts = []

    def alert(limits, reason, details, situation=""):
        alerts.append(reason)
        return {"id": "x", "delivery_errors": {}}

    def make(results):
        node = FakeNode(results)
        return node, Guard(config, node, store, alert=alert, sleep=lambda s: None)
    return config, store, make, alerts


def test_oom_step_is_recorded_in_order(setup):
    config, store, make, _ = setup
    node, guard = make([ApplyResult(True, "ok", "healthy", 3.0)])
    guard.on_death(policy.Death(oom.FRAGMENTATION, "cuda_oom"), {"first_fatal_line": "x"})
    events = [r["event"] for r in store.records()]
    assert events == ["incident", "decision", "action", "outcome"]
    decision = store.records()[1]
    assert decision["from"] == dataclasses.asdict(SEED)
    assert decision["to"] == {"mem_fraction_static": 0.94, "chunked_prefill_size": 8192, "expandable_segments": True}
    state = store.load()
    assert state["pending"] is None and state["last_good"]["values"] == decision["to"]
    assert summary(config)["budget_left"] == 3
    # only what the step changes goes into the override file: a later inventory change of the
    # fraction or the chunk is not masked by an override of the guard
    assert node.applied == [TunedValues(expandable_segments=True)]


def test_a_pause_that_comes_while_a_step_is_decided_wins(setup, monkeypatch):
    """Deciding can take a minute (the planner reads 200k journal lines): a pause that comes
    meanwhile, from an operator or a rollout about to restart the engine, drops the step; it is
    checked under the state file's lock, where the pause is written."""
    config, store, make, _ = setup
    node, guard = make([ApplyResult(True, "ok", "healthy", 3.0)])
    decide = policy.decide

    def slow_decide(*args, **kwargs):
        store.pause("rollout fraction-0.93")
        return decide(*args, **kwargs)
    monkeypatch.setattr(policy, "decide", slow_decide)
    guard.on_death(policy.Death(oom.FRAGMENTATION, "cuda_oom"), {})
    assert node.applied == []
    assert [r["event"] for r in store.records()] == ["incident", "paused", "deferred"]
    assert "rollout fraction-0.93" in store.records()[-1]["why"]
    state = store.load()
    assert state["pending"] is None and state["remediations"] == [] and state["next_id"] == 1


def _kill_mid_step(make, store):
    """Run a step whose restart never returns (the guard is killed inside it)."""
    node, guard = make([])

    def killed(values, reason, rollback_text=None):
        node.applied.append(values)
        raise KeyboardInterrupt  # stands for SIGKILL: nothing after this line runs
    node.apply = killed
    with pytest.raises(KeyboardInterrupt):
        guard.on_death(policy.Death(oom.FRAGMENTATION, "cuda_oom"), {})
    return store.load()["pending"]


def test_resume_after_kill_when_the_engine_came_up_does_not_restart_again(setup):
    _, store, make, _ = setup
    pending = _kill_mid_step(make, store)
    assert pending["phase"] == "acting"
    node, guard = make([])
    node.values, node.serving = TunedValues(0.94, 8192, True), True
    guard.resume_pending()
    assert node.applied == []  # not repeated
    step = [r["event"] for r in store.records() if r.get("step_id") == pending["id"]]
    assert step == ["decision", "action", "resumed-step", "outcome"]
    assert store.load()["pending"] is None and store.records()[-1]["recovered"] is True


def test_resume_after_kill_when_the_step_did_not_happen_finishes_the_same_step(setup):
    _, store, make, _ = setup
    _kill_mid_step(make, store)
    node, guard = make([ApplyResult(True, "ok", "healthy", 3.0)])
    guard.resume_pending()
    assert node.applied == [TunedValues(expandable_segments=True)]  # the same step, not the next rung
    decisions = [r for r in store.records() if r["event"] == "decision"]
    assert len(decisions) == 1 and store.load()["remediations"].__len__() == 1


def test_torn_audit_line_and_missing_decision_are_recovered(setup):
    _, store, make, _ = setup
    with store.update() as state:
        state["pending"] = {"id": 7, "phase": "decided", "action": "tune", "rung": "expandable_segments", "why": "w",
                            "death": {"cause": "fragmentation"}, "from": dataclasses.asdict(SEED),
                            "to": {"mem_fraction_static": 0.94, "chunked_prefill_size": 8192,
                                   "expandable_segments": True}, "decided_at": 1.0, "attempts": 0, "blind": False}
    with open(store.audit_file, "a") as handle:
        handle.write('{"event": "decis')  # killed mid-write
    node, guard = make([ApplyResult(True, "ok", "healthy", 3.0)])
    guard.resume_pending()
    events = [(r["event"], r.get("recovered")) for r in store.records()]
    assert events == [("decision", True), ("resumed-step", None), ("action", None), ("outcome", None)]


def test_crash_loop_spends_the_budget_then_stops(setup):
    _, store, make, alerts = setup
    down = ApplyResult(False, "down", "crashed", 1.0, policy.Death(oom.UNKNOWN, "killed"))
    node, guard = make([down] * 4)
    guard.on_death(policy.Death(oom.UNKNOWN, "killed"), {})
    assert len(node.applied) == 4 and all(v.is_empty() for v in node.applied)
    assert store.load()["status"] == "stopped" and "budget is spent" in alerts[0]


def test_death_prefers_a_memory_cause_over_the_kill():
    kill = oom.Incident("killed", oom.UNKNOWN)
    spike = oom.Incident("cuda_oom", oom.ACTIVATION_SPIKE, detail="Tried to allocate 896.00 MiB")
    assert death_from([spike, kill]).cause == oom.ACTIVATION_SPIKE
    assert death_from([]).cause == policy.NO_CAUSE


def test_pause_and_resume(setup):
    config, store, _, _ = setup
    assert store.pause("maintenance") and not store.pause("again")
    assert summary(config)["problem"] == "guard paused by " + store.load()["paused"]["by"] + ": maintenance"
    store.resume("done")
    assert store.load()["paused"] is None


@pytest.mark.parametrize("damage", [lambda text: text[:-20], lambda text: "", lambda text: "[1, 2]"],
                         ids=["torn", "empty", "not-an-object"])
def test_a_damaged_state_file_stops_the_guard_and_is_kept(setup, damage):
    """A broken state file no longer reads as a fresh one (no pause, no stop, the budget unspent):
    the guard is stopped until someone resumes it, the broken file is kept aside and the move
    audited, and the guard's first stop raises the alert."""
    config, store, make, alerts = setup
    store.pause("maintenance")
    with store.update() as state:
        state["remediations"] = [time.time()] * 4  # the hour's budget spent
    broken = damage(store.state_file.read_text())
    store.state_file.write_text(broken)
    state = store.load()
    assert state["status"] == STOPPED and held(state) and "is damaged" in state["stopped"]["reason"]
    assert "is damaged" in summary(config)["problem"]
    reason = unalerted_damage(state)
    assert reason is not None and "opsctl guard resume" in reason
    _, guard = make([])
    guard.stop(reason, None)  # what the watcher does on seeing it
    assert alerts == [reason] and unalerted_damage(store.load()) is None
    kept = list(store.state_dir.glob("guard-state.json.damaged-*"))
    assert len(kept) == 1 and kept[0].read_text() == broken
    assert [r["event"] for r in store.records()][-2:] == ["state-file-damaged", "stopped"]
    assert store.load()["status"] == STOPPED  # now on disk, readable
    store.resume("checked the engine")
    assert held(store.load()) is None


def _backoff_pending(store):
    """One remediation a moment ago: the next step waits for a backoff first."""
    with store.update() as state:
        state["remediations"] = [time.time() - 1.0]


@pytest.mark.parametrize("meanwhile, why", [
    (lambda store, node: store.pause("maintenance"), "paused by"),
    (lambda store, node: setattr(node, "values", TunedValues(0.9, 4096, True)), "the config changed during the backoff"),
])
def test_a_step_is_dropped_when_the_guard_is_paused_or_the_config_changes_during_its_backoff(tmp_path, meanwhile, why):
    """The step was decided before the backoff: a pause, or an operator's own restart or
    `overrides clear` meanwhile, wins over it (before: it ran anyway, overwriting their config)."""
    config = NodeConfig(state_dir=tmp_path, guard=GuardConfig(budget_per_hour=4, backoff_initial_s=30.0))
    store = GuardStore(tmp_path)
    _backoff_pending(store)
    node = FakeNode([ApplyResult(True, "ok", "healthy", 3.0)])
    guard = Guard(config, node, store, alert=lambda *a, **k: {"id": "x", "delivery_errors": {}},
                  sleep=lambda s: meanwhile(store, node))
    guard.on_death(policy.Death(oom.FRAGMENTATION, "cuda_oom"), {})
    assert node.applied == []
    events = [r["event"] for r in store.records()]
    assert events[-1] == "deferred" and "backoff" in events and "decision" not in events
    assert why in store.records()[-1]["why"]


def test_a_killed_step_is_not_finished_while_the_guard_is_paused(setup):
    _, store, make, _ = setup
    pending = _kill_mid_step(make, store)
    store.pause("hands off")
    node, guard = make([ApplyResult(True, "ok", "healthy", 3.0)])
    guard.resume_pending()
    assert node.applied == [] and store.load()["pending"] is None
    outcome = store.records()[-1]
    assert (outcome["event"], outcome["step_id"], outcome["outcome"]) == ("outcome", pending["id"], "deferred")
    assert store.load()["remediations"] == []  # a step not taken is not charged


def test_a_step_killed_after_writing_its_file_rolls_back_to_the_file_before_it(tmp_path, monkeypatch):
    """A guard killed (SIGKILL: TimeoutStopSec) after the step wrote the override file: the
    engine crash-loops on the step's values. The resumed step rolls back to the file before the
    step (recorded with it), not to the file as it is now, which holds the failed values."""
    from opsctl import restart as restart_module
    from opsctl.guard.daemon import SystemNode

    env_file, override = tmp_path / "sglang.env", tmp_path / "override.env"
    env_file.write_text("SGLANG_MEM_FRACTION_STATIC=0.94\nSGLANG_CHUNKED_PREFILL_SIZE=8192\n")
    before = "# Managed by opsctl\nSGLANG_MEM_FRACTION_STATIC=0.93\n"
    override.write_text(before)
    config = NodeConfig(env_file=env_file, override_env_file=override, state_dir=tmp_path / "state",
                        guard=GuardConfig(budget_per_hour=4, backoff_initial_s=0.0))
    store = GuardStore(config.state_dir)

    class Node(SystemNode):
        def unit(self):
            return UnitState("sglang.service", "loaded", "activating", "auto-restart", "exit-code", 1, 0, 1,
                             "enabled", None)

        def wait_settled(self, budget_s):
            return False  # crash-looping on the step's values

    node = Node(config)
    with store.update() as state:
        state["pending"] = {"id": 3, "phase": "acting", "action": "tune", "rung": "expandable_segments", "why": "w",
                            "death": {"cause": oom.FRAGMENTATION}, "from": {"mem_fraction_static": 0.93,
                            "chunked_prefill_size": 8192, "expandable_segments": False},
                            "to": {"mem_fraction_static": 0.93, "chunked_prefill_size": 8192,
                                   "expandable_segments": True},
                            "decided_at": time.time(), "attempts": 1, "blind": False, "override_before": before}
    # what the killed restart had written
    override.write_text("# Managed by opsctl\nSGLANG_MEM_FRACTION_STATIC=0.93\nSGLANG_CHUNKED_PREFILL_SIZE=8192\n"
                        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n")
    starts = []

    def start(config, budget_s, progress):
        starts.append(override.read_text())
        ok = len(starts) == 2  # the step's values crash again; the rollback serves
        return restart_module.StartReport(ok, "healthy" if ok else "the engine exited (status 1)", 1.0,
                                          "ready", [])
    monkeypatch.setattr(restart_module, "start_and_wait", start)
    Guard(config, node, store, alert=lambda *a, **k: {"id": "x", "delivery_errors": {}}).resume_pending()
    assert "expandable_segments:True" in starts[0] and starts[1] == before
    assert override.read_text() == before
    assert store.records()[-1]["outcome"] == "rolled_back"


def test_resume_pause_only_leaves_a_stop_and_the_budget(setup):
    """What a rollout that paused the guard lifts afterwards: its pause, not a stop the guard was
    in (which needs a person) nor the remediations already spent this hour."""
    _, store, _, _ = setup
    with store.update() as state:
        state["status"], state["stopped"] = "stopped", {"reason": "budget spent", "at": 1.0, "alert_id": "a"}
        state["remediations"] = [time.time()]
    store.pause("rollout r1")
    before = store.resume("rollout r1 done", pause_only=True)
    state = store.load()
    assert before["paused"]["reason"] == "rollout r1" and state["paused"] is None
    assert state["status"] == "stopped" and state["stopped"]["reason"] == "budget spent"
    assert len(state["remediations"]) == 1


def test_a_step_that_could_not_be_carried_out_is_tried_again_not_passed_over(setup):
    """systemctl failing (outcome `error`) says nothing of the step's config: the same rung is
    tried again within the budget (before: the config was marked failed and the ladder moved on)."""
    _, store, make, _ = setup
    node, guard = make([ApplyResult(False, "error", "systemctl restart sglang.service failed: timeout"),
                        ApplyResult(True, "ok", "healthy", 3.0)])
    guard.on_death(policy.Death(oom.FRAGMENTATION, "cuda_oom"), {})
    assert node.applied == [TunedValues(expandable_segments=True)] * 2
    assert store.load()["failed"] == [] and store.records()[-1]["outcome"] == "ok"


@pytest.mark.parametrize("args, code", [(["status"], 3), (["status", "--json"], 3), (["pause", "--reason", "x"], 1),
                                        (["resume"], 1), (["history"], 1)])
def test_guard_commands_of_a_user_who_may_not_read_its_files_say_so(tmp_path, monkeypatch, node_config, args, code):
    """The state folder is root's: `opsctl guard ...` as another user says to run it as root, with
    status's exit code for "not known" (3), not a traceback."""
    from click.testing import CliRunner

    from opsctl.cli import cli

    node_config()

    def not_root(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "state" / "guard-state.json"))
    for name in ("load", "update", "records"):
        monkeypatch.setattr(GuardStore, name, not_root)
    monkeypatch.setattr(Path, "exists", not_root)  # Python 3.11's exists() raises on EACCES
    result = CliRunner().invoke(cli, ["guard", *args])
    assert result.exit_code == code and "Traceback" not in result.output, result.output
    assert "guard-state.json: Permission denied" in result.output and "sudo opsctl guard" in result.output


def test_a_killed_step_is_dropped_when_an_operator_changed_the_config_while_the_guard_was_down(setup):
    """Killed mid-step; meanwhile an operator's `opsctl restart --fraction 0.90` came up. Before,
    the restarted guard re-applied its step over the operator's values, restarting a healthy
    engine."""
    _, store, make, _ = setup
    pending = _kill_mid_step(make, store)
    node, guard = make([ApplyResult(True, "ok", "healthy", 3.0)])
    node.values, node.serving = TunedValues(0.90, 8192, False), True
    guard.resume_pending()
    assert node.applied == [] and store.load()["pending"] is None
    outcome = store.records()[-1]
    assert (outcome["step_id"], outcome["outcome"]) == (pending["id"], "deferred")
    assert "the config changed while the guard was down" in outcome["why"]


def test_a_killed_step_is_not_finished_while_another_change_holds_the_lock(setup):
    _, store, make, _ = setup
    _kill_mid_step(make, store)
    node, guard = make([ApplyResult(True, "ok", "healthy", 3.0)])
    node.lock_holder = lambda: "root: restart (pid 4242)"
    guard.resume_pending()
    assert node.applied == [] and store.records()[-1]["outcome"] == "deferred"
    assert "root: restart (pid 4242)" in store.records()[-1]["why"]


@pytest.mark.parametrize("serving, rollback, outcome", [
    (True, None, "rolled_back"),                                          # the rollback had come up
    (False, ApplyResult(True, "ok", "healthy", 3.0), "rolled_back"),      # cut short: it runs now
    (False, ApplyResult(False, "rolled_back", "the engine exited", 3.0), "down"),
])
def test_a_step_killed_during_its_rollback_is_not_tried_a_second_time(setup, serving, rollback, outcome):
    """The step's start failed (an OOM) and its rollback had begun when the guard was killed:
    the resumed guard repeated the step that had just failed, with another outage. Now it is not
    tried again, a rollback the kill cut short is finished (an as-is restart on the file before
    the step), and the OOM passes the step's config over."""
    _, store, make, _ = setup
    pending = _kill_mid_step(make, store)
    node, guard = make([rollback] if rollback else [])
    node.failed_steps, node.serving = {pending["id"]}, serving  # the file before the step is back
    node.failed_journal = (Path(__file__).parents[1] / "fixtures" / "oom" / "oom_current.log").read_text().splitlines()
    node.values = TunedValues(**pending["from"])
    guard.resume_pending()
    assert node.applied == ([] if rollback is None else [TunedValues()])
    assert store.load()["pending"] is None and store.records()[-1]["outcome"] == outcome
    assert pending["to"] in store.load()["failed"]


@pytest.mark.parametrize("death, passed_over", [
    (None, False),                                                   # the start budget ran out
    (policy.Death(oom.NOT_MEMORY, "nccl"), False),                   # an NCCL error, a GPU fault
    (policy.Death(oom.FRAGMENTATION, "cuda_oom"), True),             # the config does not fit
])
def test_only_a_memory_death_passes_a_tried_config_over(setup, death, passed_over):
    """A step whose start missed its budget once was passed over for good: the cost-free rung
    was lost for the next fragmentation OOM weeks later."""
    _, store, make, _ = setup
    node, guard = make([ApplyResult(False, "rolled_back", "not healthy within the start budget", 900.0, death)])
    guard.on_death(policy.Death(oom.FRAGMENTATION, "cuda_oom"), {})
    tried = {"mem_fraction_static": 0.94, "chunked_prefill_size": 8192, "expandable_segments": True}
    assert (tried in store.load()["failed"]) is passed_over


def test_a_config_seen_serving_is_no_longer_passed_over(setup):
    _, store, make, _ = setup
    node, guard = make([])
    with store.update() as state:
        state["failed"] = [dataclasses.asdict(SEED)]
    guard.observe_serving()
    assert store.load()["failed"] == []


@pytest.mark.parametrize("unit, words", [
    (UnitState("sglang.service", "loaded", "failed", "failed", "exit-code", 5, 0, 1, "enabled", None),
     "The engine is DOWN (unit failed/failed)"),
    (UnitState("sglang.service", "loaded", "active", "running", "success", 0, 42, 0, "enabled", None),
     "The engine's unit is active/running"),
])
def test_the_stop_alert_says_whether_the_engine_is_down(tmp_path, unit, words):
    """The alert said "the engine is left on the last config that served" of an engine in a
    crash loop: whoever is paged read that it served."""
    from opsctl.guard import alert as alert_module

    config = NodeConfig(state_dir=tmp_path, guard=GuardConfig(budget_per_hour=4))
    store = GuardStore(tmp_path)
    node = FakeNode([])
    node.unit = lambda: unit
    sent = []

    def alert(limits, reason, details, situation=""):
        sent.append(alert_module.raise_alert(limits, reason, details, socket_path=str(tmp_path / "none"),
                                             situation=situation))
        return sent[-1]
    Guard(config, node, store, alert=alert).stop("crash loop", None)
    message = sent[0]["message"]
    assert words in message and "fraction 0.94, chunk 8192, expandable_segments False" in message
    assert "left on the last config that served" not in message


def test_a_step_the_guard_stopped_in_the_middle_of_is_dropped_by_resume_not_replayed(setup):
    """The guard failed in the middle of a step (`systemctl show` timed out): the loop stops it,
    leaving the step in the state file. `guard resume` starts afresh: before, the step stayed, and
    the guard's next start (days later, a reboot) replayed it on a healthy engine, uncharged."""
    _, store, make, _ = setup
    pending = _kill_mid_step(make, store)  # (stands for the exception the loop catches)
    _, guard = make([])
    guard.stop("the guard failed while judging the engine (TimeoutExpired: ...)", None)
    store.resume("rollout r1 done", pause_only=True)  # a rollout's lifts no stop, drops nothing
    assert store.load()["pending"] == pending
    store.resume("operator looked")
    state = store.load()
    assert state["pending"] is None and state["status"] == "watching"
    assert state["last_step"]["id"] == pending["id"] and state["last_step"]["outcome"] == "dropped"
    outcome = [r for r in store.records() if r["event"] == "outcome"][-1]
    assert (outcome["step_id"], outcome["outcome"]) == (pending["id"], "dropped")
    node, guard = make([ApplyResult(True, "ok", "healthy", 3.0)])
    node.serving = True
    guard.resume_pending()  # the guard's next start
    assert node.applied == []


def test_a_stop_decided_while_a_pause_came_is_dropped(setup):
    """The ladder is exhausted, but a rollout paused the guard while it decided (the planner reads
    the journal for up to a minute): the pause wins, as over a step. Before, the guard stopped and
    alerted, and the rollout's `resume --pause-only` left it stopped."""
    _, store, make, alerts = setup
    node, guard = make([])
    node.values = TunedValues(0.934, 2048, True)  # the ladder at its floor

    def lowest():
        store.pause("rollout fraction-0.93")
        return 0.934
    node.lowest_fraction = lowest
    guard.on_death(policy.Death(oom.ACTIVATION_SPIKE, "cuda_oom"), {})
    assert alerts == [] and store.load()["status"] == "watching"
    deferred = store.records()[-1]
    assert deferred["event"] == "deferred" and "exhausted" in deferred["dropped_stop"]
    store.resume("rollout done", pause_only=True)
    assert held(store.load()) is None


def test_a_stopped_guard_reads_stopped_even_while_paused(tmp_path, node_config):
    """A rollout pauses a guard that is stopped: `guard status` said "paused" and exited 1,
    where a stop (an alert, a person needed) exits 2."""
    from click.testing import CliRunner

    from opsctl.cli import cli

    node_config()
    store = GuardStore(tmp_path / "state")
    with store.update() as state:
        state["status"], state["stopped"] = STOPPED, {"reason": "budget spent", "at": time.time(), "alert_id": "x"}
        state["heartbeat"] = time.time()
    store.pause("rollout r1")
    result = CliRunner().invoke(cli, ["guard", "status", "--json"])
    assert result.exit_code == 2, result.output
    assert '"state": "stopped"' in result.output and "also paused by" in result.output


_NO_KV = [
    "[2026-05-31 10:20:01] server_args={'model_path': '/models/Kimi-K2.6', 'mem_fraction_static': 0.93, "
    "'chunked_prefill_size': 4096, 'tp_size': 8}",
    "[2026-05-31 10:20:40 TP0] Load weight begin. avail mem=93.41 GB",
    "[2026-05-31 10:24:11 TP0] Load weight end. elapsed=210.55 s, type=DeepseekV3ForCausalLM, avail mem=5.40 GB, "
    "mem usage=88.01 GB.",
    "[2026-05-31 10:24:12 TP0] Scheduler hit an exception: Traceback (most recent call last):",
    "ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.93. Raise "
    "--mem-fraction-static above 0.942 (minimum viable = 1 - available/pre = 0.9411). If using speculative "
    "decoding, draft weights are now counted.",
    "[2026-05-31 10:24:13] Received sigquit from a child process. It usually means the child failed.",
]


@pytest.mark.parametrize("minimum, raise_to", [("0.9411", 0.942), ("0.9420", 0.943)])
def test_the_fraction_sglang_names_is_read_from_its_message(minimum, raise_to):
    """SGLang 0.5.23 names ceil(minimum, 0.001) and needs a fraction strictly above the minimum:
    the named value, unless the minimum was that value itself."""
    lines = [line.replace("0.9411", minimum) for line in _NO_KV]
    death = death_from(oom.analyze(lines))
    assert (death.kind, death.raise_to) == ("startup_no_kv_memory", raise_to)
