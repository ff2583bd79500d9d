"""opsctl rollout: the playbook command, progress parsing, summaries and exit codes (no nodes)."""

import json
import re
import signal
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from opsctl import rollout as ro
from opsctl.cli import cli
from opsctl.commands import rollout as command

REPO = Path(__file__).resolve().parents[2]


def write_run(run_dir: Path, hosts: list[str], results: dict[str, dict], run: str = "r2") -> None:
    (run_dir / "hosts").mkdir(parents=True, exist_ok=True)
    (run_dir / "plan.json").write_text(json.dumps({"rollout": run_dir.name, "run": run, "hosts": hosts}))
    for host, result in results.items():
        (run_dir / "hosts" / f"{host}.json").write_text(json.dumps({"run": run, **result}))


def test_change_extra_vars_and_name():
    change = ro.Change(fraction=0.93, chunked_prefill_size=2048, expandable_segments=False,
                       image="dflash/sglang:0.5.24")
    assert change.extra_vars() == {"rollout_mem_fraction_static": 0.93, "rollout_chunked_prefill_size": 2048,
                                   "rollout_expandable_segments": False, "rollout_image": "dflash/sglang:0.5.24"}
    assert change.slug() == "fraction-0.93_chunk-2048_expandable-off_image-dflash_sglang_0.5.24"
    assert ro.Change().slug() == "inventory-values"
    assert ro.Change().extra_vars() == {}


def test_playbook_command_uses_this_environment_and_passes_typed_extra_vars(tmp_path):
    argv = ro.playbook_command(inventory=tmp_path / "inv", limit="dflash", change=ro.Change(fraction=0.93),
                               name="n", state_dir=tmp_path / "s", batch=2, check=True, resume=False,
                               playbook_dir=REPO / "ansible")
    assert argv[0] == str(Path(sys.executable).parent / "ansible-playbook")
    assert argv[3] == str(REPO / "ansible" / "rollout.yml")
    extra = json.loads(argv[argv.index("-e") + 1])
    assert extra == {"rollout_mem_fraction_static": 0.93, "rollout_name": "n", "rollout_state_dir": str(tmp_path / "s"),
                     "rollout_batch": 2, "rollout_resume": False}
    assert argv[-4:] == ["-l", "dflash", "--check", "--diff"]
    assert ro.playbook_env({})["ANSIBLE_STDOUT_CALLBACK"] == "ansible.posix.jsonl"


def test_default_state_dir_sits_next_to_the_inventory(tmp_path):
    inventory = tmp_path / "inventories" / "lab"
    inventory.mkdir(parents=True)
    assert ro.default_state_dir(inventory) == tmp_path / "inventories" / ".rollout" / "lab"
    (inventory / "hosts.yml").write_text("")
    assert ro.default_state_dir(inventory / "hosts.yml") == tmp_path / "inventories" / ".rollout" / "lab"


def test_parse_events_reads_jsonl_results_and_diffs():
    # (task names as the ansible.posix.jsonl callback writes them: "ROLE : NAME" for a role's task)
    lines = [
        "[WARNING]: something on stderr",
        json.dumps({"_event": "v2_playbook_on_task_start", "task": {"name": "rollout : Drain: wait"}, "hosts": {}}),
        json.dumps({"_event": "v2_runner_on_ok", "task": {"name": "rollout : Drain: wait until idle."},
                    "hosts": {"n1": {"changed": False}}}),
        json.dumps({"_event": "v2_runner_on_ok", "task": {"name": "rollout : Render: write the environment file."},
                    "hosts": {"n1": {"changed": True, "diff": [
                        {"before": "A=1\n", "after": "A=2\n", "before_header": "/etc/x", "after_header": "/etc/x"}]}}}),
        json.dumps({"_event": "v2_runner_on_failed", "task": {"name": "rollout : Restart: restart the engine."},
                    "hosts": {"n2": {"msg": "Job failed"}}}),
        json.dumps({"_event": "v2_runner_on_ok", "task": {"name": "sglang : Read the opsctl overrides."},
                    "hosts": {"n3": {"changed": False}}}),
        json.dumps({"_event": "v2_runner_on_ok", "task": {"name": "Pre-check: report opsctl overrides on the node."},
                    "hosts": {"n3": {"changed": False}}}),
    ]
    events = list(ro.parse_events(iter(lines)))
    assert [(e.host, e.phase, e.outcome) for e in events] == [
        ("n1", "Drain", "ok"), ("n1", "Render", "changed"), ("n2", "Restart", "failed"), ("n3", None, "ok"),
        ("n3", "Pre-check", "ok")]
    assert [e.name for e in events[2:4]] == ["Restart: restart the engine.", "Read the opsctl overrides."]
    assert events[2].message == "Job failed"
    text = ro.unified_diff(events[1].diffs[0])
    assert "-A=1\n" in text and "+A=2\n" in text


