"""`opsctl status`: is it serving, with what config, and what went wrong last.

Exit codes follow the Nagios convention, so monitoring can run it as a check:
0 OK (active, healthy, a real generate answers), 1 WARNING (serving, but an override drifts
from Ansible, the KV pool holds less than the context target, or the unit restarted within the
last hour, or the verify kernel failed its self-check on a GPU at the last start),
2 CRITICAL (not active, unhealthy, or hung: /health answers but a generate does not),
3 UNKNOWN (opsctl could not tell: no systemd, unreadable config).
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from opsctl import journal, oom
from opsctl.config import load_config
from opsctl.engine import look
from opsctl.envfiles import effective_config, read_env
from opsctl.guard.state import summary as guard_summary
from opsctl.output import console, print_json
from opsctl.startup_log import READY_LINE, parse_startups
from opsctl.systemd import unit_state

OK, WARNING, CRITICAL, UNKNOWN = 0, 1, 2, 3
RECENT_RESTART_S = 3600  # a restart by systemd within this is a warning; the count stays in the table
LEVEL_NAMES = {OK: "OK", WARNING: "WARNING", CRITICAL: "CRITICAL", UNKNOWN: "UNKNOWN"}
VERIFY_KERNEL_ENV = "DFLASH_VERIFY_KERNEL"  # the SGLang plugin's switch (kernels/README.md)


def gpu_summary() -> list[dict[str, Any]] | str:
    """GPUs from nvidia-smi (NVML's command-line face), or why there are none."""
    if shutil.which("nvidia-smi") is None:
        return "no GPU (nvidia-smi not found)"
    query = "index,name,memory.used,memory.total,utilization.gpu"
    try:
        result = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                                capture_output=True, text=True, check=False, timeout=5)
    except subprocess.TimeoutExpired:
        return f"nvidia-smi did not answer within 5 s{NVIDIA_SMI_HUNG}"
    if result.returncode != 0:
        return f"nvidia-smi failed: {result.stderr.strip()}"
    gpus = []
    for line in result.stdout.strip().splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) != 5 or not parts[0].isdigit():  # (a name with a comma, a driver's warning line)
            return f"nvidia-smi gave a line status cannot read: {line!r}"
        index, name, used, total, util = parts
        gpus.append({"index": int(index), "name": name, "memory_used_mib": _number(used),
                     "memory_total_mib": _number(total), "utilization_pct": _number(util)})
    return gpus


# a hung nvidia-smi is the classic sign of a GPU that fell off the bus or an Xid fault
NVIDIA_SMI_HUNG = " (a GPU or driver fault? see dmesg for Xid errors)"


def _number(field: str) -> float | None:
    """A number from nvidia-smi's CSV, or None for "[N/A]" / "[Not Supported]" (MIG, some boards)."""
    try:
        return float(field)
    except ValueError:
        return None


def unknown_report(why: str) -> dict[str, Any]:
    """What status says when it cannot look at all (an unreadable config): UNKNOWN, and why."""
    return {"level": LEVEL_NAMES[UNKNOWN], "exit_code": UNKNOWN, "problems": [why]}


# SGLang answers /health and /health_generate between forward passes: a long prefill chunk (about
# 14 s for 4,096 tokens near 185k of context) holds them. A batch logged within this window, with
# requests running, is a busy engine, not a hung one.
BUSY_WINDOW_S = 60.0
# The journal's part of the check: a monitoring system gives a check about 10 s.
JOURNAL_TIMEOUT_S = 5.0


_NEW_TOKENS = re.compile(r"#new-token: (\d+)")


def last_batch(lines: list[str], now: float) -> tuple[str, float, int | None] | None:
    """The scheduler's last batch line of work for clients in `lines` (short-iso journal): its
    kind ("Prefill" or "Decode"), its age in seconds and its new tokens (a prefill's), or None."""
    for line in reversed(lines):
        if oom.scheduler_working(line) and (match := oom.BATCH_LINE.search(line)):
            try:
                age = now - datetime.fromisoformat(line.split(" ", 1)[0]).timestamp()
            except ValueError:
                return None
            tokens = _NEW_TOKENS.search(line)
            return match.group(1), age, int(tokens[1]) if tokens else None
    return None


