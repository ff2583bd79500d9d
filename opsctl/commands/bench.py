"""`opsctl bench`: long-context benchmark of an SGLang server.

    opsctl bench run --url http://127.0.0.1:30000 --contexts 1k,8k,32k --gen 32 --out results.json
    opsctl bench run --resume results.json          # after a crash and a fix
    opsctl bench report results.json --csv results.csv --plot results.png
    opsctl bench compare before.json after.json
    opsctl bench concurrency --context 8k --streams 4 --gen 64

Exit codes of `run`: 0 the sweep completed; 1 it stopped early (server died or failed its
health check; the points measured so far are kept) or a point failed with the server up
(`--resume` measures it again); 2 usage error; 130 Ctrl-C (kept too).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlparse

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from opsctl import journal
from opsctl.bench import floor as floor_mod
from opsctl.bench import prompts, report
from opsctl.bench.client import BenchClient
from opsctl.bench.runner import (
    PROMPT_MODES,
    PointResult,
    RunResult,
    Sample,
    SettingsMismatch,
    SweepObserver,
    SweepSettings,
    check_resumable,
    load_result,
    run_concurrency,
    run_sweep,
)
from opsctl.config import load_config
from opsctl.output import console, err_console, print_json
from opsctl.state import atomic_write

DEFAULT_CONTEXTS = "1k,8k,32k,64k,128k,185k"
DEFAULT_GEN = 32
EXIT_STOPPED = 1
EXIT_INTERRUPTED = 130
# /health is retried this often, this far apart, before a point counts the server as down
# (a real server can miss one probe under load).
HEALTH_RETRIES = 2
HEALTH_RETRY_DELAY_S = 2.0


def _check_writable(path: Path) -> None:
    """--out is written after the first point: find out now that it cannot be, not after a run."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", suffix=".check"):
            pass
    except OSError as exc:
        raise click.BadParameter(f"cannot write {path}: {exc.strerror or exc}", param_hint="--out") from None


# Returns an excerpt of the node's journal (the server's last log lines) or None.
def _journal_hook() -> Callable[[], str | None]:
    """When the server dies mid-sweep: the end of the engine unit's journal, where this runs on the node."""
    return lambda: journal.excerpt(load_config().unit)


# -- shared options ---------------------------------------------------------------------


def server_options(f):
    """--url and --api-key, shared by the commands that talk to a server."""
    f = click.option(
        "--api-key",
        envvar="OPSCTL_API_KEY",
        default=None,
        show_envvar=True,
        help="Sent as 'Authorization: Bearer KEY' (the server's --api-key).",
    )(f)
    f = click.option(
        "--url",
        envvar="OPSCTL_URL",
        default="http://127.0.0.1:30000",
        show_default=True,
        show_envvar=True,
        callback=_http_url,
        help="Base URL of the SGLang server.",
    )(f)
    return f


def _http_url(_ctx, _param, value: str) -> str:
    """A usage error (2) for a URL that cannot be the server's, before a results file is made."""
    parsed = urlparse(value)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise click.BadParameter(f"{value!r} is not an http(s) URL: give the server's, e.g. http://127.0.0.1:30000")
    return value


def floor_options(f):
    """The memory-bandwidth floor drawn in tables and plots."""
    f = click.option(
        "--kv-cell-bytes",
        type=click.IntRange(min=1),
        default=None,
        help="KV bytes per token of context, all layers [default: Kimi K2's MLA cell in the server's KV "
        "dtype: 576 values * 61 layers * 2 B for bf16, 1 B for fp8].",
    )(f)
    f = click.option(
        "--bandwidth-tbs",
        type=click.FloatRange(min=0, min_open=True),
        default=None,
        help="GPU memory bandwidth in TB/s; overrides --gpu (e.g. 4.24, a measured H200 copy).",
    )(f)
    f = click.option(
        "--gpu",
        type=click.Choice(sorted(floor_mod.GPU_BANDWIDTH_TBS)),
        envvar="OPSCTL_BENCH_GPU",
        default="rtx-pro-6000",
        show_default=True,
        show_envvar=True,
        help="The node's GPU, for the bandwidth floor (rtx-pro-6000 1.79 TB/s, h200 4.8 TB/s).",
    )(f)
    return f


