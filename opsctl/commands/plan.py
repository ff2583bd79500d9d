"""`opsctl plan`: KV pool tokens and prefill headroom per --mem-fraction-static.

opsctl plan --model kimi-k2.6 --gpu-mem-gib 94.97 --weights-gib 74.29 --tp 8
opsctl plan --model kimi-k2.6 --calibrate-log node.log          # the node's own figures
opsctl plan --config /models/X/config.json --gpu-mem-gib 80 --weights-gib 60 --tp 2 --json
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click
from rich.table import Table

from opsctl import model_shapes, planner
from opsctl.config import load_config
from opsctl.output import console, err_console, print_json
from opsctl.startup_log import GIB


def _shape(model: str | None, config: str | None, kv_dtype: str | None, no_draft: bool) -> model_shapes.ModelShape:
    if model and config:
        raise click.UsageError("give --model or --config, not both")
    try:
        if config:
            # A config.json describes the target only; its draft (if any) is not known here.
            return model_shapes.shape_from_hf_config(config, kv_dtype=kv_dtype)
        shape = model_shapes.preset(model or "kimi-k2.6")
        if kv_dtype:
            shape = model_shapes.with_kv_dtype_bytes(shape, model_shapes.dtype_bytes(kv_dtype))
    except model_shapes.ShapeError as exc:
        raise click.BadParameter(str(exc), param_hint="--config" if config else "--kv-dtype") from None
    return replace(shape, draft=None) if no_draft else shape


def _node_context_target() -> int:
    """The context target of this node's opsctl config (what status, oom and restart judge by),
    or the default off a node or where that config cannot be read."""
    try:
        return load_config().context_target
    except click.ClickException:
        return planner.DEFAULT_CONTEXT_TARGET


def _read_log(path: str) -> list[str]:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        raise click.BadParameter(f"cannot read {path}: {exc.strerror or exc}", param_hint="--calibrate-log") from None


def _table(rows: list[planner.PlanRow], chunks: list[int], target: int, margin_gib: float) -> Table:
    table = Table(title=f"KV pool and headroom per fraction (target {target:,} tokens)",
                  caption=f"safe: spike + {margin_gib:g} GiB margin <= headroom, with expandable segments")
    table.add_column("fraction", justify="right")
    table.add_column("KV tokens", justify="right")
    table.add_column("of target", justify="right")
    table.add_column("headroom GiB", justify="right")
    for chunk in chunks:
        table.add_column(f"spike@{chunk} GiB", justify="right")
        table.add_column(f"safe@{chunk}")
    for row in rows:
        cells = [f"{row.fraction:g}", f"{row.tokens:,}", f"{row.target_share:.1%}", f"{row.headroom_bytes / GIB:.2f}"]
        for check in row.chunks:
            cells += [f"{check.spike_bytes / GIB:.2f}", "yes" if check.safe else "[red]no[/red]"]
        table.add_row(*cells)
    return table


@click.command("plan")
@click.option("--model", type=click.Choice(sorted(model_shapes.PRESETS)), help="Model preset (default kimi-k2.6).")
@click.option(
    "--config", "config_path", metavar="PATH", help="A Hugging Face config.json (or its directory) instead of a preset."
)
@click.option("--kv-dtype", help="KV cache dtype (bfloat16, fp8_e4m3); default the preset's / config's.")
@click.option("--no-draft", is_flag=True, help="Leave the DFlash draft's KV out of the cell.")
@click.option(
    "--gpu-mem-gib",
    type=click.FloatRange(min=1),
    help="GPU capacity in GiB as PyTorch reports it (94.97 on an RTX PRO 6000).",
)
@click.option(
    "--weights-gib",
    type=click.FloatRange(min=0),
    help="Weights per GPU, GiB: the target's 'Load weight end ... mem usage' plus a DFlash draft's "
    "(SGLang loads the draft before it sizes the pool).",
)
@click.option(
    "--non-torch-gib",
    type=click.FloatRange(min=0),
    default=1.5,
    show_default=True,
    help="Memory outside PyTorch before weights load (CUDA context, NCCL), GiB.",
)
@click.option("--tp", type=click.IntRange(min=1),
              help="Tensor-parallel size (8 on the seed's node); needed without --calibrate-log, whose engine "
                   "start gives it.")
@click.option(
    "--page-size", type=click.IntRange(min=1), default=1, show_default=True, help="--page-size of the engine."
)
@click.option(
    "--context-target",
    type=click.IntRange(min=1),
    help="Tokens one request must fit in the pool [default: the node's opsctl config's target, else "
    f"{planner.DEFAULT_CONTEXT_TARGET:,}].",
)
@click.option(
    "--chunk",
    "chunks",
    type=click.IntRange(min=1),
    multiple=True,
    help="Chunk size to check (repeatable; default 4096 and 8192).",
)
@click.option("--fractions", default="0.90:0.96:0.01", show_default=True, help="START:STOP:STEP or a comma list.")
@click.option(
    "--calibrate-log", metavar="PATH", help="A node's log: startup lines pin the pool; OOMs in it pin the spike."
)
@click.option("--json", "json_", is_flag=True, help="Print one JSON document to stdout.")
def plan(
    model: str | None,
    config_path: str | None,
    kv_dtype: str | None,
    no_draft: bool,
    gpu_mem_gib: float | None,
    weights_gib: float | None,
    non_torch_gib: float,
    tp: int | None,
    page_size: int,
    context_target: int | None,
    chunks: tuple[int, ...],
    fractions: str,
    calibrate_log: str | None,
    json_: bool,
) -> None:
    """Plan --mem-fraction-static and --chunked-prefill-size for a context target.

    Prints, per fraction, SGLang's KV pool size, its share of the target, the headroom
    left for activations, and each chunk's prefill spike and whether it fits; then the
    recommended fraction, chunk and expandable_segments. Without --calibrate-log it
    needs --gpu-mem-gib, --weights-gib and --tp.
    """
    shape = _shape(model, config_path, kv_dtype, no_draft)
    try:
        fraction_list = planner.fraction_range(fractions)
    except planner.PlanError as exc:
        raise click.BadParameter(str(exc), param_hint="--fractions") from None
    chunk_list = sorted(set(chunks)) or list(planner.DEFAULT_CHUNKS)
    if calibrate_log is None and (gpu_mem_gib is None or weights_gib is None or tp is None):
        raise click.UsageError("give --gpu-mem-gib, --weights-gib and --tp (the KV cell per GPU depends on it), "
                               "or --calibrate-log with a node's startup log")
    if calibrate_log is not None and (gpu_mem_gib is not None or weights_gib is not None):
        err_console.print("--calibrate-log: the log's engine start gives the GPU's and the weights' sizes; "
                          "--gpu-mem-gib and --weights-gib are not used")
    context_target = context_target or _node_context_target()
    gpu = planner.GpuSpec(total_gib=gpu_mem_gib if gpu_mem_gib is not None else 0.0, non_torch_gib=non_torch_gib)
    inputs = planner.PlanInputs(
        gpu=gpu, shape=shape, weights_gib=weights_gib or 0.0, tp=tp or 1, page_size=page_size,
        include_draft=not no_draft
    )
    if calibrate_log is not None:
        try:
            inputs = planner.calibrate_from_log(_read_log(calibrate_log), inputs,
                                                kv_dtype_bytes=shape.kv_dtype_bytes if kv_dtype else None)
        except planner.PlanError as exc:
            raise click.BadParameter(str(exc), param_hint="--calibrate-log") from None
    elif weights_gib >= gpu.pre_model_load_gib:
        raise click.BadParameter(
            f"{weights_gib} GiB of weights do not fit {gpu.pre_model_load_gib:.2f} GiB free before load; "
            "check --weights-gib (per GPU) and --tp",
            param_hint="--weights-gib",
        )
    fraction_list = planner.with_lowest_fraction(fraction_list, context_target, inputs)  # (the recommendation's row)
    rows = planner.plan_table(inputs, fraction_list, chunk_list, context_target)
    best = planner.recommend(context_target, inputs, fraction_list, chunk_list)
    lowest = planner.lowest_fraction_for(context_target, inputs)
    if json_:
        print_json(
            {
                "inputs": inputs,
                "cell_bytes": inputs.cell_bytes,
                "rows": rows,
                "recommendation": best,
                "lowest_fraction_for_target": lowest,
            }
        )
        return
    for note in inputs.notes:
        err_console.print(f"calibration: {note}")
    err_console.print(
        f"cell {inputs.cell_bytes:,} bytes/token; pre-load free {inputs.pre_gib:.2f} GiB; "
        f"post-pool {inputs.post_pool_gib:.2f} GiB; spike model: {inputs.activation.source}"
    )
    console.print(_table(rows, chunk_list, context_target, inputs.safety_margin_gib))
    if best.fraction is None:
        console.print(f"No safe setting: {best.reason}.")
        return
    console.print(
        f"Recommended: --mem-fraction-static {best.fraction} --chunked-prefill-size {best.chunk} "
        f"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True ({best.reason})."
    )
    if lowest is not None:
        console.print(f"Lowest fraction holding {context_target:,} tokens: {lowest}.")
