"""The molecule scenario: create a lab node, converge site.yml, idempotence, testinfra, destroy."""

import pytest


@pytest.mark.molecule
def test_molecule_default_scenario(molecule):
    output = molecule("default")
    # Idempotence ran and found nothing to change; the verifier ran and passed.
    assert "Idempotence completed successfully" in output
    assert " passed" in output and " failed" not in output



@pytest.mark.molecule
def test_molecule_guard_scenario(molecule):
    """The guard scenario: the seed's deployment, idempotence, then drill 1 as the verify step."""
    output = molecule("guard")
    assert "Idempotence completed successfully" in output
