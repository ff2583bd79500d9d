"""The guard's loop (`Watcher`) with a fake node, journal and guard: what the scanner knows when
the guard goes back to watching after a stop."""

import dataclasses
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import click
import pytest

from opsctl import oom, systemd
from opsctl.config import GuardConfig, NodeConfig
from opsctl.guard import daemon, policy
from opsctl.guard.state import STOPPED, GuardStore
from opsctl.overrides import TunedValues
from opsctl.startup_log import EngineConfig
from opsctl.systemd import UnitState

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "oom"
STARTUP = (FIXTURES / "startup_093.log").read_text().splitlines()
SERVING_OOM = (FIXTURES / "seed_journal.log").read_text().splitlines()
# A start that dies while the guard is stopped (drill 4's crash loop): args, weights, no pool.
FAILED_START = [STARTUP[0], STARTUP[1], "[2026-05-31 10:21:00] Received sigquit from a child process. It usually means the child failed."]


class FakeJournal:
    """The unit's journal: `backlog` sees all of it, a follower the lines written after it opened."""

    def __init__(self, lines):
        self.lines = list(lines)
        self.followers = []
        self.opened = 0  # followers opened so far: one per resync of the guard

    def write(self, *lines):
        self.lines.extend(lines)
        for follower in self.followers:
            follower.queue.extend(lines)

    def follower(self, unit, cursor):
        journal = self

        class Follower:
            queue = []

            def new_lines(self):
                lines, self.queue[:] = list(self.queue), []
                return lines

            def close(self):
                journal.followers.remove(self)

        follower = Follower()
        follower.queue = []
        self.followers.append(follower)
        self.opened += 1
        return follower


class FakeNode:
    def __init__(self, journal):
        self.journal = journal
        self.active = True
        self.unit_reads = 0  # one per pass of the watcher's loop

    def effective(self):
        return TunedValues(0.94, 8192, False)

    def unit(self):
        self.unit_reads += 1
        state = ("active", "running") if self.active else ("activating", "auto-restart")
        return UnitState("sglang.service", "loaded", *state, "success", 0, 1, 0, "enabled", datetime.now(timezone.utc))

    def stop_requested(self, unit):
        """systemd's "Stopping ..." of a stop job in the journal (the fake's journal holds one run)."""
        return any("systemd[1]: Stopping " in line for line in self.journal.lines)

    def lock_holder(self):
        return None

    def backlog(self):
        return list(self.journal.lines), "cursor"

    def config_hint(self):
        return EngineConfig(mem_fraction_static=0.94, chunked_prefill_size=8192, expandable_segments=False)


def _watcher(tmp_path, monkeypatch):
    """A Watcher over a fake node whose journal holds an engine start: (loop, node, store, guard)."""
    journal = FakeJournal(STARTUP)
    monkeypatch.setattr(daemon.journal, "JournalFollower", journal.follower)
    config = NodeConfig(state_dir=tmp_path, engine_url="http://127.0.0.1:9")
    node, store = FakeNode(journal), GuardStore(tmp_path)
    guard = RecordingGuard(store)
    return daemon.Watcher(config, guard=guard, node=node), node, store, guard


class RecordingGuard:
    """Records deaths; the first `stop_after` of them spend the budget, as in a crash loop."""

    def __init__(self, store, stop_after=0):
        self.store = store
        self.stop_after = stop_after
        self.deaths = []
        self.stops = []
        self.death_error = None  # raised by on_death, as the real guard raises on an unreadable env file

    def resume_pending(self):
        pass

    def heartbeat(self):
        pass

    def observe_serving(self):
        pass

    def stop(self, reason, death):
        with self.store.update() as state:  # as the real guard does, the alert's id included
            state["status"] = STOPPED
            state["stopped"] = {"reason": reason, "at": time.time(), "alert_id": "test"}
        self.stops.append(reason)  # after the state, which the test reads once it sees this

    def on_death(self, death, seen):
        if self.death_error:
            raise self.death_error
        self.deaths.append(death)
        if len(self.deaths) <= self.stop_after:
            with self.store.update() as state:
                state["status"] = STOPPED


