import os

import pytest
from labnode import LabNode, docker_available, lab_images_built


@pytest.fixture(scope="session")
def lab_node(tmp_path_factory):
    """A lab node provisioned once per session by ansible/site.yml (lab inventory)."""
    if not docker_available() or not lab_images_built():
        pytest.skip("needs a running Docker engine and the lab images: run scripts/test.sh (or lab/build-images.sh)")
    node = LabNode("dflash-it", tmp_path_factory.mktemp("lab"))
    node.destroy()
    node.create()
    result = node.provision()
    assert result.returncode == 0, result.stdout[-4000:]
    yield node
    if not os.environ.get("KEEP_LAB"):
        node.destroy()


@pytest.fixture(autouse=True)
def _lab_node_left_serving(request):
    """After a test on the shared lab node: no simulator faults, no opsctl overrides, and an
    engine that answers, so that one failed drill does not fail the ones after it too."""
    yield
    if "lab_node" not in request.fixturenames:
        return
    node = request.getfixturevalue("lab_node")
    node.set_faults()
    _, report = node.status()
    overrides = any(line.startswith("SGLANG_") or line.startswith("PYTORCH_")
                    for line in node.file("/etc/sglang/override.env").splitlines())
    if report.get("health", {}).get("ok") and not overrides:
        return
    if node.opsctl("overrides", "clear").returncode != 0 or not node.status()[1].get("health", {}).get("ok"):
        assert node.provision("-e", "sglang_override_policy=clear").returncode == 0, "the lab node could not be reset"