def output_options(f):
    """Files and title for a sweep's results, shared by `run` and `report`."""
    f = click.option(
        "--label", default=None, help="Title for the table and plot (e.g. the node or the change under test)."
    )(f)
    f = click.option(
        "--plot",
        "plot_path",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="Also write a PNG plot (needs matplotlib).",
    )(f)
    f = click.option(
        "--csv",
        "csv_path",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="Also write a CSV, one row per point.",
    )(f)
    return f


def _floor(gpu: str, bandwidth_tbs: float | None, kv_cell_bytes: int | None, kv_cache_dtype: str | None = None) -> dict:
    cell = kv_cell_bytes or floor_mod.kimi_kv_cell_bytes(kv_cache_dtype)
    return floor_mod.make_floor(gpu, bandwidth_tbs, cell).to_dict()


def _contexts(value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        return prompts.parse_contexts(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--contexts") from exc


# -- progress ---------------------------------------------------------------------------


def _fmt_elapsed(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m}:{s:02d}"


class _PointElapsed(ProgressColumn):
    """Time spent on the current point."""

    def render(self, task) -> Text:
        start = task.fields.get("point_start")
        if start is None:
            return Text("")
        return Text(f"point {_fmt_elapsed(time.monotonic() - start)}", style="cyan")


class _ProgressObserver(SweepObserver):
    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task = progress.add_task("starting", total=None, point_start=None)
        self.label = ""

    def sweep_started(self, result: RunResult, todo: list[int]) -> None:
        self.progress.update(self.task, total=len(todo), completed=0)
        done = len(result.settings.contexts) - len(todo)
        if done:
            self.progress.console.print(
                f"resuming: {done} point(s) kept, {len(todo)} to measure", soft_wrap=True
            )

    def point_started(self, index: int, total: int, context: int, repeat: int, repeats: int) -> None:
        rep = f", repeat {repeat + 1}/{repeats}" if repeats > 1 else ""
        self.label = f"ctx {prompts.format_context(context)} (point {index + 1}/{total}{rep})"
        if repeat == 0:
            self.progress.update(self.task, point_start=time.monotonic())
        self.progress.update(self.task, description=self.label)

    def phase(self, text: str) -> None:
        self.progress.update(self.task, description=f"{self.label}: {text}" if self.label else text)

    def sample_done(self, sample: Sample) -> None:
        self.progress.console.print(
            f"  {prompts.format_context(sample.prompt_tokens)}: TTFT {report.fmt_duration(sample.ttft_s)}, "
            f"decode {report.fmt_rate(sample.decode_tok_s)} tok/s, {report.fmt_ms(sample.step_ms)} ms/step"
            + (f" [{' '.join(sample.flags)}]" if sample.flags else ""),
            soft_wrap=True,
            markup=False,
        )

    def point_done(self, point: PointResult) -> None:
        self.progress.advance(self.task)

    def message(self, text: str) -> None:
        self.progress.console.print(text, style="yellow", soft_wrap=True)


def _progress() -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        _PointElapsed(),
        TextColumn("total"),
        TimeElapsedColumn(),
        console=err_console,
        transient=False,
    )


# -- commands ---------------------------------------------------------------------------


@click.group("bench")
def bench() -> None:
    """Long-context benchmark: TTFT, prefill and decode rates, step time vs context.

    One streaming request per point with a unique prompt (a nonce at the front defeats the
    prefix cache), fixed output length, health checks, results saved after every point.
    """


@bench.command("run")
@server_options
@click.option(
    "--contexts",
    default=None,
    help=f"Context lengths to sweep, k = 1000 tokens. [default: {DEFAULT_CONTEXTS}]",
)
@click.option(
    "--gen",
    type=click.IntRange(min=2),
    default=None,
    help=f"Output tokens per request (ignore_eos). [default: {DEFAULT_GEN}]",
)
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    default=None,
    help="Requests per point; medians and spread when > 1. [default: 1]",
)
@click.option(
    "--flush/--no-flush", default=None, help="POST /flush_cache before each request. [default: flush]"
)
@click.option(
    "--prompt-mode",
    type=click.Choice(PROMPT_MODES),
    default=None,
    help="ids: exact token ids (input_ids); text: words, checked against prompt_tokens. [default: ids]",
)
@click.option(
    "--warmup/--no-warmup", default=True, show_default=True, help="One short unrecorded request first."
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=1),
    default=None,
    help="Per-request timeout in seconds. [default: scaled to the context]",
)
@click.option(
    "--out",
    "out_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Results JSON, rewritten after every point. [default: bench-<UTC time>.json, or the --resume file]",
)
@click.option(
    "--resume",
    "resume_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Continue the sweep in this results file from its first missing point.",
)
@output_options
@floor_options
@click.option("--json", "json_", is_flag=True, help="Print the results document as JSON on stdout.")
def run_cmd(
    url,
    api_key,
    contexts,
    gen,
    repeats,
    flush,
    prompt_mode,
    warmup,
    timeout_s,
    out_path,
    resume_path,
    csv_path,
    plot_path,
    label,
    gpu,
    bandwidth_tbs,
    kv_cell_bytes,
    json_,
) -> None:
    """Sweep context lengths, one streaming request per point.

    Exit codes: 0 complete, 1 stopped early or a point failed (results kept; continue
    with --resume), 2 usage error, 130 interrupted (results kept).
    """
    previous = None
    if resume_path is not None:
        try:
            previous = load_result(resume_path)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise click.BadParameter(f"cannot read {resume_path}: {exc}", param_hint="--resume") from exc
        base = previous.settings
        settings = SweepSettings(
            contexts=_contexts(contexts) or base.contexts,
            gen=gen if gen is not None else base.gen,
            repeats=repeats if repeats is not None else base.repeats,
            flush=flush if flush is not None else base.flush,
            prompt_mode=prompt_mode or base.prompt_mode,
            warmup=warmup,
            timeout_s=timeout_s,
        )
        out_path = out_path or resume_path
    else:
        settings = SweepSettings(
            contexts=_contexts(contexts or DEFAULT_CONTEXTS),
            gen=gen if gen is not None else DEFAULT_GEN,
            repeats=repeats or 1,
            flush=True if flush is None else flush,
            prompt_mode=prompt_mode or "ids",
            warmup=warmup,
            timeout_s=timeout_s,
        )
        if out_path is None:
            out_path = Path(f"bench-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}.json")
    gpu_given = click.get_current_context().get_parameter_source("gpu") != click.core.ParameterSource.DEFAULT
    if previous is not None and previous.floor and not gpu_given:
        # a resumed sweep keeps its file's floor (an H200 sweep its H200 one), with what was given
        bandwidth = bandwidth_tbs or previous.floor["bandwidth_tbs"]
        name = previous.floor["label"].split(",")[0]
        floor = floor_mod.Floor(bandwidth, kv_cell_bytes or previous.floor["kv_cell_bytes"],
                                f"{name}, {bandwidth:g} TB/s").to_dict()
    else:
        try:
            floor = _floor(gpu, bandwidth_tbs, kv_cell_bytes)
            if kv_cell_bytes is None:
                floor["kv_cell_from_server"] = True  # the runner sets the cell from /server_info's KV dtype
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--gpu") from exc
    if previous is not None:
        try:
            check_resumable(previous, settings)
        except SettingsMismatch as exc:
            raise click.UsageError(str(exc)) from exc
    if plot_path is not None:
        _check_plot_available()
    _check_writable(out_path)

    err_console.print(f"results: {out_path} (rewritten after every point)", soft_wrap=True)
    with BenchClient(url, api_key=api_key) as client, _progress() as progress:
        result = run_sweep(
            settings,
            client,
            out_path=out_path,
            resume_from=previous,
            observer=_ProgressObserver(progress),
            journal_excerpt=_journal_hook(),
            floor=floor,
            meta_extra={"label": label} if label else None,
            health_retries=HEALTH_RETRIES,
            health_retry_delay_s=HEALTH_RETRY_DELAY_S,
        )
    _emit(result, json_, csv_path, plot_path, label)
    if result.stopped is not None:
        s = result.stopped
        where = f" at point {prompts.format_context(s.context)}" if s.context else ""
        err_console.print(f"[bold red]stopped{where}[/]: {escape(s.reason)}", soft_wrap=True)
        if s.journal:
            err_console.print("journal excerpt:", style="bold")
            err_console.print(s.journal, markup=False, highlight=False, soft_wrap=True)
        done = sum(1 for p in result.points if p.done)
        err_console.print(
            f"{done} of {len(settings.contexts)} point(s) kept in {out_path}; continue with: "
            f"opsctl bench run --url {url} --resume {out_path}",
            soft_wrap=True,
        )
        raise SystemExit(EXIT_INTERRUPTED if s.kind == "interrupted" else EXIT_STOPPED)
    failed = [p for p in result.points if p.status == "error"]
    if failed:
        names = escape(", ".join(f"{prompts.format_context(p.context_requested)} ({p.error})" for p in failed))
        err_console.print(
            f"[bold red]{len(failed)} point(s) failed[/] with the server still up: {names}; "
            f"fix and retry them with: opsctl bench run --url {url} --resume {out_path}",
            soft_wrap=True,
        )
        raise SystemExit(EXIT_STOPPED)