def test_the_rollout_roles_task_names_start_with_a_step():
    """The progress and the "lost mid-change" check read the step from each task name: a task of
    the rollout role named without one would be taken for a change in progress."""
    import yaml

    def names(tasks):
        for task in tasks:
            if "name" in task and not {"block", "ansible.builtin.import_tasks"} & task.keys():
                yield task["name"]
            for key in ("block", "rescue", "always"):
                yield from names(task.get(key, []))
    for path in (REPO / "ansible" / "roles" / "rollout" / "tasks").glob("*.yml"):
        if path.name == "keep_record.yml":  # (site.yml's, not the rollout's)
            continue
        for name in names(yaml.safe_load(path.read_text())):
            event = ro.TaskEvent("n1", f"rollout : {name}", "ok", "", [])
            assert event.phase in {*ro.PHASES_BEFORE_CHANGE, "Render", "Guard", "Drain", "Restart", "Verify",
                                   "Record", "Rollback"}, (path.name, name)


def test_summary_of_a_stopped_rollout(tmp_path):
    run_dir = tmp_path / "fraction-0.93"
    write_run(run_dir, ["n1", "n2", "n3"], {
        "n1": {"status": "done", "requested": {"sglang_mem_fraction_static": 0.93},
               "timings": {"engine_start_s": 4.0, "overhead_s": 6.5, "total_s": 10.5}},
        "n2": {"status": "rolled_back", "reason": "Restart: restart the engine.: Job failed"},
    })
    summary = ro.summarize(run_dir)
    assert [(n.host, n.status) for n in summary.nodes] == [("n1", "done"), ("n2", "rolled_back"), ("n3", "not reached")]
    data = summary.to_json()
    assert (data["done"], data["rolled_back"], data["not_reached"]) == (["n1"], ["n2"], ["n3"])
    assert data["overhead_s"] == {"median": 6.5, "max": 6.5}
    assert summary.exit_code == ro.EXIT_STOPPED
    assert "sglang_mem_fraction_static: 0.93" in ro.inventory_hint(summary)


def test_summary_exit_codes(tmp_path):
    write_run(tmp_path / "a", ["n1", "n2"], {"n1": {"status": "done"}, "n2": {"status": "unchanged"}})
    assert ro.summarize(tmp_path / "a").exit_code == ro.EXIT_DONE
    write_run(tmp_path / "b", ["n1"], {"n1": {"status": "rollback_failed"}})
    assert ro.summarize(tmp_path / "b").exit_code == ro.EXIT_DOWN
    # refused at the first node's pre-check: nothing changed anywhere, "refused before any node
    # changed" (2, as the README says), not "stopped with a rollback" (1)
    write_run(tmp_path / "c", ["n1", "n2"], {"n1": {"status": "refused"}})
    assert ro.summarize(tmp_path / "c").exit_code == ro.EXIT_USAGE
    write_run(tmp_path / "d", ["n1", "n2"], {"n1": {"status": "done"}, "n2": {"status": "refused"}})
    assert ro.summarize(tmp_path / "d").exit_code == ro.EXIT_STOPPED
    assert ro.summarize(tmp_path / "missing") is None


