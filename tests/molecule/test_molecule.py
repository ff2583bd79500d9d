"""Molecule scenarios of one lab node: create it, converge site.yml, idempotence, verify, destroy."""

import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.molecule
def test_molecule_default_scenario(molecule):
    output = molecule("default")
    # Idempotence ran (a second converge changed nothing) and the testinfra verifier passed.
    assert "default ➜ idempotence: Executed: Successful" in output
    assert "default ➜ verify: Executed: Successful" in output
    # testinfra's own summary, not Ansible's recap ("failed=0"): every test of the verifier ran and
    # passed (none parametrized, so one a function), none was left uncollected
    verifier = (REPO_ROOT / "molecule" / "default" / "tests" / "test_default.py").read_text()
    count = len(re.findall(r"^def test_", verifier, re.MULTILINE))
    assert "parametrize" not in verifier, "count the verifier's parametrized cases too"
    assert re.search(rf"\b{count} passed\b", output) and not re.search(r"\b\d+ failed\b", output)


@pytest.mark.molecule
def test_molecule_guard_scenario(molecule):
    """The guard scenario: the seed's deployment, idempotence, then drill 1 as the verify step."""
    output = molecule("guard")
    assert "guard ➜ idempotence: Executed: Successful" in output
    assert "guard ➜ verify: Executed: Successful" in output
