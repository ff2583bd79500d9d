"""The guard's state file and audit log: a guard killed mid-remediation finishes the same step."""

import dataclasses

import pytest

from opsctl import oom
from opsctl.config import GuardConfig, NodeConfig
from opsctl.guard import policy
from opsctl.guard.daemon import ApplyResult, Guard, death_from
from opsctl.guard.state import GuardStore, summary
from opsctl.overrides import TunedValues
from opsctl.systemd import UnitState

SEED = TunedValues(0.94, 8192, False)


class FakeNode:
    def __init__(self, results):
        self.values = SEED
        self.results = list(results)
        self.applied = []
        self.serving = False

    def effective(self):
        return self.values

    def unit(self):
        return UnitState("sglang.service", "loaded", "activating", "auto-restart", "exit-code", 1, 0, 137, "enabled", None)

    def lock_holder(self):
        return None

    def apply(self, values, reason):
        self.applied.append(values)
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


@pytest.fixture
def setup(tmp_path):
    config = NodeConfig(state_dir=tmp_path, guard=GuardConfig(budget_per_hour=4, backoff_initial_s=0.0))
    store = GuardStore(tmp_path)
    alerts = []

    def alert(limits, reason, details):
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


def _kill_mid_step(make, store):
    """Run a step whose restart never returns (the guard is killed inside it)."""
    node, guard = make([])

    def killed(values, reason):
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
    assert node.applied == [TunedValues(0.94, 8192, True)]  # the same step, not the next rung
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