def chunk_in_use(lines: list[str]) -> int | None:
    """The running engine's --chunked-prefill-size, from its last start in `lines`, or None."""
    for run in reversed(parse_startups(lines)):
        chunk = run.chunked_prefill_size or run.config.chunked_prefill_size
        if chunk:
            return chunk
    return None


def busy_engine(engine, metrics: dict[str, float], lines: list[str], timeout_s: float) -> str | None:
    """Why health probes that timed out belong to a busy engine, or None: then they are what they
    seem. Busy: a batch logged within BUSY_WINDOW_S, and work in it: requests running or waiting,
    or a prefill that goes on. SGLang 0.5.23's gauges do not count a request whose prefill is being
    chunked (it is neither in the running batch nor in the queue), so a lone 185k prefill reads 0
    and 0 for its minutes; SGLang logs each chunk as it ends, so a last line that is a whole chunk
    (the engine's --chunked-prefill-size, `chunk_in_use`; unknown: taken as whole) means more follow. A
    shorter one was a prompt's last chunk: with nothing running after it, an engine that stopped
    answering is hung."""
    failing = [p for p in (engine.health, engine.health_generate) if not p.ok]
    if not failing or any(not (p.error or "").startswith("no answer within") for p in failing):
        return None
    requests = metrics.get("sglang:num_running_reqs", 0.0) + metrics.get("sglang:num_queue_reqs", 0.0)
    batch = last_batch(lines, time.time())
    if batch is None or batch[1] > BUSY_WINDOW_S:
        return None
    kind, age, new_tokens = batch
    chunk = chunk_in_use(lines) if kind == "Prefill" and requests <= 0 else None  # (its start: read only here)
    prefill_goes_on = kind == "Prefill" and (chunk is None or (chunk > 0 and (new_tokens or 0) >= chunk))
    if requests <= 0 and not prefill_goes_on:
        return None
    work = f"{requests:g} request(s) run" if requests > 0 else "a prefill is in progress"
    return (f"busy: {', '.join(p.url.rsplit('/', 1)[-1] for p in failing)} did not answer within {timeout_s:g} s "
            f"while {work} and the scheduler logged a {kind.lower()} batch {max(age, 0):.0f} s ago "
            "(a long prefill holds SGLang's health answers)")


