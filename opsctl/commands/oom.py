"""`opsctl oom`: find OOMs and crashes in an SGLang unit's journal or a saved log.

opsctl oom                                   # journalctl -u sglang.service
opsctl oom --since "2 hours ago" --json
opsctl oom --file node.log --mem-fraction-static 0.94
journalctl -u sglang.service | opsctl oom --file -
"""

from __future__ import annotations

import click
from rich.table import Table

from opsctl import oom as oom_lib
from opsctl.config import load_config
from opsctl.output import console, err_console, print_json
from opsctl.overrides import TunedValues, values_in_force
from opsctl.restart import node_plan_inputs
from opsctl.startup_log import GIB, EngineConfig

EXIT_NONE_FOUND = 0
EXIT_FOUND = 1
EXIT_NOT_READ = 3


def _say(text: str, style: str | None = None) -> None:
    # soft_wrap: long recommendation lines stay whole, so they can be grepped and copied. No
    # markup: the text carries journal excerpts, where "[rank3]:" is no rich tag.
    console.print(text, soft_wrap=True, markup=False, style=style)


def _size(value: int | None) -> str:
    if value is None:
        return "?"
    return f"{value / GIB:.2f} GiB" if value >= GIB else f"{value / (1 << 20):.2f} MiB"


def _read_file(path: str) -> list[str]:
    try:
        with click.open_file(path, "r", encoding="utf-8", errors="replace") as handle:
            return handle.read().splitlines()
    except OSError as exc:
        raise click.BadParameter(f"cannot read {path}: {exc.strerror or exc}", param_hint="--file") from None


def _setting_text(setting: oom_lib.Setting) -> str:
    parts = []
    if setting.fraction is not None:
        parts.append(f"--mem-fraction-static {setting.fraction}")
    if setting.chunk is not None:
        parts.append(f"--chunked-prefill-size {setting.chunk}")
    if setting.expandable_segments:
        parts.append("expandable_segments:True")
    text = " + ".join(parts) or "(see action)"
    if setting.tokens is not None:
        text += f" -> {setting.tokens:,} tokens"
        if setting.safe is not None:
            text += ", spike fits" if setting.safe else ", spike does NOT fit"
    return f"{text}: {setting.why}"


def _print_incident(number: int, incident: oom_lib.Incident) -> None:
    where = " ".join(
        part
        for part in (
            incident.time or "?",
            incident.host or "",
            f"TP{incident.tp_rank}" if incident.tp_rank is not None else "",
            f"GPU {incident.gpu}" if incident.gpu is not None else "",
        )
        if part
    )
    _say(f"#{number} {incident.kind} ({incident.classification}) at {where}", style="bold")
    if incident.kind == "cuda_oom":
        _say(
            f"  tried {_size(incident.tried_bytes)}, free {_size(incident.free_bytes)} of {_size(incident.total_bytes)}, "
            f"in use {_size(incident.in_use_bytes)}, reserved-unallocated {_size(incident.reserved_unallocated_bytes)}"
            + (" (message truncated)" if incident.truncated else "")
        )
        for pid, used in incident.other_processes.items():
            _say(f"  process {pid} holds {_size(used)}")
    elif incident.detail:
        _say(f"  {incident.detail}")
    config = incident.config
    if config is not None:
        _say(
            f"  config: fraction {config.mem_fraction_static}, chunk {config.chunked_prefill_size}, "
            f"expandable_segments {config.expandable_segments}"
        )
    if incident.engine_killed:
        _say("  the engine was torn down after it")
    rec = incident.recommendation
    if rec is not None:
        _say(f"  -> {rec.action}")
        for index, setting in enumerate(rec.settings):
            _say(f"     {'recommend' if index == 0 else 'or'} {_setting_text(setting)}")
        for note in rec.notes:
            _say(f"     note: {note}")


def _summary_table(incidents: list[oom_lib.Incident]) -> Table:
    table = Table(title="OOMs and crashes")
    for column in ("#", "time", "kind", "class", "tried", "free", "total"):
        table.add_column(column)
    for number, incident in enumerate(incidents, 1):
        table.add_row(
            str(number),
            incident.time or "?",
            incident.kind,
            incident.classification,
            _size(incident.tried_bytes),
            _size(incident.free_bytes),
            _size(incident.total_bytes),
        )
    return table