def test_resumed_run_counts_nodes_finished_earlier(tmp_path):
    run_dir = tmp_path / "r"
    write_run(run_dir, ["n1", "n2"], {"n2": {"status": "done"}}, run="second")
    (run_dir / "hosts" / "n1.json").write_text(json.dumps({"run": "first", "status": "done"}))
    summary = ro.summarize(run_dir)
    assert [n.status for n in summary.nodes] == [ro.DONE_EARLIER, "done"]
    assert summary.exit_code == ro.EXIT_DONE
    as_json = summary.to_json()
    assert [(n["host"], n["status"]) for n in as_json["nodes"]] == [("n1", ro.DONE_EARLIER), ("n2", "done")]
    assert as_json["done"] == ["n1", "n2"]


@pytest.fixture
def fake_playbook(tmp_path, monkeypatch):
    """A stand-in ansible/ folder and a Popen that writes the results a real run would."""
    ansible = tmp_path / "ansible"
    (ansible / "inventories" / "lab").mkdir(parents=True)
    (ansible / "rollout.yml").write_text("---\n")
    monkeypatch.setenv("OPSCTL_ANSIBLE_DIR", str(ansible))
    calls, sent = [], []

    class FakePopen:
        results: dict = {}
        rc = 2

        def __init__(self, argv, **kwargs):
            calls.append(argv)
            self.signals = sent
            extra = json.loads(argv[argv.index("-e") + 1])
            run_dir = Path(extra["rollout_state_dir"]) / extra["rollout_name"]
            if self.results:  # each run writes its own plan, as validate.yml does (its run: a timestamp)
                write_run(run_dir, list(self.results), {h: r for h, r in self.results.items() if r},
                          run=f"r{len(calls)}")
            self.stdout = iter([json.dumps({"_event": "v2_runner_on_ok", "task": {"name": "rollout : Drain: wait."},
                                            "hosts": {"n1": {}}}) + "\n"])

        def wait(self, timeout=None):
            return self.rc

        def send_signal(self, signum):
            self.signals.append(signum)

    monkeypatch.setattr(command.subprocess, "Popen", FakePopen)
    FakePopen.sent = sent
    return ansible, FakePopen, calls


def test_cli_stopped_rollout_exits_1_with_summary(fake_playbook):
    ansible, popen, calls = fake_playbook
    popen.results = {"n1": {"status": "done", "requested": {"sglang_mem_fraction_static": 0.93}},
                     "n2": {"status": "rolled_back", "reason": "no"}, "n3": {}}
    result = CliRunner().invoke(cli, ["rollout", "--fraction", "0.93", "-i", str(ansible / "inventories" / "lab"),
                                      "--json"])
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    assert (data["done"], data["rolled_back"], data["not_reached"]) == (["n1"], ["n2"], ["n3"])
    state = ansible / "inventories" / ".rollout" / "lab"
    assert json.loads((state / "fraction-0.93.json").read_text())["exit_code"] == 1
    log = (state / "fraction-0.93" / "ansible.log").read_text().splitlines()
    assert log[0].startswith("=== ") and " run: " in log[0] and log[1].startswith("{")
    # a resumed run appends: the log of the run that stopped is still there
    popen.results = {"n1": {"status": "done"}, "n2": {"status": "done"}, "n3": {"status": "done"}}
    popen.rc = 0
    resumed = CliRunner().invoke(cli, ["rollout", "--fraction", "0.93", "-i", str(ansible / "inventories" / "lab"),
                                       "--resume"])
    assert resumed.exit_code == 0, resumed.output
    log = (state / "fraction-0.93" / "ansible.log").read_text()
    assert re.findall(r"^=== \S+ \S+ (\w+): ", log, re.MULTILINE) == ["run", "resume"]


def test_cli_without_ansible_playbook_is_refused_before_anything(fake_playbook, monkeypatch, tmp_path):
    import sys

    ansible, _, calls = fake_playbook
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    result = CliRunner().invoke(cli, ["rollout", "--fraction", "0.93", "-i", str(ansible / "inventories" / "lab")])
    assert result.exit_code == 2 and "ansible-playbook not found" in result.stderr and "pip install 'dflash-ops[dev]'" in result.stderr
    assert calls == [] and not (ansible / "inventories" / ".rollout").exists()


