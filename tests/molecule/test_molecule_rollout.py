"""The rollout scenario: three lab nodes, a check, a rollout that succeeds and one that stops."""

import pytest


@pytest.mark.molecule
def test_molecule_rollout_scenario(molecule):
    output = molecule("rollout")
    # The verifier ran both rollouts and every assertion passed (a failed one fails the scenario).
    assert "Check that the second rollout stopped at dflash-roll-2 and said so." in output
    assert "rollout ➜ verify: Executed: Successful" in output
