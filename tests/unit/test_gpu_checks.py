"""The gpu_host role's container runtime check, run on this machine against stand-in commands."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ANSIBLE = Path(__file__).resolve().parents[2] / "ansible"
BIN = Path(sys.executable).parent


def run_runtime_check(tmp_path: Path, runtimes: dict, hook: bool) -> subprocess.CompletedProcess:
    """roles/gpu_host/tasks/container_runtime.yml with nvidia-ctk, docker (whose `info` lists
    `runtimes`) and, if `hook`, nvidia-container-runtime-hook as the only such commands on PATH."""
    fake = tmp_path / "bin"
    fake.mkdir()
    scripts = {"nvidia-ctk": "echo 'NVIDIA Container Toolkit CLI version 1.17.8'",
               "docker": f"echo '{json.dumps(runtimes)}'"}
    if hook:
        scripts["nvidia-container-runtime-hook"] = "exit 0"
    for name, body in scripts.items():
        (fake / name).write_text(f"#!/bin/sh\n{body}\n")
        (fake / name).chmod(0o755)
    (tmp_path / "roles").symlink_to(ANSIBLE / "roles")
    (tmp_path / "ansible.cfg").symlink_to(ANSIBLE / "ansible.cfg")
    (tmp_path / "check.yml").write_text("- hosts: localhost\n  gather_facts: false\n  tasks:\n"
                                        "    - {ansible.builtin.include_role: {name: gpu_host, "
                                        "tasks_from: container_runtime.yml}}\n")
    path = f"{fake}:{BIN}:/usr/bin:/bin"
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", "check.yml",
                           "-e", json.dumps({"ansible_python_interpreter": sys.executable})],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PATH": path, "ANSIBLE_NOCOLOR": "1"})


@pytest.mark.skipif(Path("/usr/bin/nvidia-container-runtime-hook").exists(), reason="this machine has the hook")
@pytest.mark.parametrize("runtimes, hook, ok", [
    ({"runc": {}}, True, True),  # the toolkit installed, `nvidia-ctk runtime configure` never run
    ({"runc": {}, "nvidia": {"path": "nvidia-container-runtime"}}, False, True),
    ({"runc": {}}, False, False),
], ids=["hook-only", "registered-runtime", "neither"])
def test_a_node_whose_docker_can_run_gpus_passes(tmp_path, runtimes, hook, ok):
    """`docker run --gpus` (the unit's) uses the toolkit's hook from PATH: a node without a
    registered "nvidia" runtime failed the check though its GPU containers run."""
    result = run_runtime_check(tmp_path, runtimes, hook)
    out = " ".join(result.stdout.split())
    assert (result.returncode == 0) is ok, result.stdout[-3000:]
    assert ("no nvidia-container-runtime-hook on PATH" in out) is not ok, result.stdout[-3000:]
