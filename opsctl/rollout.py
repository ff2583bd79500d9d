"""Fleet rollouts: run ansible/rollout.yml and read back what it did to each node.

Ansible is the engine: the playbook changes one batch of nodes at a time and writes one result per
node on the controller (`<state dir>/<name>/hosts/<node>.json`, after `plan.json` that lists the
nodes in order). This module builds the ansible-playbook command, follows its JSON-lines output for
progress (the `ansible.posix.jsonl` callback) and turns plan + results into a summary that says,
for every node, whether it is on the new values, was rolled back, or was not reached.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
import statistics
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

# Exit codes of `opsctl rollout`.
EXIT_DONE, EXIT_STOPPED, EXIT_USAGE, EXIT_DOWN = 0, 1, 2, 3

# A node's status in the summary: the playbook's statuses plus the two the summary infers.
FINISHED = ("done", "unchanged")
NOT_REACHED = "not reached"
# A node that became unreachable during its change: Ansible runs neither its rescue (rollback) nor
# its always (result), so it may hold new files, a stopped engine, a paused guard.
LOST = "lost mid-change"
DONE_EARLIER = "done earlier"


@dataclasses.dataclass(frozen=True)
class Change:
    """The values to roll out; None keeps a node's current value."""

    fraction: float | None = None
    chunked_prefill_size: int | None = None
    expandable_segments: bool | None = None
    image: str | None = None

    def _given(self, prefix: str) -> dict:
        values = {"mem_fraction_static": self.fraction, "chunked_prefill_size": self.chunked_prefill_size,
                  "expandable_segments": self.expandable_segments, "image": self.image}
        return {f"{prefix}_{name}": value for name, value in values.items() if value is not None}

    def extra_vars(self) -> dict:
        return self._given("rollout")

    def requested(self) -> dict:
        """The change as the playbook records it in plan.json (`__rollout_requested`)."""
        return self._given("sglang")

    def slug(self) -> str:
        """A file-safe name for the change, e.g. `fraction-0.93_chunk-2048`."""
        parts = []
        if self.fraction is not None:
            parts.append(f"fraction-{self.fraction:g}")
        if self.chunked_prefill_size is not None:
            parts.append(f"chunk-{self.chunked_prefill_size}")
        if self.expandable_segments is not None:
            parts.append("expandable-" + ("on" if self.expandable_segments else "off"))
        if self.image:
            parts.append("image-" + re.sub(r"[^A-Za-z0-9.-]+", "_", self.image))
        return "_".join(parts) or "inventory-values"


def ansible_dir() -> Path:
    """The folder holding rollout.yml: $OPSCTL_ANSIBLE_DIR, else the checkout's ansible/."""
    configured = os.environ.get("OPSCTL_ANSIBLE_DIR")
    return Path(configured) if configured else Path(__file__).resolve().parents[1] / "ansible"


def default_state_dir(inventory: Path) -> Path:
    """`.rollout/<inventory name>` next to the inventory (what the playbook uses by default too)."""
    folder = inventory if inventory.is_dir() else inventory.parent
    return folder.resolve().parent / ".rollout" / folder.name


def playbook_command(*, inventory: Path, limit: str | None, change: Change, name: str, state_dir: Path,
                     batch: int, check: bool, resume: bool, playbook_dir: Path) -> list[str]:
    """The ansible-playbook argv (the ansible-playbook of the Python environment opsctl runs in)."""
    extra = {**change.extra_vars(), "rollout_name": name, "rollout_state_dir": str(state_dir),
             "rollout_batch": batch, "rollout_resume": resume}
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory),
            str(playbook_dir / "rollout.yml"), "-e", json.dumps(extra, sort_keys=True)]
    if limit:
        argv += ["-l", limit]
    if check:
        argv += ["--check", "--diff"]
    return argv


def playbook_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for ansible-playbook: JSON lines on stdout, no colour, the repo's ansible.cfg."""
    env = dict(os.environ if base is None else base)
    env.update({"ANSIBLE_STDOUT_CALLBACK": "ansible.posix.jsonl", "ANSIBLE_NOCOLOR": "1",
                "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_RETRY_FILES_ENABLED": "0",
                "PYTHONWARNINGS": "ignore::DeprecationWarning"})
    return env


# -- progress ---------------------------------------------------------------------------------------
# The rollout role names its tasks "Step: what it does"; the jsonl callback puts the role in front.
_ROLE_PREFIX = re.compile(r"^[\w.-]+ : ")
_PHASE = re.compile(r"^([A-Z][\w-]*): ")
# The steps before a node's files change: a node unreachable in them was not changed.
PHASES_BEFORE_CHANGE = ("Plan", "Stop", "Resume", "Pre-check")


@dataclasses.dataclass
class TaskEvent:
    """One host's result of one task, from the jsonl callback."""

    host: str
    task: str
    outcome: str  # ok, changed, failed, skipped, unreachable
    message: str
    diffs: list[dict]

    @property
    def name(self) -> str:
        """The task's own name: the callback names a role's task "ROLE : NAME" ("rollout : Drain: wait ...")."""
        return _ROLE_PREFIX.sub("", self.task, count=1)

    @property
    def phase(self) -> str | None:
        """The step of the rollout ("Drain" of "rollout : Drain: wait ..."); None for a task whose
        name starts with no step (the sglang role's tasks that the pre-check includes)."""
        match = _PHASE.match(self.name)
        return match[1] if match else None