def test_cli_playbook_refusal_before_any_node_exits_2(fake_playbook):
    ansible, popen, _ = fake_playbook
    popen.results = {}
    result = CliRunner().invoke(cli, ["rollout", "--fraction", "0.93", "-i", str(ansible / "inventories" / "lab")])
    assert result.exit_code == 2
    assert "stopped before changing any node" in result.stderr


def test_cli_an_interrupted_rollout_stops_the_playbook_and_exits_3(fake_playbook, monkeypatch):
    """Ctrl-C or SIGTERM mid-node: click said "Aborted!" and exited 1 ("stopped with a
    rollback"), although no rollback ran and a node may be half changed."""
    ansible, popen, _ = fake_playbook
    popen.results = {"n1": {"status": "done"}, "n2": {}}

    def interrupted(process, log, lost):
        raise command.Terminated("SIGTERM")
    monkeypatch.setattr(command, "_follow", interrupted)
    result = CliRunner().invoke(cli, ["rollout", "--fraction", "0.93", "-i", str(ansible / "inventories" / "lab")])
    assert result.exit_code == 3, result.output
    assert popen.sent == [signal.SIGINT]  # the playbook stops too (a SIGTERM did not reach it)
    assert "interrupted" in result.stderr and "check n2" in result.stderr


def test_cli_a_failed_check_is_exit_2_not_a_stopped_rollout(fake_playbook):
    ansible, popen, _ = fake_playbook
    result = CliRunner().invoke(cli, ["rollout", "--check", "--fraction", "0.93",
                                      "-i", str(ansible / "inventories" / "lab")])
    assert result.exit_code == 2 and "the check failed" in result.stderr


def test_cli_an_earlier_runs_records_are_not_this_runs(fake_playbook):
    """The playbook stops before writing its plan (a bad -l, an inventory error): the plan and
    results an earlier run left must not be reported as this run's, nor overwrite its summary."""
    ansible, popen, _ = fake_playbook
    inventory = str(ansible / "inventories" / "lab")
    popen.results, popen.rc = {"n1": {"status": "done"}, "n2": {"status": "done"}}, 0
    assert CliRunner().invoke(cli, ["rollout", "--fraction", "0.93", "-i", inventory]).exit_code == 0
    summary = ansible / "inventories" / ".rollout" / "lab" / "fraction-0.93.json"
    before = summary.read_text()
    popen.results, popen.rc = {}, 2
    result = CliRunner().invoke(cli, ["rollout", "--fraction", "0.93", "-i", inventory])
    assert result.exit_code == 2 and "stopped before changing any node" in result.stderr
    assert summary.read_text() == before


def test_cli_a_playbook_failing_after_every_node_finished_is_not_done(fake_playbook):
    ansible, popen, _ = fake_playbook
    popen.results, popen.rc = {"n1": {"status": "done"}}, 2
    result = CliRunner().invoke(cli, ["rollout", "--fraction", "0.93", "-i", str(ansible / "inventories" / "lab")])
    assert result.exit_code == 1 and "ansible-playbook exited 2 after the nodes finished" in result.stderr


def test_cli_usage_errors(fake_playbook, tmp_path):
    ansible, _, calls = fake_playbook
    inventory = str(ansible / "inventories" / "lab")
    assert CliRunner().invoke(cli, ["rollout", "--fraction", "1.2", "-i", inventory]).exit_code == 2
    bad_chunk = CliRunner().invoke(cli, ["rollout", "--chunked-prefill-size", "0", "-i", inventory])
    assert bad_chunk.exit_code == 2 and "-1 (no chunking)" in bad_chunk.stderr
    resume = CliRunner().invoke(cli, ["rollout", "--fraction", "0.93", "-i", inventory, "--resume"])
    assert resume.exit_code == 2 and "no rollout named fraction-0.93 to resume" in resume.stderr
    assert calls == []