def wait_until(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def wait_for_passes(node, passes=2):
    """Until the watcher's loop has made `passes` more passes: the second one at least started
    after this call, so it has read the guard's state as it is now."""
    seen = node.unit_reads
    assert wait_until(lambda: node.unit_reads >= seen + passes), "the watcher's loop is not running"


@pytest.fixture
def watcher(tmp_path, monkeypatch):
    journal = FakeJournal(STARTUP)
    monkeypatch.setattr(daemon.journal, "JournalFollower", journal.follower)
    config = NodeConfig(state_dir=tmp_path, engine_url="http://127.0.0.1:9",
                        guard=GuardConfig(probe_interval_s=60.0))
    node, guard = FakeNode(journal), RecordingGuard(GuardStore(tmp_path), stop_after=1)
    loop = daemon.Watcher(config, guard=guard, node=node)
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    yield journal, node, guard, GuardStore(tmp_path)
    loop.stopping.set()
    thread.join(timeout=5)


def test_a_serving_oom_after_a_stop_and_resume_is_not_filed_as_a_startup_failure(watcher):
    journal, node, guard, store = watcher
    # Drill 4: a start dies; the guard decides, finds the budget spent and stops.
    opened = journal.opened
    node.active = False
    journal.write(*FAILED_START)
    assert wait_until(lambda: len(guard.deaths) == 1 and store.load()["status"] == STOPPED)
    assert wait_until(lambda: journal.opened > opened)  # it resynced after deciding
    # The operator fixes it: a start that reaches ready, seen while the guard is stopped; resume.
    journal.write(*STARTUP)
    node.active = True
    wait_for_passes(node)  # the start is read while the guard is stopped
    opened = journal.opened
    store.resume("drill")
    assert wait_until(lambda: journal.opened > opened)  # back to watching: it resynced
    journal.write(*SERVING_OOM)  # the seed's 32k prefill OOM, while serving
    assert wait_until(lambda: len(guard.deaths) == 2), "the guard decided nothing about the OOM"
    assert guard.deaths[1].cause in (oom.ACTIVATION_SPIKE, oom.FRAGMENTATION), guard.deaths[1]


def test_deaths_are_not_decided_while_stopped(watcher):
    journal, node, guard, store = watcher
    with store.update() as state:
        state["status"] = STOPPED
    wait_for_passes(node)  # the watcher has seen it stopped
    journal.write(*SERVING_OOM)
    node.active = False
    time.sleep(daemon.CLASSIFY_GRACE_S + 5 * daemon.TICK_S)
    wait_for_passes(node, passes=3)  # the loop ran on, past the grace, with the death in view
    assert guard.deaths == []


def test_a_death_the_guard_cannot_judge_stops_it_and_the_loop_lives_on(watcher):
    """An override file with a value that is not a number: the guard cannot read the config in
    force, so it stops (with the file's error as the reason) instead of crashing its loop."""
    journal, node, guard, store = watcher
    guard.death_error = click.ClickException("override.env: SGLANG_MEM_FRACTION_STATIC='0,94' is not a number")
    journal.write(*SERVING_OOM)
    node.active = False
    assert wait_until(lambda: guard.stops), "the loop did not stop the guard"
    assert "SGLANG_MEM_FRACTION_STATIC='0,94' is not a number" in guard.stops[0]
    assert store.load()["status"] == STOPPED
    wait_for_passes(node)  # still looping


def test_a_bug_while_judging_a_death_stops_the_guard_with_an_alert_and_the_loop_lives_on(watcher, capfd):
    """Anything else that goes wrong in a decision (a bug of ours): the guard stops acting and says
    why (guard.stop raises the alert), with the traceback in its journal, rather than dying unheard
    and being restarted by systemd with the death forgotten."""
    journal, node, guard, store = watcher
    guard.death_error = KeyError("mem_fraction_static")
    journal.write(*SERVING_OOM)
    node.active = False
    assert wait_until(lambda: guard.stops), "the loop did not stop the guard"
    assert "KeyError: 'mem_fraction_static'" in guard.stops[0] and "traceback" in guard.stops[0]
    assert store.load()["status"] == STOPPED
    assert "Traceback" in capfd.readouterr().err
    wait_for_passes(node)  # still looping


def test_a_damaged_state_file_is_announced_once(watcher):
    journal, node, guard, store = watcher
    store.state_file.write_text('{"status": "watching", "paused": {"by"')
    assert wait_until(lambda: guard.stops), "the watcher did not stop the guard"
    assert "is damaged" in guard.stops[0]
    wait_for_passes(node, passes=3)
    assert len(guard.stops) == 1


def test_the_heartbeat_goes_on_while_the_guard_acts_on_a_death(tmp_path, monkeypatch):
    """A step (a restart) takes minutes, and `opsctl status` takes a beat older than 30 s for a
    dead guard: the watcher beats from its own thread, so the beats go on while the guard acts on a
    death (before: the loop beat, and stood still while acting)."""
    monkeypatch.setattr(daemon, "HEARTBEAT_S", 0.01)
    journal = FakeJournal(STARTUP)
    monkeypatch.setattr(daemon.journal, "JournalFollower", journal.follower)
    config = NodeConfig(state_dir=tmp_path, engine_url="http://127.0.0.1:9", guard=GuardConfig(probe_interval_s=60.0))
    node, guard = FakeNode(journal), RecordingGuard(GuardStore(tmp_path))
    beats, acting, step_done = [], threading.Event(), threading.Event()
    guard.heartbeat = lambda: beats.append(time.monotonic())
    guard.on_death = lambda death, seen: (acting.set(), step_done.wait(10))
    loop = daemon.Watcher(config, guard=guard, node=node)
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    try:
        journal.write(*SERVING_OOM)
        node.active = False
        assert acting.wait(10), "the guard was not asked to act on the death"
        before = len(beats)
        time.sleep(0.3)  # the step "runs"
        assert len(beats) >= before + 5, f"{len(beats) - before} beats in 0.3 s while the guard acted"
    finally:
        step_done.set()
        loop.stopping.set()
        thread.join(timeout=5)


def test_failing_probes_while_the_scheduler_logs_batches_are_not_a_hang(tmp_path, monkeypatch):
    """SGLang answers a health check only when its current forward pass ends; a pass longer than
    the probe (a long unchunked prefill) fails the probes of a working engine. While its
    scheduler logs batches, a restart would only kill its requests; once the batches stop too,
    it is a hang."""
    journal = FakeJournal(STARTUP)
    monkeypatch.setattr(daemon.journal, "JournalFollower", journal.follower)
    config = NodeConfig(state_dir=tmp_path, engine_url="http://127.0.0.1:9", guard=GuardConfig(hang_timeout_s=10.0))
    node, store = FakeNode(journal), GuardStore(tmp_path)
    guard = RecordingGuard(store)
    loop = daemon.Watcher(config, guard=guard, node=node)
    unit = node.unit()
    batch = ("2026-12-01T06:52:13+0000 dflash-train sglang[7130]: [2026-12-01 06:52:13 TP0] Prefill batch, "
             "#new-seq: 1, #new-token: 4096, #cached-token: 0, token usage: 0.41, #running-req: 1, #queue-req: 3")
    for t in (0.0, 4.0, 8.0, 12.0):
        loop.detector.record(False, t, "no answer within 30 s")
    loop._tick([batch], unit, 12.0)
    loop._tick([], unit, 20.0)  # 8 s after the last batch
    assert guard.deaths == []
    assert [r["event"] for r in store.records()].count("busy-not-hung") == 1  # said once, not each tick
    loop._tick([], unit, 23.0)  # probes failing for 23 s, no batch for 11 s
    assert [d.cause for d in guard.deaths] == ["hang"]


def test_with_chunked_prefill_off_an_engine_gets_a_long_forward_before_it_is_hung(tmp_path, monkeypatch):
    """SGLang logs a prefill batch after its forward: with chunking off (-1) a 185k prompt is one
    forward of minutes with no line, and the guard's 120 s restarted it as hung, killing the
    request. It waits UNCHUNKED_FORWARD_S at least then; chunked, its own timeout."""
    journal = FakeJournal(STARTUP)
    monkeypatch.setattr(daemon.journal, "JournalFollower", journal.follower)
    config = NodeConfig(state_dir=tmp_path, engine_url="http://127.0.0.1:9", guard=GuardConfig(hang_timeout_s=120.0))
    node = FakeNode(journal)
    monkeypatch.setattr(node, "config_hint", lambda: EngineConfig(0.93, -1, True))
    loop = daemon.Watcher(config, guard=RecordingGuard(GuardStore(tmp_path)), node=node)
    assert loop.detector.hang_timeout_s == policy.UNCHUNKED_FORWARD_S
    monkeypatch.setattr(node, "config_hint", lambda: EngineConfig(0.93, 4096, True))
    loop._resync()  # (after a step or another change: the config in force read again)
    assert loop.detector.hang_timeout_s == 120.0


def test_a_failed_old_run_with_a_job_queued_is_not_a_death(tmp_path, monkeypatch):
    """A `systemctl restart` whose stop step fails (`docker stop` of a container already gone)
    shows the old run "failed" while systemd holds the job that starts the new run: no death.
    The same state with no job left is one."""
    loop, node, store, guard = _watcher(tmp_path, monkeypatch)
    failed = dataclasses.replace(node.unit(), active_state="failed", sub_state="failed", job="1212")
    loop._tick([], failed, 1.0)
    loop._tick([], failed, 1.0 + 2 * daemon.CLASSIFY_GRACE_S)
    assert guard.deaths == []
    loop._tick([], dataclasses.replace(failed, job=""), 10.0)
    loop._tick([], dataclasses.replace(failed, job=""), 10.0 + 2 * daemon.CLASSIFY_GRACE_S)
    assert len(guard.deaths) == 1


def test_the_probes_own_prefills_are_not_work_for_clients():
    """SGLang 0.5.23 logs each /health_generate that finds it idle as a 1-token prefill: a
    stuck detokenizer fails every probe and still logs those lines."""
    prefix = "2026-12-01T06:52:13+0000 dflash-train sglang[7130]: [2026-12-01 06:52:13 TP0] "
    probe = (prefix + "Prefill batch, #new-seq: 1, #new-token: 1, #cached-token: 0, token usage: 0.00, "
             "#running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: False, input throughput (token/s): 3.1")
    assert not oom.scheduler_working(probe)
    assert oom.scheduler_working(probe.replace("#new-token: 1,", "#new-token: 4096,"))
    assert oom.scheduler_working(probe.replace("#running-req: 0,", "#running-req: 3,"))
    assert oom.scheduler_working(prefix + "Decode batch, #running-req: 1, #token: 8192, token usage: 0.04")


def test_a_run_that_systemd_stopped_on_request_is_not_a_death(tmp_path, monkeypatch):
    """`systemctl stop` while a long request runs: SGLang waits for it, `docker stop`'s grace runs
    out, the container is killed and `docker run` exits 137, so the unit ends "failed" with no job,
    as after a death. Before, the guard restarted the engine the operator had stopped. A kernel OOM
    kill (137 as well) of a run nobody stopped is still a death."""
    loop, node, store, guard = _watcher(tmp_path, monkeypatch)
    asked = []
    node.stop_requested = lambda unit: asked.append(unit.invocation) or unit.invocation == "run-1"
    stopped = dataclasses.replace(node.unit(), active_state="failed", sub_state="failed", result="exit-code",
                                  exit_status=137, invocation="run-1")
    for t in (1.0, 1.0 + 2 * daemon.CLASSIFY_GRACE_S, 10.0, 10.0 + 2 * daemon.CLASSIFY_GRACE_S):
        loop._tick([], stopped, t)
    assert guard.deaths == []
    records = [r for r in store.records() if r["event"] == "stopped-on-request"]
    assert len(records) == 1 and records[0]["invocation"] == "run-1"  # said once, not each tick
    assert asked == ["run-1"]
    # the operator starts it again; the new run is OOM-killed by the kernel, with no stop job
    killed = dataclasses.replace(stopped, active_state="activating", sub_state="auto-restart", invocation="run-2")
    loop._tick([], killed, 20.0)
    loop._tick([], killed, 20.0 + 2 * daemon.CLASSIFY_GRACE_S)
    assert [d.cause for d in guard.deaths] == [oom.UNKNOWN]


def _journalctl(monkeypatch, records=(), error=None):
    """systemd.stop_requested's journalctl: `records` (PID 1's entries for the run), or `error`."""
    import json
    import subprocess

    commands = []

    def run(command, **kwargs):
        commands.append(command)
        if error is not None:
            raise error
        return subprocess.CompletedProcess(command, 0, "".join(json.dumps(r) + "\n" for r in records), "")
    monkeypatch.setattr(systemd.subprocess, "run", run)
    return commands


BEGAN = {"MESSAGE_ID": systemd.STOP_JOB_BEGAN, "JOB_TYPE": "stop"}


@pytest.mark.parametrize("records, requested", [
    ([BEGAN], True),  # a stop job under way, or journald has not written its end yet
    ([BEGAN, {"MESSAGE_ID": systemd.STOP_JOB_FINISHED, "JOB_TYPE": "stop"}], True),
    ([{"MESSAGE_ID": systemd.STOP_JOB_FINISHED, "JOB_TYPE": "stop"}], True),  # stopped while starting: no "Stopping"
    ([BEGAN, {"MESSAGE_ID": systemd.STOP_JOB_FINISHED, "JOB_TYPE": "restart"}], False),  # a restart wants it up
    ([], False),  # a death: no stop job on this run
], ids=["began", "finished", "stopped-while-starting", "restart", "none"])
def test_stop_requested_reads_systemds_stop_jobs_for_the_run(monkeypatch, records, requested):
    unit = UnitState("sglang.service", "loaded", "failed", "failed", "exit-code", 0, 0, 137, "enabled", None,
                     invocation="0a1b2c")
    commands = _journalctl(monkeypatch, records)
    assert systemd.stop_requested(unit) is requested
    assert {"_PID=1", "UNIT=sglang.service", "INVOCATION_ID=0a1b2c", f"MESSAGE_ID={systemd.STOP_JOB_BEGAN}",
            f"MESSAGE_ID={systemd.STOP_JOB_FINISHED}"} <= set(commands[0])


@pytest.mark.parametrize("invocation, error", [
    ("0a1b2c", FileNotFoundError(2, "No such file or directory", "journalctl")),
    ("0a1b2c", "timeout"),
    ("", None),  # a run systemd named no id: nothing to look up
], ids=["no-journalctl", "timeout", "no-run-id"])
def test_a_journal_that_cannot_say_leaves_a_death_a_death(monkeypatch, invocation, error):
    import subprocess

    if error == "timeout":
        error = subprocess.TimeoutExpired(["journalctl"], 10)
    unit = UnitState("sglang.service", "loaded", "failed", "failed", "exit-code", 0, 0, 137, "enabled", None,
                     invocation=invocation)
    commands = _journalctl(monkeypatch, [BEGAN], error)
    assert systemd.stop_requested(unit) is False
    assert len(commands) == (1 if invocation else 0)
