"""The playbooks' input checks (ansible/tasks/validate.yml), run on this machine against the lab
inventory's values with one value changed: a bad one stops the play before any node is touched."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ANSIBLE = Path(__file__).resolve().parents[2] / "ansible"
BIN = Path(sys.executable).parent
ROLES = ("docker_engine", "gpu_host", "engine_image", "opsctl", "sglang")


@pytest.fixture(scope="module")
def checks(tmp_path_factory):
    """A playbook beside links to the repo's roles and tasks (validate.yml reads the roles' specs
    under playbook_dir) that runs only the input checks, on localhost, with the lab's values."""
    root = tmp_path_factory.mktemp("validate")
    for name in ("roles", "tasks", "inventories", "ansible.cfg"):
        (root / name).symlink_to(ANSIBLE / name)
    (root / "checks.yml").write_text(
        "- hosts: localhost\n  gather_facts: false\n"
        "  vars_files: [inventories/lab/group_vars/dflash/00-production.yml, inventories/lab/group_vars/dflash/10-lab.yml]\n"
        # the roles as site.yml lists them, for their defaults only (site.yml's checks run in its
        # pre_tasks, where the play's roles' defaults are already loaded)
        "  roles:\n" + "".join(f"    - {{role: {role}, when: false}}\n" for role in ROLES) +
        "  pre_tasks:\n    - ansible.builtin.include_tasks: tasks/validate.yml\n")

    def run(**values):
        return subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", "checks.yml",
                               "-e", json.dumps(values)], cwd=root, capture_output=True, text=True, timeout=300)
    return run


def test_the_lab_inventory_passes(checks):
    result = checks()
    assert result.returncode == 0 and "failed=0" in result.stdout, result.stdout[-3000:]


@pytest.mark.parametrize("values, message", [
    (dict(sglang_engine_env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}), "names must be environment"),
    (dict(sglang_engine_env={"HF TOKEN": "x"}), "names must be environment"),
    (dict(sglang_engine_env={"HF_TOKEN": "x\nSGLANG_MEM_FRACTION_STATIC=0.99"}), "values one line each"),
    (dict(sglang_restart_delay_s=-1), "the stop grace and the restart delay not negative"),
    (dict(sglang_start_limit_burst=0), "the burst and its interval must be positive"),
    (dict(sglang_start_timeout_s=900, sglang_restart_delay_s=10, sglang_stop_grace_s=60,
          sglang_start_limit_interval_s=3600), "shorter than sglang_start_limit_burst=5 failed starts of 970 s each"),
    (dict(sglang_mem_fraction_static=1.2), "is out of range"),
    (dict(sglang_extra_args=["--mem-fraction-static", "0.97"]), "sglang_extra_args has --mem-fraction-static"),
    (dict(sglang_extra_args=["--enable-torch-compile", "--mem-frac=0.97"]),
     "sglang_extra_args has --mem-frac, which is (or abbreviates) --mem-fraction-static"),
    (dict(sglang_extra_args=["--api-key", "sk-1"]), "sglang_extra_args has --api-key"),
    (dict(engine_image_context_extras=[{"src": "/tmp", "dest": ".."}]), "must be one folder name"),
], ids=["tuned-name", "bad-name", "newline", "negative-delay", "zero-burst", "start-limit-window", "fraction",
        "extra-tuned-flag",
        "extra-abbreviated", "extra-api-key", "context-outside"])
def test_a_bad_value_stops_the_play_with_what_to_do(checks, values, message):
    result = checks(**values)
    assert result.returncode != 0 and "failed=1" in result.stdout
    assert message in " ".join(result.stdout.split()), result.stdout[-3000:]


# systemd's EnvironmentFile= parser changes such values: "C:\\x\\" joins the next line (the next
# variable) to it, backslashes and surrounding quotes vanish, a YAML true arrives as "True".
@pytest.mark.parametrize("value", ["/data\\", "a\\nb", '"quoted"', "it's", " x", "x ", "x\t", True, 1.10, None],
                         ids=["trailing-backslash", "backslash", "double-quotes", "single-quote", "leading-space",
                              "trailing-space", "trailing-tab", "bool", "float", "null"])
def test_an_engine_env_value_systemd_would_change_stops_the_play(checks, value):
    result = checks(sglang_engine_env={"DFLASH_VERIFY_KERNEL": "1", "HF_HOME": value})
    out = " ".join(result.stdout.split())
    assert result.returncode != 0 and "failed=1" in out, result.stdout[-3000:]
    assert 'sglang_engine_env HF_HOME: each value must be a string or an integer (quote it in YAML: "true", ' \
           '"1.10")' in out, \
        result.stdout[-3000:]


def test_engine_env_values_systemd_keeps_as_they_are_pass(checks):
    result = checks(sglang_engine_env={"A": "1", "B": "a b$c#d:e=f;g", "C": "expandable_segments:True", "D": "",
                                       "NCCL_IB_DISABLE": 1})
    assert result.returncode == 0 and "failed=0" in result.stdout, result.stdout[-3000:]