def collect(timeout_s: float) -> dict[str, Any]:
    """Everything status shows, as one JSON-ready dict with a Nagios level and the reasons."""
    config = load_config()
    started = time.perf_counter()
    problems: list[tuple[int, str]] = []
    try:
        api_key = config.api_key()
    except click.ClickException as error:  # the health probes need no key: still look at the engine
        api_key = None
        problems.append((UNKNOWN, error.message))
    # The slow parts side by side, so the check takes about its slowest part, not their sum.
    with ThreadPoolExecutor(4) as pool:
        unit_future = pool.submit(unit_state, config.unit)
        engine_future = pool.submit(look, config.engine_url, timeout_s, api_key)
        journal_future = pool.submit(journal.tail, config.unit, 5000, JOURNAL_TIMEOUT_S)
        gpus_future = pool.submit(gpu_summary)
    try:
        unit = unit_future.result()
        if unit.load_state == "unknown":  # systemctl gave no properties at all: no systemd to ask
            unit = None
            problems.append((UNKNOWN, f"systemctl gives no state for {config.unit} (is systemd running?)"))
    except (FileNotFoundError, subprocess.TimeoutExpired) as error:
        unit = None
        problems.append((UNKNOWN, f"cannot read the unit's state: {error}"))
    engine = engine_future.result()
    try:
        journal_lines = journal_future.result()
    except subprocess.TimeoutExpired:
        journal_lines = None
        problems.append((UNKNOWN, f"journalctl did not answer within {JOURNAL_TIMEOUT_S:g} s: the last crash is "
                                  "not known"))
    try:
        effective = effective_config(config.env_file, config.override_env_file)
    except (click.ClickException, OSError, UnicodeDecodeError) as error:  # the engine's health still counts
        effective = None
        problems.append((UNKNOWN, f"the env files cannot be read: {getattr(error, 'message', error)}"))

    if unit is not None:
        if unit.load_state == "not-found":
            problems.append((CRITICAL, f"{config.unit} is not installed"))
        elif unit.active_state != "active":
            problems.append((CRITICAL, f"{config.unit} is {unit.active_state} ({unit.sub_state}, result {unit.result})"))
        elif unit.restarts and (unit.uptime_s or 0) < RECENT_RESTART_S:
            # systemd counts restarts until the next manual start: one from last week, after
            # which the engine has served ever since, is no reason to warn today
            problems.append((WARNING, f"{config.unit} restarted {unit.restarts} time(s) since it was started, "
                                      f"the last {(unit.uptime_s or 0) / 60:.0f} min ago"))
    info = engine.info
    metrics = engine.metric_values
    busy = busy_engine(engine, metrics, journal_lines or [], timeout_s)
    if busy:
        problems.append((OK, busy))
    elif not engine.health.ok:
        problems.append((CRITICAL, f"/health: {engine.health.error}"))
    elif not engine.health_generate.ok:
        problems.append((CRITICAL, f"hung: /health answers but /health_generate does not ({engine.health_generate.error})"))
    for setting in effective.settings() if effective else []:
        if setting.drift:
            problems.append((WARNING, f"{setting.name}={setting.value} is an opsctl override "
                                      f"(Ansible says {setting.ansible_value})"))

    max_tokens = info.get("max_total_num_tokens") or metrics.get("sglang:max_total_num_tokens")
    kv: dict[str, Any] = {"max_total_num_tokens": max_tokens, "context_target": config.context_target}
    if max_tokens:
        kv["share_of_target"] = round(max_tokens / config.context_target, 4)
        if max_tokens < config.context_target:
            problems.append((WARNING, f"KV pool holds {max_tokens:,} tokens, "
                                      f"{kv['share_of_target']:.1%} of the {config.context_target:,} target"))
    if "sglang:token_usage" in metrics:
        kv["token_usage"] = metrics["sglang:token_usage"]

    # The last OOM or crash in the recent journal, with the analysis `opsctl oom` gives.
    incidents = oom.analyze(journal_lines) if journal_lines else []
    # (a full KV pool retracts requests by the thousand under load: it is no crash, and would hide one)
    crashes = [incident for incident in incidents if incident.kind != "kv_pool_full"]
    last = crashes[-1] if crashes else None
    last_incident = None if last is None else {
        "time": last.time, "kind": last.kind, "classification": last.classification,
        "action": last.recommendation.action if last.recommendation else None}

    # The parts below add to what the engine's own probes said; one that breaks is UNKNOWN, and
    # never hides a dead engine's CRITICAL.
    try:
        verify = verify_kernel_summary(config, unit)
    except Exception as error:  # noqa: BLE001
        verify = {"switched_on": None, "checks": [], "problem": None, "error": f"{type(error).__name__}: {error}"}
        problems.append((UNKNOWN, f"the verify kernel's state cannot be read ({type(error).__name__}: {error})"))
    if verify["problem"]:
        problems.append((WARNING, verify["problem"]))

    try:
        guard = guard_summary(config)
    except Exception as error:  # noqa: BLE001 - e.g. not root: the state folder is root's
        guard = {"state": "unknown", "problem": f"the guard's state cannot be read: {error}"}
        problems.append((UNKNOWN, guard["problem"]))
    if guard["problem"] and guard["state"] != "unknown":
        problems.append((WARNING, guard["problem"]))
    try:
        gpus = gpus_future.result()
    except Exception as error:  # noqa: BLE001
        gpus = f"nvidia-smi could not be read ({type(error).__name__}: {error})"
    if isinstance(gpus, str) and gpus.endswith(NVIDIA_SMI_HUNG):
        problems.append((WARNING, gpus))  # the engine's own probes say whether it still serves

    # What is known to be wrong outranks what could not be looked at: an engine seen down is
    # CRITICAL even when, say, the journal did not answer, and a drift seen is a WARNING even when
    # a non-root check cannot read the guard's state.
    levels = {level for level, _ in problems}
    level = next((candidate for candidate in (CRITICAL, WARNING, UNKNOWN) if candidate in levels), OK)
    return {
        "level": LEVEL_NAMES[level],
        "exit_code": level,
        "problems": [text for _, text in problems],
        "unit": dataclasses.asdict(unit) | {"uptime_s": unit.uptime_s} if unit else None,
        "health": dataclasses.asdict(engine.health) | {"body": None},
        "health_generate": dataclasses.asdict(engine.health_generate) | {"body": None},
        "engine": {
            "url": config.engine_url,
            "version": info.get("version"),
            "model": info.get("served_model_name") or info.get("model_path"),
            "tp_size": info.get("tp_size"),
            "speculative_algorithm": info.get("speculative_algorithm"),
            "running": {"mem_fraction_static": info.get("mem_fraction_static"),
                        "chunked_prefill_size": info.get("chunked_prefill_size")},
        },
        "config": {s.name: dataclasses.asdict(s) | {"drift": s.drift} for s in effective.settings()} if effective else {},
        "kv_pool": kv,
        "gpus": gpus,
        "last_incident": last_incident,
        "verify_kernel": verify,
        "guard": guard,
        "elapsed_ms": round((time.perf_counter() - started) * 1000, 1),
    }


