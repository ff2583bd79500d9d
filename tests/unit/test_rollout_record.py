"""site.yml's handling of the values a rollout recorded on a node (rollout's keep_record.yml),
run on this machine against a record file in a temporary folder."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ANSIBLE = Path(__file__).resolve().parents[2] / "ansible"
BIN = Path(sys.executable).parent
INVENTORY = {"sglang_mem_fraction_static": 0.92, "sglang_chunked_prefill_size": 4096,
             "sglang_expandable_segments": True, "sglang_image": "dflash/sglang:0.5.23"}


@pytest.fixture
def keep_record(tmp_path):
    (tmp_path / "play.yml").write_text(
        # (the inventory's values as play vars: extra vars would outrank the set_fact that keeps a record's)
        f"- hosts: localhost\n  gather_facts: false\n  vars: {json.dumps(INVENTORY)}\n  tasks:\n"
        f"    - ansible.builtin.include_tasks: {ANSIBLE}/roles/rollout/tasks/keep_record.yml\n"
        "    - ansible.builtin.copy:\n        dest: rendered.json\n        content: \"{{ {'fraction': sglang_mem_fraction_static"
        " | float, 'chunk': sglang_chunked_prefill_size | int} | to_json }}\"\n")
    record = tmp_path / "rollout.json"

    def run(values: dict, policy: str = "keep") -> dict:
        record.write_text(json.dumps({"values": values, "rollout": "fraction-0.92"}))
        result = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", "play.yml",
                                 "-e", json.dumps({"rollout_record_file": str(record), "ansible_python_interpreter": sys.executable,
                                                   "rollout_record_policy": policy})],
                                cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout[-3000:]
        rendered = json.loads((tmp_path / "rendered.json").read_text())
        return {"rendered": rendered, "record": json.loads(record.read_text())["values"] if record.exists() else None}
    return run


def test_a_recorded_value_the_inventory_now_holds_is_forgotten(keep_record):
    """The operator put a rollout's 0.92 into the inventory, as the message asks: the record kept
    it, and months later the inventory's 0.93 lost to it, silently."""
    after = keep_record({"sglang_mem_fraction_static": 0.92, "sglang_chunked_prefill_size": 2048})
    assert after["record"] == {"sglang_chunked_prefill_size": 2048}  # still differs: kept, and rendered
    assert after["rendered"] == {"fraction": 0.92, "chunk": 2048}


def test_the_record_goes_once_the_inventory_holds_all_of_it(keep_record):
    after = keep_record({"sglang_mem_fraction_static": 0.92})
    assert after["record"] is None and after["rendered"] == {"fraction": 0.92, "chunk": 4096}


def test_a_value_that_still_differs_stays_in_force(keep_record):
    after = keep_record({"sglang_mem_fraction_static": 0.91})
    assert after["record"] == {"sglang_mem_fraction_static": 0.91}
    assert after["rendered"] == {"fraction": 0.91, "chunk": 4096}