def test_extra_arguments_the_unit_does_not_set_pass(checks):
    result = checks(sglang_extra_args=["--enable-metrics-for-all-schedulers", "--log-level-http", "warning",
                                       "--json-model-override-args", '{"a": "--port"}'])
    assert result.returncode == 0 and "failed=0" in result.stdout, result.stdout[-3000:]


def test_every_flag_the_unit_gives_the_engine_is_guarded_against_a_second_value():
    """The flags the rendered unit passes are the ones sglang_extra_args may not repeat: a flag
    added to the template and not to the check would be silently overridable."""
    import yaml

    from opsctl import render

    checks = yaml.safe_load((ANSIBLE / "tasks" / "validate.yml").read_text())
    owned = next(task["vars"]["__owned"] for task in checks if "sglang_extra_args" in task.get("name", ""))
    argv = render.engine_argv(sglang_api_key_file="/etc/sglang/api-key.yaml", sglang_enable_metrics=True,
                              sglang_disable_radix_cache=True, sglang_trust_remote_code=True,
                              sglang_speculative_algorithm="DFLASH", sglang_speculative_draft_model_path="/m/d")
    flags = {arg for arg in argv if arg.startswith("--")}
    assert flags and flags <= set(owned), flags - set(owned)


def test_the_engine_image_role_alone_refuses_a_context_folder_outside_its_context(tmp_path):
    """Used without site.yml (whose pre_tasks check every role), the role checks its own inputs
    first: a dest of ".." fails before any task copies or builds."""
    (tmp_path / "roles").symlink_to(ANSIBLE / "roles")
    (tmp_path / "ansible.cfg").symlink_to(ANSIBLE / "ansible.cfg")
    (tmp_path / "alone.yml").write_text(
        "- hosts: localhost\n  gather_facts: false\n  roles:\n    - role: engine_image\n"
        "      engine_image_context_extras: [{src: /tmp, dest: '..'}]\n")
    result = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", "alone.yml"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = " ".join(result.stdout.split())
    assert result.returncode != 0 and "must be one folder name" in out, result.stdout[-3000:]
    assert "changed=0" in out and "Ensure the build context" not in out, result.stdout[-3000:]


# -- --check on a node never provisioned ------------------------------------------------------------
# systemd_service fails on a unit it cannot find even in check mode ("Could not find the requested
# service"), and under --check the tasks before it did not write the unit. SYSTEMD_OFFLINE=1 lets
# systemctl answer where no systemd runs (a container); nothing is changed under --check anyway.
def run_check(root: Path, playbook: str) -> subprocess.CompletedProcess:
    for name in ("roles", "ansible.cfg"):
        (root / name).symlink_to(ANSIBLE / name)
    (root / "check.yml").write_text(playbook)
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", "check.yml", "--check",
                           "-e", json.dumps({"ansible_python_interpreter": sys.executable})],
                          cwd=root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "SYSTEMD_OFFLINE": "1", "ANSIBLE_NOCOLOR": "1"})


@pytest.mark.skipif(Path("/etc/systemd/system/opsctl-guard.service").exists(), reason="this machine has the unit")
def test_check_mode_on_a_node_without_the_guards_unit_says_it_would_start(tmp_path):
    # (with the guard on, the role's "Restart opsctl guard" handler runs too: it failed the same way)
    result = run_check(tmp_path, "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
                                 "    - {ansible.builtin.include_role: {name: opsctl, tasks_from: guard.yml},"
                                 " vars: {opsctl_guard_enabled: true}}\n")
    out = " ".join(result.stdout.split())
    assert result.returncode == 0 and "failed=0" in out, result.stdout[-3000:]
    assert "opsctl-guard.service is not installed yet; it would be installed, started and enabled at boot" in out


@pytest.mark.skipif(Path("/etc/systemd/system/sglang.service").exists(), reason="this machine has the unit")
def test_check_mode_on_a_node_without_the_engine_unit_says_it_would_start(tmp_path):
    """The sglang role's tasks that start and enable the unit (after its health-gated start),
    as they are in the role, under --check with the role's defaults."""
    import yaml

    tasks = yaml.safe_load((ANSIBLE / "roles" / "sglang" / "tasks" / "main.yml").read_text())
    names = [task.get("name") for task in tasks]
    first = names.index("Start or restart the engine, health-gated, under opsctl's engine lock.") + 1
    last = names.index("Ensure the engine unit is started and enabled at boot.")
    (tmp_path / "unit.yml").write_text(yaml.safe_dump(tasks[first:last + 1]))
    result = run_check(tmp_path, "- hosts: localhost\n  gather_facts: false\n"
                                 "  vars_files: [roles/sglang/defaults/main.yml]\n"
                                 "  tasks:\n    - ansible.builtin.include_tasks: unit.yml\n")
    out = " ".join(result.stdout.split())
    assert result.returncode == 0 and "failed=0" in out, result.stdout[-3000:]
    assert "sglang.service is not installed yet; it would be installed, started and enabled at boot" in out
