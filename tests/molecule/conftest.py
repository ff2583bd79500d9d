import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
# The rollout scenario, the longest, takes about 6 minutes on a 2-core machine.
MOLECULE_TIMEOUT_S = 1500


def _named_volumes(scenario: str) -> list[str]:
    """The named Docker volumes a scenario's platforms mount (not host paths)."""
    config = yaml.safe_load((REPO / "molecule" / scenario / "molecule.yml").read_text())
    names = [volume.split(":", 1)[0] for platform in config["platforms"] for volume in platform.get("volumes", [])]
    return [name for name in names if "/" not in name and "$" not in name]


def _remove_volumes(scenario: str) -> None:
    for name in _named_volumes(scenario):
        subprocess.run(["docker", "volume", "rm", "--force", name], capture_output=True, check=False, timeout=120)


@pytest.fixture
def molecule():
    """Run `molecule test -s SCENARIO` with the venv's tools on PATH (molecule calls ansible-*)."""

    def run(scenario: str) -> str:
        bin_dir = Path(sys.executable).parent
        env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
        # molecule's destroy keeps named volumes: a node's /var/lib/docker from an earlier run
        # would hold last run's images, and its first provisioning would go untested.
        subprocess.run([str(bin_dir / "molecule"), "destroy", "-s", scenario], cwd=REPO, env=env,
                       capture_output=True, check=False, timeout=300)
        _remove_volumes(scenario)
        try:
            result = subprocess.run([str(bin_dir / "molecule"), "test", "-s", scenario], cwd=REPO, env=env,
                                    capture_output=True, text=True, check=False, timeout=MOLECULE_TIMEOUT_S)
        except subprocess.TimeoutExpired as hung:  # a hang must not spend CI's budget with nothing shown
            printed = hung.stdout.decode(errors="replace") if isinstance(hung.stdout, bytes) else hung.stdout or ""
            result = subprocess.CompletedProcess(hung.cmd, 124, printed + f"\n[molecule stopped after "
                                                 f"{MOLECULE_TIMEOUT_S} s]", "")
            subprocess.run([str(bin_dir / "molecule"), "destroy", "-s", scenario], cwd=REPO, env=env,
                           capture_output=True, check=False, timeout=300)
        _remove_volumes(scenario)
        output = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + result.stderr)  # molecule colours its log
        # On failure show the first failed task too, not only the clean-up that follows it.
        first_failure = output.find("fatal: [")
        context = output[max(0, first_failure - 2000):first_failure + 3000] if first_failure >= 0 else ""
        assert result.returncode == 0, context + "\n...\n" + output[-3000:]
        return output

    return run
