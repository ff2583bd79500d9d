"""The playbooks' input checks (ansible/tasks/validate.yml), run on this machine against the lab
inventory's values with one value changed: a bad one stops the play before any node is touched."""

import json
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
    (dict(sglang_mem_fraction_static=1.2), "is out of range"),
], ids=["tuned-name", "bad-name", "newline", "negative-delay", "zero-burst", "fraction"])
def test_a_bad_value_stops_the_play_with_what_to_do(checks, values, message):
    result = checks(**values)
    assert result.returncode != 0 and "failed=1" in result.stdout
    assert message in " ".join(result.stdout.split()), result.stdout[-3000:]
