"""The rollout scenario: three lab nodes, a check, a rollout that succeeds, one that stops, its resume,
an image rollout two nodes at a time, a bad image rolled back, and a node with an override refused."""

import re

import pytest


def squash(text: str) -> str:
    """Drop whitespace and molecule's box lines: its log wraps long task names, even at hyphens."""
    return re.sub(r"[\s│]+", "", text)


@pytest.mark.molecule
def test_molecule_rollout_scenario(molecule):
    output = squash(molecule("rollout"))
    # The verifier ran all six rollouts and every assertion passed (a failed one fails the scenario).
    for task in ("Check that the second rollout stopped at dflash-roll-2 and said so.",
                 "Check that the resumed run skipped dflash-roll-1 and finished the other two.",
                 "Check that the image rollout ran in batches of two.",
                 "Check that every node serves 0.93 on the new image.",
                 "Check that the bad image was rolled back as soon as the engine exited.",
                 "Check that the node with an override was refused and left as it was.",
                 "rollout ➜ verify: Executed: Successful"):
        assert squash(task) in output, task
