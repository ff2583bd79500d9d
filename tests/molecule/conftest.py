import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The rollout scenario, the longest, takes about 6 minutes on a 2-core machine.
MOLECULE_TIMEOUT_S = 1500


@pytest.fixture
def molecule():
    """Run `molecule test -s SCENARIO` with the venv's tools on PATH (molecule calls ansible-*)."""

    def run(scenario: str) -> str:
        bin_dir = Path(sys.executable).parent
        env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
        try:
            result = subprocess.run([str(bin_dir / "molecule"), "test", "-s", scenario], cwd=REPO, env=env,
                                    capture_output=True, text=True, check=False, timeout=MOLECULE_TIMEOUT_S)
        except subprocess.TimeoutExpired as hung:  # a hang must not spend CI's budget with nothing shown
            printed = hung.stdout.decode(errors="replace") if isinstance(hung.stdout, bytes) else hung.stdout or ""
            result = subprocess.CompletedProcess(hung.cmd, 124, printed + f"\n[molecule stopped after "
                                                 f"{MOLECULE_TIMEOUT_S} s]", "")
            subprocess.run([str(bin_dir / "molecule"), "destroy", "-s", scenario], cwd=REPO, env=env,
                           capture_output=True, check=False, timeout=300)
        output = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + result.stderr)  # molecule colours its log
        # On failure show the first failed task too, not only the clean-up that follows it.
        first_failure = output.find("fatal: [")
        context = output[max(0, first_failure - 2000):first_failure + 3000] if first_failure >= 0 else ""
        assert result.returncode == 0, context + "\n...\n" + output[-3000:]
        return output

    return run
