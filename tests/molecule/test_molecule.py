"""Molecule scenarios of one lab node: create it, converge site.yml, idempotence, verify, destroy."""

import re

import pytest


@pytest.mark.molecule
def test_molecule_default_scenario(molecule):
    output = molecule("default")
    # Idempotence ran (a second converge changed nothing) and the testinfra verifier passed.
    assert "default ➜ idempotence: Executed: Successful" in output
    assert "default ➜ verify: Executed: Successful" in output
    # testinfra's own summary ("8 passed"), not Ansible's recap ("failed=0").
    assert re.search(r"\b\d+ passed\b", output) and not re.search(r"\b\d+ failed\b", output)


@pytest.mark.molecule
def test_molecule_guard_scenario(molecule):
    """The guard scenario: the seed's deployment, idempotence, then drill 1 as the verify step."""
    output = molecule("guard")
    assert "guard ➜ idempotence: Executed: Successful" in output
    assert "guard ➜ verify: Executed: Successful" in output
