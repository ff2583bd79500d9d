"""`opsctl rollout`: roll a change through the fleet with ansible/rollout.yml, node by node.

A thin front end: it runs ansible-playbook (from opsctl's own environment), shows each node's
progress, and prints a per-node summary. Exit codes: 0 every node is on the change; 1 the rollout
stopped at a node that was rolled back (or refused at its pre-check) and is healthy on its previous
values; 2 usage errors, or the playbook refused the change before touching any node;
3 a rollback failed too: that node's engine is down, act now.
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
from rich.table import Table

from opsctl import rollout as ro
from opsctl.output import console, err_console, print_json
from opsctl.restart import Terminated, signals_deferred, terminations_unwind


def _fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _values(values: dict | None) -> str:
    if not values:
        return "-"
    short = {"sglang_mem_fraction_static": "fraction", "sglang_chunked_prefill_size": "chunk",
             "sglang_expandable_segments": "expandable", "sglang_image": "image"}
    return " ".join(f"{short.get(key, key)}={value}" for key, value in values.items())


def _render_summary(summary: ro.Summary) -> None:
    table = Table(title=f"rollout {summary.name}")
    for column in ("node", "status", "now runs", "engine start", "overhead", "total", "note"):
        table.add_column(column)
    for node in summary.nodes:
        result = node.result
        runs = result.get("to") if node.status in (*ro.FINISHED, ro.DONE_EARLIER) else result.get("from")
        note = result.get("reason", "") if node.status not in ro.FINISHED else ""
        table.add_row(node.host, node.status, _values(runs), _fmt_s(node.engine_start_s), _fmt_s(node.overhead_s),
                      _fmt_s(node.total_s), note[:160])
    console.print(table)
    data = summary.to_json()
    console.print(f"done: {', '.join(data['done']) or 'none'}; "
                  f"rolled back: {', '.join(data['rolled_back']) or 'none'}; "
                  f"refused: {', '.join(data['refused']) or 'none'}; not reached: "
                  f"{', '.join(data['not_reached']) or 'none'}"
                  + (f"; ROLLBACK FAILED (engine down): {', '.join(data['rollback_failed'])}"
                     if data["rollback_failed"] else ""))
    if data["overhead_s"]:
        console.print(f"time a rollout adds per node beyond the engine's own start: median "
                      f"{data['overhead_s']['median']:.1f} s, max {data['overhead_s']['max']:.1f} s")


def _follow(process: subprocess.Popen, log, lost: set[str]) -> dict[str, list[str]]:
    """Show each node's phase as it changes; collect --check diffs per node, and in `lost` the
    nodes that became unreachable."""
    diffs: dict[str, list[str]] = {}
    phases: dict[str, str] = {}
    started = time.monotonic()

    def lines():
        for line in process.stdout:
            log.write(line)
            yield line

    for event in ro.parse_events(lines()):
        if event.host == "localhost":
            continue
        for diff in event.diffs:
            text = ro.unified_diff(diff)
            if text:
                diffs.setdefault(event.host, []).append(text)
        if event.outcome == "skipped":
            continue
        # a task named without a step (the sglang role's, in the pre-check) is part of the host's current one
        phase = event.phase or phases.get(event.host, "")
        if event.outcome == "unreachable" and phase not in ro.PHASES_BEFORE_CHANGE:
            lost.add(event.host)  # (unreachable at its pre-check, nothing had changed on it)
        if event.outcome in ("failed", "unreachable"):
            err_console.print(f"  {event.host}: [red]{event.name}[/red] {event.message[:400]}", soft_wrap=True)
        elif phase and phases.get(event.host) != phase:
            phases[event.host] = phase
            err_console.print(f"  {event.host}: {phase} (+{time.monotonic() - started:.0f} s)")
    return diffs


def _interrupted(process: subprocess.Popen, name: str, run_dir: Path, stop: BaseException) -> None:
    """Ctrl-C (which reached ansible-playbook too) or SIGTERM/SIGHUP: stop the playbook, say what
    may be half done, exit 3. Ansible's rescue does not run on an interrupt, so a node in the
    middle of its change keeps whatever it had reached."""
    process.send_signal(signal.SIGINT)
    try:
        # (a second Ctrl-C here must not end opsctl with click's "Aborted!" and exit 1, which
        # reads as "rolled back": the playbook is killed, and the message and exit 3 follow)
        with terminations_unwind(), signals_deferred(swallow=True):
            process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    summary = ro.summarize(run_dir)
    unrecorded = [node.host for node in summary.nodes if not node.result] if summary else []
    err_console.print(
        f"rollout {name} interrupted ({type(stop).__name__} {stop}). A node that was being changed may hold new "
        f"files under an engine that runs the old ones: check {', '.join(unrecorded) or 'the nodes'} with "
        f"`opsctl status`. Its next run stops at such a node and names the copies of its previous files.",
        soft_wrap=True)
    sys.exit(ro.EXIT_DOWN)


@click.command("rollout")
@click.option("--fraction", type=click.FloatRange(0, 1, min_open=True, max_open=True),
              help="New --mem-fraction-static, strictly between 0 and 1.")
@click.option("--chunked-prefill-size", "chunk", type=int, help="New prefill chunk in tokens (-1: no chunking).")
@click.option("--expandable-segments/--no-expandable-segments", default=None,
              help="Set or unset PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.")
@click.option("--image", help="New engine image (repository:tag), already present on the nodes.")
@click.option("-i", "--inventory", type=click.Path(exists=True, path_type=Path), envvar="OPSCTL_INVENTORY", show_envvar=True,
              help="Ansible inventory [default: the production inventory].")
@click.option("-l", "--limit", default="dflash", show_default=True, help="Nodes (an Ansible host pattern).")
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True,
              help="Nodes changed at a time (with no spare GPUs, each is capacity out).")
@click.option("--name", help="Name of the rollout (its records) [default: derived from the change].")
@click.option("--state", "state_dir", type=click.Path(file_okay=False, path_type=Path), envvar="OPSCTL_ROLLOUT_STATE", show_envvar=True,
              help="Folder of rollout records [default: .rollout/<inventory> next to the inventory].")
@click.option("--check", is_flag=True, help="Change nothing: show what would change on each node (diffs).")
@click.option("--resume", is_flag=True, help="Skip the nodes an earlier run of this rollout finished.")
@click.option("--json", "json_", is_flag=True, help="Print the summary as JSON.")
def rollout(fraction, chunk, expandable_segments, image, inventory, limit, batch, name, state_dir, check, resume,
            json_) -> None:
    """Roll a change of the tuned values or the image through the nodes, one batch at a time.

    Per node: pre-check health, drain running requests (bounded), apply, restart health-gated,
    verify /server_info and smoke /generate. A node that fails is rolled back and the rollout
    stops there. Exit 0 all done, 1 stopped with a rollback, 2 usage or refused before any node
    changed (a failed --check too), 3 a rollback failed, a node became unreachable during its
    change, or the run was interrupted.
    """
    if chunk is not None and chunk != -1 and chunk <= 0:
        raise click.BadParameter("use a positive token count or -1 (no chunking)", param_hint="--chunked-prefill-size")
    if check and resume:
        raise click.UsageError("--check shows a whole rollout; leave out --resume")
    playbook_dir = ro.ansible_dir()
    if not (playbook_dir / "rollout.yml").is_file():
        error = click.ClickException(f"{playbook_dir / 'rollout.yml'} not found: run opsctl from the checkout "
                                     "or set OPSCTL_ANSIBLE_DIR to its ansible/ folder")
        error.exit_code = ro.EXIT_USAGE
        raise error
    inventory = inventory or playbook_dir / "inventories" / "production"
    change = ro.Change(fraction, chunk, expandable_segments, image)
    name = name or change.slug()
    state_dir = (state_dir or ro.default_state_dir(Path(inventory))).resolve()
    run_dir = state_dir / name
    if resume and not (run_dir / "plan.json").is_file():
        raise click.UsageError(f"no rollout named {name} to resume under {state_dir} (give the same change or --name)")
    if resume and (started := (ro.read_json(run_dir / "plan.json") or {}).get("requested")) is not None \
            and started != change.requested():
        # (the nodes it finished run the change it was started with: resuming another would skip them)
        raise click.UsageError(f"rollout {name} was started with {started}, not {change.requested()}: resume it with "
                               "the same change, or give this one another --name")

    argv = ro.playbook_command(inventory=Path(inventory).resolve(), limit=limit, change=change, name=name,
                               state_dir=state_dir, batch=batch, check=check, resume=resume,
                               playbook_dir=playbook_dir)
    if not Path(argv[0]).is_file():
        error = click.ClickException(f"{argv[0]} not found: opsctl runs its own environment's ansible-playbook; "
                                     "install opsctl with its dev extra (pip install 'dflash-ops[dev]') there")
        error.exit_code = ro.EXIT_USAGE
        raise error
    values = ", ".join(f"{k}={v}" for k, v in change.extra_vars().items()) or "inventory values"
    err_console.print(f"rollout {name}: {values}"
                      f" on {limit} ({inventory}), {batch} node(s) at a time{' (check only)' if check else ''}")
    run_dir.mkdir(parents=True, exist_ok=True)
    # the plan an earlier run left: if the playbook stops before writing its own, that one must not
    # be read as this run's
    earlier_run = (ro.read_json(run_dir / "plan.json") or {}).get("run")
    log_path = run_dir / ("check.log" if check else "ansible.log")
    # appended: a resumed run keeps the log of the run that failed before it
    with log_path.open("a") as log:
        log.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {'resume' if resume else 'run'}: {shlex.join(argv)}\n")
        log.flush()
        process = subprocess.Popen(argv, cwd=playbook_dir, env=ro.playbook_env(), stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, bufsize=1)
        lost: set[str] = set()
        try:
            with terminations_unwind():
                diffs = _follow(process, log, lost)
                rc = process.wait()
        except (KeyboardInterrupt, Terminated) as stop:
            _interrupted(process, name, run_dir, stop)

    if check:
        if json_:
            print_json({"rollout": name, "check": True, "ansible_rc": rc, "changes": diffs})
        else:
            for host, texts in diffs.items():
                console.print(f"[bold]{host}[/bold]")
                for text in texts:
                    console.print(text, markup=False, highlight=False, end="")
            if not diffs and rc == 0:
                console.print("no node would change")
        if rc != 0:  # nothing was changed: a usage-level failure, not a stopped rollout (1)
            error = click.ClickException(f"the check failed (ansible-playbook exit {rc}); see {log_path}")
            error.exit_code = ro.EXIT_USAGE
            raise error
        return

    summary = ro.summarize(run_dir, lost)
    if summary is None or summary.run == earlier_run or (
            rc != 0 and not any(node.result for node in summary.nodes) and not summary.hosts(ro.LOST)):
        tail = log_path.read_text().splitlines()[-5:]
        err_console.print(f"the playbook stopped before changing any node (ansible-playbook exit {rc}); "
                          f"see {log_path}", soft_wrap=True)
        for line in tail:
            err_console.print(f"  {line[:300]}", markup=False, soft_wrap=True)
        sys.exit(ro.EXIT_USAGE)
    (state_dir / f"{name}.json").write_text(json.dumps(summary.to_json(), indent=2) + "\n")
    if json_:
        print_json(summary.to_json())
    else:
        _render_summary(summary)
    hint = ro.inventory_hint(summary)
    if hint:
        err_console.print(hint, soft_wrap=True)
    exit_code = summary.exit_code
    if rc != 0 and exit_code == ro.EXIT_DONE:  # every node finished, yet the playbook failed after them
        err_console.print(f"ansible-playbook exited {rc} after the nodes finished; see {log_path}", soft_wrap=True)
        exit_code = ro.EXIT_STOPPED
    if summary.hosts(ro.LOST):
        err_console.print(f"[bold red]{', '.join(summary.hosts(ro.LOST))} became unreachable during its change[/bold red]: "
                          "Ansible ran neither its rollback nor its result, so it may hold new files under an engine "
                          "that runs the old ones, or a stopped engine, and a paused guard. Reach it, run "
                          "`opsctl status` there and compare its files with the copies in its rollout backup folder.",
                          soft_wrap=True)
    if exit_code != ro.EXIT_DONE:
        err_console.print(f"fix the cause, then: opsctl rollout ... --name {name} --resume", soft_wrap=True)
    sys.exit(exit_code)