def test_cli_resume_passes_the_flag(fake_playbook):
    ansible, popen, calls = fake_playbook
    popen.results = {"n1": {"status": "done"}}
    popen.rc = 0
    inventory = str(ansible / "inventories" / "lab")
    assert CliRunner().invoke(cli, ["rollout", "--fraction", "0.93", "-i", inventory]).exit_code == 0
    assert CliRunner().invoke(cli, ["rollout", "--fraction", "0.93", "-i", inventory, "--resume"]).exit_code == 0
    assert json.loads(calls[-1][calls[-1].index("-e") + 1])["rollout_resume"] is True


def test_playbook_passes_syntax_check_with_both_inventories():
    import subprocess
    for inventory in ("inventories/production", "inventories/lab"):
        result = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", inventory,
                                 "rollout.yml", "--syntax-check"], cwd=REPO / "ansible", capture_output=True,
                                text=True, check=False)
        assert result.returncode == 0, result.stderr


def test_cli_a_node_lost_mid_change_is_reported_and_exits_3(fake_playbook):
    """Ansible runs neither the rescue (rollback) nor the always (result) of a node that became
    unreachable: it was listed "not reached" with exit 1, "rolled back and healthy"."""
    ansible, popen, _ = fake_playbook
    popen.results = {"n1": {"status": "done"}, "n2": {}, "n3": {}}
    real_init = popen.__init__

    def init(self, argv, **kwargs):
        real_init(self, argv, **kwargs)
        self.stdout = iter([json.dumps({"_event": "v2_runner_on_unreachable",
                                        "task": {"name": "rollout : Restart: restart."},
                                        "hosts": {"n2": {"msg": "ssh: connect to host n2 port 22: No route"}}}) + "\n"])
    popen.__init__ = init
    result = CliRunner().invoke(cli, ["rollout", "--fraction", "0.93", "-i", str(ansible / "inventories" / "lab"),
                                      "--json"])
    assert result.exit_code == 3, result.output
    data = json.loads(result.stdout)
    assert data["lost"] == ["n2"] and data["not_reached"] == ["n3"]
    assert "n2 became unreachable during its change" in " ".join(result.stderr.split())


def test_cli_resume_refuses_another_change_under_the_same_name(fake_playbook):
    """--fraction 0.93 --name q3 stopped at node 2; --fraction 0.92 --name q3 --resume skipped node
    1 as done (on 0.93) and exited 0."""
    ansible, popen, calls = fake_playbook
    run_dir = ansible / "inventories" / ".rollout" / "lab" / "q3"
    write_run(run_dir, ["n1", "n2"], {"n1": {"status": "done"}})
    plan = json.loads((run_dir / "plan.json").read_text())
    (run_dir / "plan.json").write_text(json.dumps(plan | {"requested": {"sglang_mem_fraction_static": 0.93}}))
    result = CliRunner().invoke(cli, ["rollout", "--fraction", "0.92", "--name", "q3", "--resume",
                                      "-i", str(ansible / "inventories" / "lab")])
    assert result.exit_code == 2 and "was started with {'sglang_mem_fraction_static': 0.93}" in result.output
    assert calls == []


def test_cli_a_second_ctrl_c_while_the_playbook_stops_still_exits_3(fake_playbook, monkeypatch):
    ansible, popen, _ = fake_playbook
    popen.results = {"n1": {"status": "done"}, "n2": {}}

    def interrupted(process, log, lost):
        raise KeyboardInterrupt

    def wait_with_a_second_ctrl_c(self, timeout=None):
        if timeout is not None:  # the wait after the first Ctrl-C
            signal.raise_signal(signal.SIGINT)
        return 130
    monkeypatch.setattr(command, "_follow", interrupted)
    monkeypatch.setattr(popen, "wait", wait_with_a_second_ctrl_c)
    result = CliRunner().invoke(cli, ["rollout", "--fraction", "0.93", "-i", str(ansible / "inventories" / "lab")])
    assert result.exit_code == 3, result.output
    assert "interrupted" in result.stderr and "Aborted" not in result.output