def verify_kernel_summary(config, unit) -> dict[str, Any]:
    """Which verify kernel the engine runs: the switch in the env files, and the plugin's
    self-check of each server process in the current run's start (a failed check means SGLang's
    own, slower verify path serves on that GPU)."""
    env = read_env(config.env_file) | read_env(config.override_env_file)
    switched_on = env.get(VERIFY_KERNEL_ENV, "0").strip().lower() in ("1", "true", "yes", "on")
    summary: dict[str, Any] = {"switched_on": switched_on, "checks": [], "problem": None}
    if not switched_on or unit is None or not unit.invocation:
        return summary
    try:
        start_lines = journal.run_start(unit.invocation, until=READY_LINE)
    except OSError:
        start_lines = []
    starts = parse_startups(start_lines)
    # one verdict a GPU process (a process checks once for each model it builds a backend for):
    # failed if any of its checks failed
    by_rank: dict = {}
    for check in starts[-1].kernel_checks if starts else []:
        if check.tp_rank not in by_rank or not check.passed:
            by_rank[check.tp_rank] = check
    checks = list(by_rank.values())
    summary["checks"] = [dataclasses.asdict(check) for check in checks]
    failed = [check for check in checks if not check.passed]
    if failed:
        ranks = ", ".join(f"TP{check.tp_rank}" if check.tp_rank is not None else "?" for check in failed)
        summary["problem"] = (f"the verify kernel failed its self-check on {len(failed)} of {len(checks)} GPU process(es) "
                              f"({ranks}: {failed[0].detail or 'see the journal'}); SGLang's own, slower verify path "
                              f"serves there. `journalctl -u {config.unit} | grep self-check` has the details")
    return summary


def _fmt_verify_kernel(verify: dict[str, Any]) -> str:
    if verify.get("error"):
        return f"not known ({escape(str(verify['error']))})"
    if not verify["switched_on"]:
        return f"SGLang's own ({VERIFY_KERNEL_ENV} is off)"
    checks = verify["checks"]
    if not checks:
        return (f"{VERIFY_KERNEL_ENV} is on; no self-check in this run's start (not started yet, "
                "DFLASH_VERIFY_SELFCHECK=0, or a backend other than SGLang's Triton backend)")
    passed = [check for check in checks if check["passed"]]
    text = f"dflash kernel on {len(passed)} of {len(checks)} GPU process(es)"
    if passed:
        note = f"; {passed[0]['detail']}" if passed[0]["detail"] else ""  # (kernels compiled at the start)
        text += escape(f" ({passed[0]['kernel']} on {passed[0]['device']}, self-check passed{note})")
    if len(passed) < len(checks):
        text += f", [red]SGLang's own on {len(checks) - len(passed)} (self-check failed)[/red]"
    return text


def _fmt_probe(probe: dict[str, Any]) -> str:
    if probe["ok"]:
        return f"[green]200[/green] in {probe['latency_ms']:.0f} ms"
    return f"[red]{escape(str(probe['error']))}[/red]"


