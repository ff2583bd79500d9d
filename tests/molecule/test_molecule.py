"""The molecule scenario: create a lab node, converge site.yml, idempotence, testinfra, destroy."""

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.molecule
def test_molecule_default_scenario():
    result = subprocess.run([str(REPO / ".venv" / "bin" / "molecule"), "test", "-s", "default"],
                            cwd=REPO, capture_output=True, text=True, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    # Idempotence ran and found nothing to change; the verifier ran and passed.
    assert "Idempotence completed successfully" in output
    assert " passed" in output and " failed" not in output