def _print_table(table) -> None:
    """Tables keep their full width when piped or redirected (no 80-column squeeze)."""
    if console.is_terminal:
        console.print(table)
    else:
        Console(file=sys.stdout, width=200, highlight=False).print(table)


def _check_plot_available() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        from opsctl.bench.plot import INSTALL_HINT

        raise click.ClickException(INSTALL_HINT) from exc


def _emit(
    result: RunResult,
    json_: bool,
    csv_path: Path | None,
    plot_path: Path | None,
    label: str | None,
    table: bool = True,
) -> None:
    if json_:
        print_json(result.to_dict())
    elif table and result.points:
        _print_table(report.sweep_table(result, title=label))
        line = report.fit_line(result)
        if line:
            console.print(line, soft_wrap=True)
    if csv_path is not None:
        report.write_csv(result, csv_path)
        err_console.print(f"CSV: {csv_path}")
    if plot_path is not None:
        from opsctl.bench.plot import PlotUnavailable, plot_sweep

        try:
            plot_sweep(result, plot_path, title=label or result.meta.get("label"))
            err_console.print(f"plot: {plot_path}")
        except (PlotUnavailable, ValueError) as exc:
            err_console.print(f"no plot: {exc}", style="yellow")


@bench.command("report")
@click.argument("results", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@output_options
@click.option("--markdown", is_flag=True, help="Print the table as Markdown (the seed's shape) instead.")
@floor_options
@click.option(
    "--floor-from-file/--floor-from-options",
    default=True,
    show_default=True,
    help="Use the floor saved in RESULTS, or the --gpu/--bandwidth-tbs options.",
)
@click.option(
    "--time-factor",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Lab simulator only: divide durations by its SGLANG_SIM_TIME_FACTOR to show model time.",
)
@click.option("--json", "json_", is_flag=True, help="Print the results document as JSON on stdout.")
def report_cmd(
    results,
    csv_path,
    plot_path,
    markdown,
    label,
    gpu,
    bandwidth_tbs,
    kv_cell_bytes,
    floor_from_file,
    time_factor,
    json_,
) -> None:
    """Print, re-plot or export a saved sweep."""
    result = _load(results, "RESULTS")
    if time_factor is not None:
        result = report.to_model_time(result, time_factor)
    if not floor_from_file or not result.floor:
        result.floor = _floor(gpu, bandwidth_tbs, kv_cell_bytes,
                              (result.meta.get("server_args") or {}).get("kv_cache_dtype"))
    label = label or result.meta.get("label")
    if plot_path is not None:
        _check_plot_available()
    if markdown and not json_:
        click.echo(report.markdown_table(result), nl=False)
        _emit(result, False, csv_path, plot_path, label, table=False)
        return
    _emit(result, json_, csv_path, plot_path, label)


def _load(path: Path, hint: str) -> RunResult:
    try:
        return load_result(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise click.BadParameter(f"{path} is not an opsctl bench sweep file: {exc}", param_hint=hint) from exc


@bench.command("compare")
@click.argument("a", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("b", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--json", "json_", is_flag=True, help="Print the comparison as JSON on stdout.")
def compare_cmd(a, b, json_) -> None:
    """Ratio B / A per point (A before, B after a kernel or config change)."""
    cmp = report.compare(_load(a, "A"), _load(b, "B"))
    cmp["a"], cmp["b"] = str(a), str(b)
    if json_:
        print_json(cmp)
    else:
        _print_table(report.compare_table(cmp, title=f"B = {b}  vs  A = {a}"))
    for w in cmp["warnings"]:
        err_console.print(f"warning: {w}", style="yellow", soft_wrap=True)
    if not cmp["points"]:
        raise click.ClickException("no point measured in both files (compare needs the same --contexts)")


@bench.command("concurrency")
@server_options
@click.option(
    "--context",
    "context_",
    default="8k",
    show_default=True,
    help="Prompt length of every stream (k = 1000 tokens).",
)
@click.option("--streams", type=click.IntRange(min=1), default=4, show_default=True, help="Parallel streams.")
@click.option(
    "--gen",
    type=click.IntRange(min=2),
    default=64,
    show_default=True,
    help="Output tokens per stream (ignore_eos).",
)
@click.option("--flush/--no-flush", default=True, show_default=True, help="POST /flush_cache first.")
@click.option("--prompt-mode", type=click.Choice(PROMPT_MODES), default="ids", show_default=True)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=1),
    default=None,
    help="Per-request timeout in seconds. [default: scaled]",
)
@click.option(
    "--out",
    "out_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the result JSON here too.",
)
@click.option("--json", "json_", is_flag=True, help="Print the result as JSON on stdout.")
def concurrency_cmd(
    url, api_key, context_, streams, gen, flush, prompt_mode, timeout_s, out_path, json_
) -> None:
    """N parallel streams at one context: aggregate throughput (exit 1 if a stream failed, 130 on
    Ctrl-C, which stops the streams and keeps the ones that had finished)."""
    try:
        context = prompts.parse_context(context_)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--context") from exc
    if out_path is not None:
        _check_writable(out_path)
    with BenchClient(url, api_key=api_key) as client:
        health = client.health()
        if not health.ok:
            raise click.ClickException(f"server at {url} is not healthy: /health {health.detail}")
        with err_console.status(f"{streams} streams at {prompts.format_context(context)}..."):
            res = run_concurrency(
                client, context, streams, gen, flush=flush, prompt_mode=prompt_mode, timeout_s=timeout_s
            )
    if json_:
        print_json(res.to_dict())
    elif res.samples or res.stopped is None:
        _print_table(report.concurrency_table(res))
    if out_path is not None:  # (after the figures are out: a write that fails now loses nothing)
        atomic_write(out_path, json.dumps(res.to_dict(), indent=2) + "\n")
    for e in res.errors:
        err_console.print(f"stream failed: {e}", style="red", soft_wrap=True, markup=False)
    if res.stopped is not None:
        kept = f" in {out_path}" if out_path is not None else ""
        err_console.print(f"[bold red]stopped[/]: {escape(res.stopped.reason)}{escape(kept)}", soft_wrap=True)
        raise SystemExit(EXIT_INTERRUPTED)
    if res.errors:
        raise SystemExit(EXIT_STOPPED)