@pytest.mark.parametrize("task, lost", [
    ("rollout : Restart: restart.", True),
    ("rollout : Pre-check: probe health.", False),
    # the sglang role's task that the pre-check includes: still the pre-check
    ("sglang : Ensure the override file exists (opsctl owns its content).", False),
], ids=["restart", "pre-check", "pre-check-sglang-task"])
def test_cli_the_only_node_lost_mid_change_is_not_nothing_changed(fake_playbook, task, lost):
    """Production's one node unreachable mid-restart, no result anywhere: it was "stopped before
    changing any node" (exit 2); unreachable at its pre-check, it is. The jsonl callback names the
    tasks "rollout : Pre-check: ...": read as the step "rollout", every unreachable node was lost."""
    ansible, popen, _ = fake_playbook
    popen.results = {"n1": {}}
    real_init = popen.__init__

    def init(self, argv, **kwargs):
        real_init(self, argv, **kwargs)
        self.stdout = iter([json.dumps(event) + "\n" for event in (
            {"_event": "v2_runner_on_ok", "task": {"name": "rollout : Plan: check that the requested values are in range."},
             "hosts": {"n1": {}}},
            {"_event": "v2_runner_on_ok", "task": {"name": "rollout : Pre-check: note the start time."},
             "hosts": {"n1": {}}},
            {"_event": "v2_runner_on_unreachable", "task": {"name": task},
             "hosts": {"n1": {"msg": "ssh: connect to host n1 port 22: No route"}}})])
    popen.__init__ = init
    result = CliRunner().invoke(cli, ["rollout", "--fraction", "0.93", "-i", str(ansible / "inventories" / "lab")])
    assert result.exit_code == (3 if lost else 2), result.output
    assert "n1: Plan (+" in result.stderr and "n1: Pre-check (+" in result.stderr  # the progress advances
    assert ("n1 became unreachable during its change" in " ".join(result.stderr.split())) is lost


def test_a_node_that_fails_in_a_batch_of_two_stops_the_rollout(tmp_path):
    """--batch 2: n2 refused at its pre-check (rescue, then fail, then the guard's `always`) while
    n1 of its batch ended fine. Ansible does not count such a host toward max_fail_percentage 0 and
    ended the play only when a whole batch failed, so n3 and n4 were changed after it. The real
    rollout.yml on local "nodes", run as opsctl runs it: n1 is skipped as done earlier (resume), n2
    fails before its probe (its override file's folder is missing): no engine or Docker needed."""
    import subprocess

    state = tmp_path / "state"
    write_run(state / "t", ["n1"], {"n1": {"status": "done", "finished": "earlier"}}, run="r1")
    (tmp_path / "hosts.ini").write_text(
        "[dflash]\nn1\nn2\nn3\nn4\n[dflash:vars]\nansible_connection=local\nansible_become=false\n"
        f"ansible_python_interpreter={sys.executable}\nrollout_backup_dir={tmp_path / 'backup'}\n"
        f"sglang_override_env_file={tmp_path / 'missing' / 'override.env'}\n")
    argv = ro.playbook_command(inventory=tmp_path / "hosts.ini", limit="dflash", change=ro.Change(fraction=0.9),
                               name="t", state_dir=state, batch=2, check=False, resume=True,
                               playbook_dir=REPO / "ansible")
    result = subprocess.run(argv, cwd=REPO / "ansible", capture_output=True, text=True, timeout=300, check=False,
                            env={**ro.playbook_env(), "PATH": "/usr/bin:/bin"})  # (no docker, should the probe run)
    out = result.stdout + result.stderr
    assert result.returncode != 0, out[-3000:]
    assert sorted(path.name for path in (state / "t" / "hosts").iterdir()) == ["n1.json", "n2.json"], out[-3000:]
    summary = ro.summarize(state / "t")
    assert [(n.host, n.status) for n in summary.nodes] == [
        ("n1", ro.DONE_EARLIER), ("n2", "refused"), ("n3", ro.NOT_REACHED), ("n4", ro.NOT_REACHED)]
    assert summary.exit_code == ro.EXIT_USAGE  # refused before this run changed any node
    assert "n3 is not touched: the rollout stopped at n2 (refused) in an earlier batch" in " ".join(out.split())