def parse_events(lines: Iterator[str]) -> Iterator[TaskEvent]:
    """TaskEvents from ansible.posix.jsonl lines; other lines (warnings) are skipped."""
    outcomes = {"v2_runner_on_ok": "ok", "v2_runner_on_failed": "failed", "v2_runner_on_skipped": "skipped",
                "v2_runner_on_unreachable": "unreachable"}
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        kind = outcomes.get(event.get("_event", ""))
        if not kind:
            continue
        task = event.get("task", {}).get("name", "")
        for host, result in event.get("hosts", {}).items():
            outcome = "changed" if kind == "ok" and result.get("changed") else kind
            if kind == "failed" and result.get("ignore_errors"):
                outcome = "ok"
            diff = result.get("diff") or []
            diffs = diff if isinstance(diff, list) else [diff]
            yield TaskEvent(host, task, outcome, str(result.get("msg", "")), [d for d in diffs if d])


def unified_diff(diff: dict) -> str:
    """A template task's diff (before/after texts) as a unified diff."""
    before, after = diff.get("before", ""), diff.get("after", "")
    if not isinstance(before, str) or not isinstance(after, str) or before == after:
        return ""
    return "".join(difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                        fromfile=str(diff.get("before_header", "before")),
                                        tofile=str(diff.get("after_header", "after"))))


# -- summary ----------------------------------------------------------------------------------------
@dataclasses.dataclass
class NodeSummary:
    host: str
    status: str
    result: dict

    @property
    def engine_start_s(self) -> float | None:
        return (self.result.get("timings") or {}).get("engine_start_s")

    @property
    def overhead_s(self) -> float | None:
        return (self.result.get("timings") or {}).get("overhead_s")

    @property
    def total_s(self) -> float | None:
        return (self.result.get("timings") or {}).get("total_s")


@dataclasses.dataclass
class Summary:
    name: str
    run: str
    nodes: list[NodeSummary]

    def hosts(self, *statuses: str) -> list[str]:
        return [node.host for node in self.nodes if node.status in statuses]

    @property
    def exit_code(self) -> int:
        statuses = {node.status for node in self.nodes}
        if "rollback_failed" in statuses or LOST in statuses:
            return EXIT_DOWN
        if statuses <= {*FINISHED, DONE_EARLIER}:
            return EXIT_DONE
        if "refused" in statuses and statuses <= {"refused", NOT_REACHED, DONE_EARLIER, "unchanged"}:
            return EXIT_USAGE  # refused at a pre-check before this run changed any node
        return EXIT_STOPPED

    @property
    def overheads(self) -> list[float]:
        return [node.overhead_s for node in self.nodes if node.status == "done" and node.overhead_s is not None]

    def to_json(self) -> dict:
        overheads = self.overheads
        return {
            "rollout": self.name, "run": self.run, "exit_code": self.exit_code,
            "done": self.hosts("done", "unchanged", DONE_EARLIER),
            "rolled_back": self.hosts("rolled_back"), "refused": self.hosts("refused"),
            "rollback_failed": self.hosts("rollback_failed"), "not_reached": self.hosts(NOT_REACHED),
            "lost": self.hosts(LOST),
            "overhead_s": {"median": statistics.median(overheads), "max": max(overheads)} if overheads else None,
            # The summary's status wins over the record's ("done earlier" for a node a resumed run skipped).
            "nodes": [{**node.result, "host": node.host, "status": node.status} for node in self.nodes],
        }


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def summarize(run_dir: Path, lost: Iterable[str] = ()) -> Summary | None:
    """Plan + per-node results of the latest run in `run_dir`; None when no plan was written.
    `lost`: the nodes the playbook saw become unreachable; one without a result of this run is
    LOST, not "not reached"."""
    plan = read_json(run_dir / "plan.json")
    if plan is None:
        return None
    nodes = []
    for host in plan.get("hosts", []):
        result = read_json(run_dir / "hosts" / f"{host}.json") or {}
        status = result.get("status", NOT_REACHED)
        if result and result.get("run") != plan.get("run") and status in FINISHED:
            status = DONE_EARLIER
        if host in lost and (not result or result.get("run") != plan.get("run")):
            status = LOST
        nodes.append(NodeSummary(host, status, result))
    return Summary(plan.get("rollout", run_dir.name), plan.get("run", ""), nodes)


def inventory_hint(summary: Summary) -> str:
    """How to make the inventory match the values the finished nodes now run."""
    changed: dict[str, object] = {}
    for node in summary.nodes:
        if node.status == "done":
            for key, value in (node.result.get("requested") or {}).items():
                changed[key] = value
    if not changed:
        return ""
    lines = ", ".join(f"{key}: {json.dumps(value)}" for key, value in sorted(changed.items()))
    return (f"the finished nodes record these values in /etc/sglang/rollout.json and site.yml keeps them; "
            f"to make the inventory match, set {lines} in group_vars/dflash (or host_vars of those nodes)")
