"""A lab node for integration tests: create it, provision it with the real playbook, drive it."""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# A first provisioning takes about 2 minutes on a 2-core machine; a hung one must end.
PROVISION_TIMEOUT_S = 900


def docker_available() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True, check=False).returncode == 0


def lab_images_built() -> bool:
    return subprocess.run(["docker", "image", "inspect", "dflash-lab/node:bookworm"],
                          capture_output=True, check=False).returncode == 0


class LabNode:
    def __init__(self, name: str, workdir: Path):
        self.name = name
        self.inventory = workdir / "inventory"

    # -- lifecycle --------------------------------------------------------------------
    def create(self) -> None:
        subprocess.run([str(REPO / "lab" / "node.sh"), "create", self.name], check=True)
        self.inventory.mkdir(parents=True, exist_ok=True)
        (self.inventory / "hosts.yml").write_text(
            f"dflash:\n  hosts:\n    {self.name}:\n      ansible_connection: community.docker.docker\n")
        link = self.inventory / "group_vars"
        if not link.exists():
            link.symlink_to(REPO / "ansible" / "inventories" / "lab" / "group_vars")

    def provision(self, *extra: str, timeout: float = PROVISION_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        """Run ansible/site.yml against this node; returns the finished process (output in stdout).
        A run past `timeout` is stopped and returned as exit 124 with what it printed: a hang must
        not spend CI's whole budget with nothing to show."""
        argv = [str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", str(self.inventory), "site.yml",
                "-l", self.name, *extra]
        try:
            return subprocess.run(argv, cwd=REPO / "ansible", capture_output=True, text=True, check=False,
                                  timeout=timeout)
        except subprocess.TimeoutExpired as hung:
            printed = hung.stdout.decode(errors="replace") if isinstance(hung.stdout, bytes) else hung.stdout or ""
            return subprocess.CompletedProcess(argv, 124, printed + f"\n[ansible-playbook stopped after {timeout:.0f} s]", "")

    def destroy(self) -> None:
        subprocess.run([str(REPO / "lab" / "node.sh"), "destroy", self.name], check=False)

    # -- driving it -------------------------------------------------------------------
    def sh(self, command: str, check: bool = False, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["docker", "exec", self.name, "bash", "-c", command],
                              capture_output=True, text=True, check=check, timeout=timeout)

    def opsctl(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return self.sh("opsctl " + shlex.join(args), timeout=timeout)

    def status(self) -> tuple[int, dict]:
        result = self.opsctl("status", "--json")
        return result.returncode, json.loads(result.stdout)

    def set_faults(self, **faults: object) -> None:
        """Write the simulator's faults file (re-read by the engine every 0.5 s)."""
        self.sh(f"mkdir -p /etc/sglang-sim && echo {shlex.quote(json.dumps(faults))} "
                "> /etc/sglang-sim/faults.json.tmp && mv /etc/sglang-sim/faults.json.tmp /etc/sglang-sim/faults.json",
                check=True)
        time.sleep(1.0)

    def generate(self, tokens: int, offset: int = 1000, max_new_tokens: int = 4, timeout: float = 120) -> dict:
        """POST /generate with `tokens` token ids (the body goes on stdin: 185k ids do not fit an argv)."""
        body = json.dumps({"input_ids": list(range(offset, offset + tokens)),
                           "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True}})
        result = subprocess.run(["docker", "exec", "-i", self.name, "curl", "-s", "-m", str(timeout), "-X", "POST",
                                 "http://127.0.0.1:30000/generate", "-H", "Content-Type: application/json",
                                 "--data-binary", "@-"], input=body, capture_output=True, text=True,
                                timeout=timeout + 10, check=False)
        if result.stdout.strip().startswith("{"):
            return json.loads(result.stdout)
        return {"error": result.stdout or f"curl exit {result.returncode}"}

    def file(self, path: str) -> str:
        return self.sh(f"cat {shlex.quote(path)} 2>/dev/null").stdout

    def wait_for(self, predicate, timeout: float = 60, interval: float = 0.5):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(interval)
        raise AssertionError(f"condition not met within {timeout} s")
