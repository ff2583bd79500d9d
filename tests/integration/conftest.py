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