def _fmt_uptime(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s"


def _mib(value: float | None) -> str:
    return "?" if value is None else f"{value:.0f}"


def render_human(report: dict[str, Any]) -> None:
    colour = {"OK": "green", "WARNING": "yellow", "CRITICAL": "red", "UNKNOWN": "magenta"}[report["level"]]
    # (escape: problems, the engine's answers and the env files carry text rich would take for markup)
    console.print(f"[bold {colour}]{report['level']}[/bold {colour}]"
                  + (": " + escape("; ".join(report["problems"])) if report["problems"] else ""), soft_wrap=True)
    if "unit" not in report:  # UNKNOWN before anything could be looked at
        return
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    unit = report["unit"]
    if unit:
        table.add_row("unit", f"{unit['name']} {unit['active_state']} ({unit['sub_state']}), "
                              f"up {_fmt_uptime(unit['uptime_s'])}, {unit['restarts']} restart(s)")
    table.add_row("health", _fmt_probe(report["health"]))
    table.add_row("generate", _fmt_probe(report["health_generate"]))
    engine = report["engine"]
    table.add_row("engine", escape(f"SGLang {engine['version'] or '?'} at {engine['url']}: {engine['model'] or '?'}, "
                                   f"TP{engine['tp_size'] or '?'}, speculative {engine['speculative_algorithm'] or 'off'}"))
    for name, setting in report["config"].items():
        note = f" [yellow](Ansible: {escape(str(setting['ansible_value']))})[/yellow]" if setting["drift"] else ""
        running = engine["running"].get(name)
        live = f", engine runs {running}" if running is not None and str(running) != str(setting["value"]) else ""
        table.add_row(name, f"{escape(str(setting['value']))} from {escape(str(setting['source']))}{note}{escape(live)}")
    kv = report["kv_pool"]
    if kv.get("max_total_num_tokens"):
        usage = f", {kv['token_usage']:.0%} in use" if "token_usage" in kv else ""
        table.add_row("kv pool", f"{kv['max_total_num_tokens']:,} tokens = {kv['share_of_target']:.1%} "
                                 f"of {kv['context_target']:,}{usage}")
    table.add_row("verify kernel", _fmt_verify_kernel(report["verify_kernel"]))
    guard = report["guard"]
    table.add_row("guard", escape(guard["state"] + (f": {guard['problem']}" if guard["problem"] else "")))
    gpus = report["gpus"]
    table.add_row("gpus", gpus if isinstance(gpus, str) else
                  ", ".join(f"{g['index']}: {_mib(g['memory_used_mib'])}/{_mib(g['memory_total_mib'])} MiB" for g in gpus))
    last = report["last_incident"]
    table.add_row("last crash", "none in the recent journal" if last is None else
                  escape(f"{last['time']}: {last['kind']} ({last['classification']})"
                         + (f" -> {last['action']}" if last["action"] else "")))
    console.print(table)


class NagiosCommand(click.Command):
    """A check's own usage errors (a mistyped option in a monitoring config) exit UNKNOWN (3), as
    the Nagios plugin guidelines ask, not click's 2, which a monitor reads as CRITICAL (status) or
    stopped (guard status): nothing was looked at."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as error:
            error.exit_code = UNKNOWN
            raise


@click.command(cls=NagiosCommand)
@click.option("--json", "json_", is_flag=True, help="Print one JSON document instead of the table.")
@click.option("--timeout", "timeout_s", default=2.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Seconds each HTTP probe may take; a hung engine is reported after this.")
def status(json_: bool, timeout_s: float) -> None:
    """Show the engine's state, health, config and KV pool (Nagios exit codes: 0 OK .. 3 UNKNOWN)."""
    try:
        report = collect(timeout_s)
    except (click.ClickException, OSError) as error:  # an unreadable config: UNKNOWN, not 1
        report = unknown_report(str(error))
    except Exception as error:  # noqa: BLE001 - a check that breaks is UNKNOWN, never WARNING (exit 1)
        report = unknown_report(f"the check itself failed ({type(error).__name__}: {error})")
    if json_:
        print_json(report)
    else:
        render_human(report)
    raise SystemExit(report["exit_code"])
