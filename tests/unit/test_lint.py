"""Static checks that must stay green: ansible-lint (production profile) and ruff."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def test_ansible_lint_production_profile():
    result = subprocess.run([str(BIN / "ansible-lint"), "--profile", "production", "--nocolor", "-f", "pep8"],
                            cwd=REPO / "ansible", capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_playbook_syntax_with_both_inventories():
    for inventory in ("inventories/production", "inventories/lab"):
        result = subprocess.run([str(BIN / "ansible-playbook"), "-i", inventory, "site.yml", "--syntax-check"],
                                cwd=REPO / "ansible", capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stderr


def test_ruff():
    result = subprocess.run([str(BIN / "ruff"), "check", "opsctl", "tests", "images/engine-sim", "kernels"],
                            cwd=REPO, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout[-4000:]