@click.command("oom")
@click.option("--file", "file_", metavar="PATH", help="Read a saved log instead of the journal; - reads stdin.")
@click.option("--unit", envvar="OPSCTL_UNIT", show_envvar=True, help="systemd unit to read [default: the node's engine unit, from its config].")
@click.option("--since", metavar="WHEN", help="journalctl --since (e.g. '2 hours ago', '2026-05-31 10:00').")
@click.option(
    "--mem-fraction-static",
    "fraction",
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    help="Fraction in force, when the log has no server_args line.",
)
@click.option("--chunked-prefill-size", "chunk", type=int, help="Chunk size in force, when the log does not say.")
@click.option(
    "--expandable-segments/--no-expandable-segments",
    default=None,
    help="Whether PYTORCH_CUDA_ALLOC_CONF had expandable_segments:True (the log never says).",
)
@click.option("--json", "json_", is_flag=True, help="Print one JSON document to stdout.")
def oom(
    file_: str | None,
    unit: str | None,
    since: str | None,
    fraction: float | None,
    chunk: int | None,
    expandable_segments: bool | None,
    json_: bool,
) -> None:
    """Find OOMs and crashes and say what to change.

    Reports PyTorch CUDA OOMs (current and older messages), scheduler exceptions,
    SIGQUIT/kill lines, KV-pool retractions, prefill/decode out of memory, the kernel
    OOM killer, illegal memory accesses and NCCL errors, each classified (activation
    spike, fragmentation, KV pool / startup allocation, host memory, not memory).

    Reading the journal on the node, the values the log does not say (expandable_segments never
    appears in it) come from the node's env files, as the guard reads them; flags win. Where the
    log holds an engine start that logged its pool size, each advice is checked by the memory
    planner: its KV pool in tokens against the node's context target, and whether the spike fits.

    Exit status: 0 none found, 1 incidents found, 2 usage error, 3 the journal, the node's config
    or its env files could not be read, or the journal holds no line of the unit (without --since).
    """
    if file_ is not None and since is not None:
        raise click.UsageError("--since applies to the journal only; filter the file yourself or drop --file")
    if chunk is not None and (chunk == 0 or chunk < -1):
        raise click.BadParameter(
            "use a positive chunk size, or -1 for chunking disabled", param_hint="--chunked-prefill-size"
        )
    flags = TunedValues(fraction, chunk, expandable_segments)
    lines: list[str] = _read_file(file_) if file_ is not None else []
    try:
        config = load_config()  # (off the node: the defaults, the model preset and the context target)
        if file_ is None:
            flags = flags.merged_over(values_in_force(config.env_file, config.override_env_file))
            lines = list(oom_lib.read_journal(unit or config.unit, since))
    except (oom_lib.JournalError, click.ClickException) as exc:
        # not "found" (1): a script reading the exit code must not take "could not look" for an OOM
        error = click.ClickException(exc.message if isinstance(exc, click.ClickException) else str(exc))
        error.exit_code = EXIT_NOT_READ
        raise error from None
    if file_ is None and not lines:  # journalctl exits 0 for a unit that never logged (a mistyped --unit)
        if since is None:
            error = click.ClickException(f"the journal holds no line of {unit or config.unit}: is it the engine's "
                                         "unit (--unit)? Nothing was analysed")
            error.exit_code = EXIT_NOT_READ
            raise error
        err_console.print(f"no journal line of {unit or config.unit} since {since}")
    hint = EngineConfig(mem_fraction_static=flags.mem_fraction_static, chunked_prefill_size=flags.chunked_prefill_size,
                        expandable_segments=flags.expandable_segments)
    # (--mem-fraction-static states the crashed run's fraction; the values in force now are no
    # evidence of it, so an OOM of a run whose server_args line is not in view calibrates nothing)
    incidents = oom_lib.analyze(lines, hint, hint_stated=fraction is not None)
    # Where the log holds an engine start that sized its pool, the planner, calibrated from it,
    # checks each advice against the context target (and adds its own choice if none holds it).
    # (The calibration reads the log again, without the hint: a spike observed at a guessed
    # fraction is wrong.)
    inputs = node_plan_inputs(config, lines)
    if inputs is not None:
        for incident in incidents:
            if incident.recommendation is not None:
                incident.recommendation = oom_lib.recommend(incident, inputs, config.context_target)
    if json_:
        print_json({"incidents": incidents, "count": len(incidents)})
    elif not incidents:
        err_console.print("No OOMs or crashes found.")
    else:
        console.print(_summary_table(incidents))
        for number, incident in enumerate(incidents, 1):
            _print_incident(number, incident)
    click.get_current_context().exit(EXIT_FOUND if incidents else EXIT_NONE_FOUND)
