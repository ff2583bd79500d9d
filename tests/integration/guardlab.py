"""Helpers for the guard's drills and benchmark on a lab node (its own node: the drills break the engine)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from labnode import LabNode

NODE_NAME = "dflash-guard"
AUDIT = "/var/lib/opsctl/guard-audit.jsonl"
HISTORY = "/var/lib/opsctl/history.jsonl"
# The seed's deployment: 0.94, SGLang's default chunk for a 96 GB GPU, no expandable_segments.
SEED_VARS = {"opsctl_guard_enabled": True, "sglang_mem_fraction_static": 0.94,
             "sglang_chunked_prefill_size": 8192, "sglang_expandable_segments": False}
SEED_CONFIG = {"mem_fraction_static": 0.94, "chunked_prefill_size": 8192, "expandable_segments": False}
# The seed's crash sequence in the simulator: 1k, 1k, 8k, 8k, then 32k tokens (all distinct; two full
# 8192-token chunks leave 1.40 GiB fragmented, so the 32k prompt's first chunk no longer fits).
SEED_PROMPTS = (1024, 1024, 8192, 8192, 32768)


def provision(node: LabNode) -> subprocess.CompletedProcess[str]:
    return node.provision("-e", json.dumps(SEED_VARS))


def seed_crash(node: LabNode, base: int = 0) -> list[dict]:
    """Send the seed's prompts; the last one kills a 0.94/8192/no-expandable engine."""
    return [node.generate(tokens, offset=(base + index + 1) * 1_000_000) for index, tokens in enumerate(SEED_PROMPTS)]


def records(node: LabNode, path: str = AUDIT) -> list[dict]:
    return [json.loads(line) for line in node.file(path).splitlines() if line.strip()]


def wait_record(node: LabNode, since: int, predicate, timeout: float = 60, path: str = AUDIT) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for record in records(node, path)[since:]:
            if predicate(record):
                return record
        time.sleep(0.25)
    tail = "\n".join(json.dumps(r)[:300] for r in records(node, path)[since:])
    raise AssertionError(f"no matching audit record within {timeout} s; records since {since}:\n{tail}")


def unit_active(node: LabNode) -> bool:
    return node.sh("systemctl is-active sglang.service").stdout.strip() == "active"


def reset(node: LabNode) -> int:
    """Back to the seed's config, faults off, the guard resumed with a fresh budget; returns the audit offset."""
    node.set_faults()
    node.sh("systemctl reset-failed sglang.service")
    result = node.opsctl("overrides", "clear", "--reason", "drill reset", "--wait-lock", "120", timeout=200)
    assert result.returncode == 0, result.stderr
    node.opsctl("guard", "resume", "--reason", "drill reset")
    node.wait_for(lambda: unit_active(node), timeout=60)
    # The guard settles on the healthy engine (it records the config serving).
    time.sleep(1.5)
    return len(records(node))


def journal_epoch(node: LabNode, needle: str, since_epoch: float) -> float | None:
    """Realtime stamp (epoch, µs precision) of the first sglang journal line containing `needle`."""
    out = node.sh(f"journalctl -u sglang.service -o json --since @{int(since_epoch) - 1} --no-pager").stdout
    for line in out.splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        message = entry.get("MESSAGE")
        if isinstance(message, str) and needle in message and int(entry["__REALTIME_TIMESTAMP"]) / 1e6 >= since_epoch:
            return int(entry["__REALTIME_TIMESTAMP"]) / 1e6
    return None


def node_for_guard(tmp: Path) -> LabNode:
    node = LabNode(NODE_NAME, tmp)
    node.destroy()  # (one an earlier run left, stopped or half provisioned)
    node.create()
    return node
