"""Memory planner: KV pool size and prefill headroom for each --mem-fraction-static.

Units: functions named `*_bytes` return bytes (int); fields named `*_gib` are GiB
(float, 1 GiB = 1 << 30 bytes, which is what SGLang prints as "GB").

The KV pool formula mirrors SGLang 0.5.23 (checked against the wheel):

* `KVCacheConfigurator._profile_available_bytes` (sglang/srt/mem_cache/kv_cache_configurator.py):
  ``rest_memory = available_gpu_memory - pre_model_load_memory * (1 - mem_fraction_static)``
  in GiB floats, then ``int(rest_memory * (1 << 30))`` bytes; ``rest_memory <= 0`` raises
  "Loaded weights leave no GPU memory for the KV cache ...".
* `DefaultPoolConfigurator.calculate_pool_sizes` (sglang/srt/model_executor/pool_configurator.py):
  ``available_bytes // cell_size``, then ``// page_size * page_size``.
* `DefaultPoolConfigurator._compute_cell_size`: MLA cell =
  ``(kv_lora_rank + qk_rope_head_dim) * num_layers * kv_dtype_bytes`` with no TP divisor
  (every rank holds the whole latent cache); other models
  ``get_num_kv_heads(tp) * (head_dim + v_head_dim) * num_layers * kv_dtype_bytes``.
* DFlash: `dflash_draft_cell_size_per_token` + `scale_kv_cell_size_per_token_for_dflash`
  (sglang/srt/speculative/dflash_utils.py) add the draft's
  ``max(1, draft_kv_heads // tp) * (head_dim + v_head_dim) * draft_layers * dtype_bytes``.

MLA models are sized before CUDA-graph capture in 0.5.23 (`post_capture_kv_sizing_planned`
returns False for MLA), so the classic formula above is the one in force for them.

The activation spike is not SGLang's: it is this module's model of the transient memory a
prefill chunk needs beyond the static pool, calibrated from the OOMs a node had.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from opsctl.model_shapes import DraftShape, ModelShape, ShapeError, dtype_bytes, with_kv_dtype_bytes
from opsctl.startup_log import GIB, MIB, StartupFacts, last_sized_startup

DEFAULT_CONTEXT_TARGET = 200_000
DEFAULT_CHUNKS = (4096, 8192)
# CUDA graphs and other allocations made after the pool, when no log says better:
# SGLang's own reserve for an MLA prefill graph is 1.5 GiB (`reserve_for_graph_mb`).
DEFAULT_POST_POOL_GIB = 1.5
# Headroom kept free beyond the spike: allocator rounding and run-to-run variation.
DEFAULT_SAFETY_MARGIN_GIB = 0.5
# Extra headroom assumed lost to fragmentation when expandable segments are off.
DEFAULT_FRAGMENTATION_GIB = 1.0


class PlanError(ValueError):
    """The inputs cannot give a plan (weights leave no room, missing figures, ...)."""


@dataclass(frozen=True)
class GpuSpec:
    """One GPU: capacity as PyTorch reports it, and what is not PyTorch's before weights load.

    `non_torch_gib` is the CUDA context, NCCL buffers and other processes on the GPU at
    the moment SGLang measures `pre_model_load_memory` (free memory before the weights).
    """

    total_gib: float
    non_torch_gib: float = 1.5

    @property
    def pre_model_load_gib(self) -> float:
        return self.total_gib - self.non_torch_gib


# Memory in use beyond the pool while a prefill runs, besides the chunk's own buffer, that the
# logged headroom does not show: SGLang logs available_gpu_mem before its warm-up, and the
# warm-up and the first requests allocate NCCL channels, cuBLAS/Triton workspaces and persistent
# buffers. Fitted from the seed node's OOM at 0.94 / chunk 8192: of the 4.28 GiB the log left,
# 893 MiB were free and 1.40 GiB reserved but unallocated, so 2.0 GiB were in use before the
# chunk's 896 MiB buffer was asked for.
DEFAULT_SERVING_BASE_GIB = 2.0


@dataclass(frozen=True)
class ActivationModel:
    """Memory a prefill chunk needs beyond the static pool and what the log shows, in bytes.

    ``spike(chunk) = base_bytes + ref_bytes * (chunk / ref_chunk) ** exponent``: a part that
    does not shrink with the chunk (DEFAULT_SERVING_BASE_GIB) and the chunk's own buffer. The
    default 896 MiB at chunk 8192 is the allocation that failed in the seed incident; it equals
    8192 tokens x top-8 experts x hidden 7168 x 2 bytes (the MoE dispatch buffer of a
    DeepSeek V3 shape), which grows linearly with the chunk, hence exponent 1.
    Calibrated from an OOM, the failed allocation raises the chunk's part and the rest of what
    the OOM proved raises the base: only the failed allocation is known to scale with the chunk,
    so a smaller chunk is never predicted to free more than its share of that.
    """

    ref_chunk: int = 8192
    ref_bytes: int = 896 * MIB
    exponent: float = 1.0
    base_bytes: int = int(DEFAULT_SERVING_BASE_GIB * GIB)
    source: str = "default (2.0 GiB in use while serving + 896 MiB at chunk 8192, linear)"

    def spike_bytes(self, chunk: int) -> int:
        if chunk <= 0:
            raise PlanError(f"chunk size must be positive, got {chunk}")
        return self.base_bytes + int(self.ref_bytes * (chunk / self.ref_chunk) ** self.exponent)


@dataclass(frozen=True)
class SpikeObservation:
    """What one activation OOM proved: at this fraction and chunk the spike did not fit."""

    fraction: float
    chunk: int
    tried_bytes: int
    free_bytes: int
    reserved_unallocated_bytes: int | None = None
    expandable_segments: bool | None = None
    label: str = ""


@dataclass(frozen=True)
class PlanInputs:
    """Everything the planner needs for one node.

    `pre_model_load_gib` / `avail_after_weights_gib` override what `gpu` and
    `weights_gib` imply; calibration sets them from a node's log (the latter solved
    exactly from the logged token count).
    """

    gpu: GpuSpec
    shape: ModelShape
    weights_gib: float
    tp: int = 1
    page_size: int = 1
    include_draft: bool = True
    post_pool_gib: float = DEFAULT_POST_POOL_GIB
    pre_model_load_gib: float | None = None
    avail_after_weights_gib: float | None = None
    activation: ActivationModel = field(default_factory=ActivationModel)
    safety_margin_gib: float = DEFAULT_SAFETY_MARGIN_GIB
    fragmentation_gib: float = DEFAULT_FRAGMENTATION_GIB
    notes: tuple[str, ...] = ()

    @property
    def pre_gib(self) -> float:
        """SGLang's `pre_model_load_memory` (GiB)."""
        return self.pre_model_load_gib if self.pre_model_load_gib is not None else self.gpu.pre_model_load_gib

    @property
    def avail_gib(self) -> float:
        """Free memory when the pool is sized, after the weights (GiB)."""
        if self.avail_after_weights_gib is not None:
            return self.avail_after_weights_gib
        return self.pre_gib - self.weights_gib

    @property
    def cell_bytes(self) -> int:
        return kv_cell_bytes(self.shape, self.tp, include_draft=self.include_draft)


# --- SGLang's formulas -------------------------------------------------------------------


def draft_cell_bytes(draft: DraftShape, tp: int = 1) -> int:
    """DFlash draft KV bytes per token on one GPU.

    Mirrors `dflash_draft_cell_size_per_token` with `ModelConfig.get_num_kv_heads`
    (``max(1, heads // tp)``): a drafter with fewer KV heads than ranks keeps one per GPU.
    """
    heads = max(1, draft.num_kv_heads // max(1, tp))
    return heads * (draft.head_dim + draft.v_head_dim) * draft.num_layers * draft.dtype_bytes


def kv_cell_bytes(shape: ModelShape, tp: int = 1, *, include_draft: bool = True) -> int:
    """KV bytes per token on one GPU: target cell plus, for DFlash, the draft's.

    Mirrors `DefaultPoolConfigurator._compute_cell_size` and, for the draft,
    `scale_kv_cell_size_per_token_for_dflash` with an explicit draft cell (a plain sum).
    """
    if shape.is_mla:
        target = (shape.kv_lora_rank + shape.qk_rope_head_dim) * shape.num_layers * shape.kv_dtype_bytes
    else:
        if not (shape.num_kv_heads and shape.head_dim and shape.v_head_dim):
            raise PlanError(f"model {shape.name!r} has neither MLA nor per-head KV dimensions")
        heads = max(1, shape.num_kv_heads // max(1, tp))
        target = heads * (shape.head_dim + shape.v_head_dim) * shape.num_layers * shape.kv_dtype_bytes
    if include_draft and shape.draft is not None:
        target += draft_cell_bytes(shape.draft, tp)
    return target


def rest_bytes(fraction: float, inputs: PlanInputs) -> int:
    """Bytes left for the KV pool at `fraction` (SGLang's `_profile_available_bytes`)."""
    rest_gib = inputs.avail_gib - inputs.pre_gib * (1 - fraction)
    if rest_gib <= 0:
        minimum = 1 - inputs.avail_gib / inputs.pre_gib
        raise PlanError(
            f"weights leave no GPU memory for the KV cache at --mem-fraction-static={fraction}; "
            f"use a fraction above {math.ceil(minimum * 1000) / 1000:.3f}"
        )
    return int(rest_gib * (1 << 30))


def max_total_num_tokens(fraction: float, inputs: PlanInputs) -> int:
    """KV pool tokens SGLang allocates at `fraction` (0 when nothing fits).

    `calculate_pool_sizes`: bytes // cell, rounded down to a multiple of page_size.
    """
    try:
        available = rest_bytes(fraction, inputs)
    except PlanError:
        return 0
    tokens = available // inputs.cell_bytes
    return tokens // inputs.page_size * inputs.page_size


def headroom_bytes(fraction: float, inputs: PlanInputs) -> int:
    """Free GPU memory left for activations while serving at `fraction`.

    What ``1 - fraction`` of `pre_model_load_memory` leaves, plus the pool's rounding
    remainder, minus what the engine allocates after the pool (CUDA graphs, draft
    buffers: `post_pool_gib`). Non-PyTorch memory present before the weights is
    already outside `pre_model_load_memory`. May be negative.
    """
    slack = int(inputs.pre_gib * (1 - fraction) * GIB)
    try:
        remainder = rest_bytes(fraction, inputs) - max_total_num_tokens(fraction, inputs) * inputs.cell_bytes
    except PlanError:
        remainder = 0
    return slack + remainder - int(inputs.post_pool_gib * GIB)


def activation_spike_bytes(chunk: int, inputs: PlanInputs | None = None) -> int:
    """Prefill activation spike for `chunk` tokens (the node's model, else the default)."""
    model = inputs.activation if inputs is not None else ActivationModel()
    return model.spike_bytes(chunk)


def required_headroom_bytes(chunk: int, inputs: PlanInputs, *, expandable: bool) -> int:
    """Headroom a chunk needs to be called safe: spike + margin (+ fragmentation if not expandable)."""
    need = activation_spike_bytes(chunk, inputs) + int(inputs.safety_margin_gib * GIB)
    if not expandable:
        need += int(inputs.fragmentation_gib * GIB)
    return need


def is_safe(fraction: float, chunk: int, inputs: PlanInputs, *, expandable: bool = True) -> bool:
    """Whether the spike of `chunk` fits the headroom at `fraction` with the margins."""
    if max_total_num_tokens(fraction, inputs) <= 0:
        return False
    return headroom_bytes(fraction, inputs) >= required_headroom_bytes(chunk, inputs, expandable=expandable)


# --- the table and the recommendation ------------------------------------------------------


@dataclass(frozen=True)
class ChunkCheck:
    chunk: int
    spike_bytes: int
    required_bytes: int
    safe: bool


@dataclass(frozen=True)
class PlanRow:
    fraction: float
    tokens: int
    target_share: float
    headroom_bytes: int
    chunks: tuple[ChunkCheck, ...]


MAX_FRACTIONS = 1000  # rows a fraction range may ask for (a typo such as a step of 1e-9 is refused)


def fraction_range(spec: str) -> list[float]:
    """Parse `START:STOP:STEP` (inclusive, e.g. `0.90:0.96:0.01`) or a comma list."""
    try:
        if ":" in spec:
            start, stop, step = (float(part) for part in spec.split(":"))
            if not (0 < start <= stop < 1 and step > 0) or (stop - start) / step > MAX_FRACTIONS:
                raise ValueError  # (nan and inf fail the comparisons too)
            count = int(round((stop - start) / step)) + 1
            values = [round(start + i * step, 6) for i in range(count)]
        else:
            values = [float(part) for part in spec.split(",") if part.strip()]
    except ValueError:
        raise PlanError(f"bad fraction range {spec!r}; use START:STOP:STEP like 0.90:0.96:0.01 (0 < START <= STOP "
                        f"< 1, at most {MAX_FRACTIONS} steps)") from None
    if not values or any(not 0 < value < 1 for value in values):
        raise PlanError(f"fractions must lie strictly between 0 and 1, got {spec!r}")
    return values


def plan_table(
    inputs: PlanInputs,
    fractions: Sequence[float],
    chunks: Sequence[int] = DEFAULT_CHUNKS,
    context_target: int = DEFAULT_CONTEXT_TARGET,
    *,
    expandable: bool = True,
) -> list[PlanRow]:
    """One row per fraction: pool tokens, share of the target, headroom, spike per chunk."""
    rows = []
    for fraction in fractions:
        tokens = max_total_num_tokens(fraction, inputs)
        headroom = headroom_bytes(fraction, inputs)
        checks = tuple(
            ChunkCheck(
                chunk=chunk,
                spike_bytes=activation_spike_bytes(chunk, inputs),
                required_bytes=required_headroom_bytes(chunk, inputs, expandable=expandable),
                safe=is_safe(fraction, chunk, inputs, expandable=expandable),
            )
            for chunk in chunks
        )
        rows.append(PlanRow(fraction, tokens, tokens / context_target, headroom, checks))
    return rows


@dataclass(frozen=True)
class PlanRecommendation:
    """The setting to run: fraction, chunk, expandable segments, and why."""

    fraction: float | None
    chunk: int | None
    expandable_segments: bool
    tokens: int
    context_target: int
    meets_target: bool
    headroom_bytes: int
    spike_bytes: int
    reason: str


def recommend(
    context_target: int,
    inputs: PlanInputs,
    fractions: Sequence[float] | None = None,
    chunks: Sequence[int] = DEFAULT_CHUNKS,
) -> PlanRecommendation:
    """The lowest fraction that holds `context_target` with a safe chunk; its largest safe chunk.

    Lowest fraction, because every 0.01 above it only takes headroom away; largest safe
    chunk, because prefill throughput grows with it. Expandable segments are always
    recommended: they cost nothing and give fragmented blocks back. When no fraction holds
    the target, the safe fraction holding the most tokens is returned with meets_target False.
    """
    fractions = with_lowest_fraction(fractions if fractions is not None else fraction_range("0.80:0.98:0.01"),
                                     context_target, inputs)
    best: tuple[float, int] | None = None
    fallback: tuple[float, int] | None = None
    for fraction in fractions:
        safe_chunks = [chunk for chunk in sorted(chunks) if is_safe(fraction, chunk, inputs, expandable=True)]
        if not safe_chunks:
            continue
        tokens = max_total_num_tokens(fraction, inputs)
        if tokens >= context_target:
            best = (fraction, safe_chunks[-1])
            break
        fallback = (fraction, safe_chunks[-1])
    if best is None and fallback is None:
        return PlanRecommendation(
            None, None, True, 0, context_target, False, 0, 0,
            "no fraction in range leaves room for any chunk's spike; lower the weights per GPU or the chunk",
        )
    fraction, chunk = best or fallback
    tokens = max_total_num_tokens(fraction, inputs)
    headroom = headroom_bytes(fraction, inputs)
    spike = activation_spike_bytes(chunk, inputs)
    if best is not None:
        reason = (
            f"lowest fraction holding {context_target:,} tokens ({tokens:,}); chunk {chunk} spike "
            f"{spike / GIB:.2f} GiB fits {headroom / GIB:.2f} GiB of headroom"
        )
    else:
        reason = (
            f"no fraction from {min(fractions)} to {max(fractions)} holds {context_target:,} tokens with a "
            f"safe chunk; {fraction} gives the most ({tokens:,}, {tokens / context_target:.1%} of the target)"
        )
    return PlanRecommendation(
        fraction, chunk, True, tokens, context_target, best is not None, headroom, spike, reason
    )


def with_lowest_fraction(fractions: Iterable[float], context_target: int, inputs: PlanInputs) -> list[float]:
    """The fractions, sorted, with the lowest one that holds the target where it falls in their
    range: a grid's steps can straddle it (0.934 between 0.93 and 0.94 on the seed's node)."""
    grid = sorted(set(fractions))
    lowest = lowest_fraction_for(context_target, inputs)
    if lowest is not None and grid and grid[0] <= lowest <= grid[-1] and lowest not in grid:
        grid = sorted([*grid, lowest])
    return grid


def lowest_fraction_for(context_target: int, inputs: PlanInputs) -> float | None:
    """Smallest fraction (3 decimals, as SGLang rounds its default) whose pool holds the target.

    None when even 0.999 cannot hold it.
    """
    need_gib = context_target * inputs.cell_bytes / GIB
    # rest = avail - pre * (1 - f) >= need  <=>  f >= 1 - (avail - need) / pre
    estimate = 1 - (inputs.avail_gib - need_gib) / inputs.pre_gib
    fraction = max(0.001, math.ceil(round(estimate * 1000, 6)) / 1000)
    # Walk past floor/page rounding; at most a few steps.
    while fraction < 1 and max_total_num_tokens(fraction, inputs) < context_target:
        fraction = round(fraction + 0.001, 3)
    while fraction > 0.001 and max_total_num_tokens(round(fraction - 0.001, 3), inputs) >= context_target:
        fraction = round(fraction - 0.001, 3)
    return fraction if fraction < 1 else None


def headroom_ladder(inputs: PlanInputs, fractions: Iterable[float]) -> list[tuple[float, int, int]]:
    """(fraction, pool tokens, headroom bytes) per fraction, highest fraction first."""
    return [
        (fraction, max_total_num_tokens(fraction, inputs), headroom_bytes(fraction, inputs))
        for fraction in sorted(fractions, reverse=True)
    ]


def default_chunked_prefill_size(gpu_total_gib: float) -> int:
    """SGLang's default --chunked-prefill-size for a GPU of this size.

    Mirrors the capacity ladder in `_handle_gpu_memory_settings`
    (sglang/srt/arg_groups/memory_hook.py): <20 GiB 2048, <60 GiB 4096, <160 GiB 8192, else 16384.
    """
    mib = gpu_total_gib * 1024
    if mib < 20 * 1024:
        return 2048
    if mib < 60 * 1024:
        return 4096
    if mib < 160 * 1024:
        return 8192
    return 16384


# --- calibration ---------------------------------------------------------------------------


def logged_kv_dtype_bytes(facts: StartupFacts) -> int | None:
    """Bytes an element of the KV cache the logged engine ran: its --kv-cache-dtype, else the
    dtype its 'KV Cache is allocated' line names (None when the log says neither)."""
    for name in (facts.config.kv_cache_dtype, facts.kv_dtype):
        if name and name != "auto":
            try:
                return dtype_bytes(name)
            except ShapeError:
                continue
    return None


def calibrate_from_startup(inputs: PlanInputs, facts: StartupFacts, kv_dtype_bytes: int | None = None) -> PlanInputs:
    """Pin the model to one logged engine start so it reproduces its pool exactly.

    The free memory is solved with the cell of the KV dtype the logged engine ran; the plan is
    then made for `kv_dtype_bytes` (None: that same dtype), so a bf16 node's log plans an fp8
    pool at twice the tokens.

    `pre_model_load_memory` is taken from `Load weight begin. avail mem=` (the closest
    logged figure). The free memory after weights is solved from the logged token count:
    the logged avail figures are rounded to 0.01 GiB (~140 tokens), so we place the pool
    in the middle of the byte interval that floors to exactly that count. Neighbouring
    fractions then move by `pre_model_load_memory * 0.01` each, which the rounding of the
    begin figure changes by less than one token.
    """
    config = facts.config
    fraction = config.mem_fraction_static
    tokens = facts.tokens
    if fraction is None:
        raise PlanError("the log has no server_args line with mem_fraction_static; cannot calibrate")
    if facts.load_begin_avail_gib is None:
        raise PlanError("the log has no 'Load weight begin. avail mem=' line; cannot calibrate")
    if facts.load_begin_avail_gib <= 0:
        raise PlanError(f"the log's 'Load weight begin. avail mem={facts.load_begin_avail_gib:.2f} GB' leaves "
                        "nothing to size a pool from; calibrate from another engine start")
    changes: dict = {}
    notes = list(inputs.notes)
    if config.tp_size:
        changes["tp"] = config.tp_size
    if config.page_size:
        changes["page_size"] = config.page_size
    if config.speculative_algorithm is not None or config.model_path is not None:
        # A server_args line was seen: the draft pool exists only under DFLASH.
        changes["include_draft"] = (config.speculative_algorithm or "").upper().startswith("DFLASH")
    logged_bytes = logged_kv_dtype_bytes(facts) or inputs.shape.kv_dtype_bytes
    calibrated = replace(inputs, shape=with_kv_dtype_bytes(inputs.shape, logged_bytes), **changes)
    cell = calibrated.cell_bytes  # the logged engine's: its pool's tokens are in this cell
    page = calibrated.page_size
    pre = facts.load_begin_avail_gib
    rest = tokens * cell + (page * cell) // 2
    avail = rest / GIB + pre * (1 - fraction)
    notes.append(f"pool: {tokens:,} tokens at {fraction} from the log, pre-load free {pre:.2f} GiB")
    if facts.load_end_avail_gib is not None:
        drift = facts.load_end_avail_gib - avail
        if abs(drift) >= 0.01:
            notes.append(
                f"free memory at pool sizing is {avail:.2f} GiB, {abs(drift):.2f} GiB "
                f"{'below' if drift > 0 else 'above'} 'Load weight end' (allocations in between)"
            )
    if facts.kv_size_gib is not None and facts.kv_tokens:
        target_cell = kv_cell_bytes(calibrated.shape, calibrated.tp, include_draft=False)
        implied = facts.kv_size_gib * GIB / facts.kv_tokens
        tolerance = 0.005 * GIB / facts.kv_tokens + 1
        if abs(implied - target_cell) > tolerance + target_cell * 0.002:
            notes.append(
                f"WARNING: the logged KV size implies {implied:,.0f} bytes/token but the model shape gives "
                f"{target_cell:,}; check --model/--config and the KV dtype"
            )
    post_pool = calibrated.post_pool_gib
    if facts.available_gpu_mem_gib is not None:
        # What the engine had left when it was ready, against what the pool left: the difference
        # is CUDA graphs and everything else allocated after the pool.
        slack = pre * (1 - fraction) + (rest - tokens * cell) / GIB
        post_pool = max(0.0, slack - facts.available_gpu_mem_gib)
        notes.append(f"post-pool allocations {post_pool:.2f} GiB (from available_gpu_mem at ready)")
    elif facts.graph_gib is not None:
        post_pool = facts.graph_gib
        notes.append(f"post-pool allocations {post_pool:.2f} GiB (CUDA graph capture)")
    weights = facts.weights_gib if facts.weights_gib is not None else calibrated.weights_gib
    if kv_dtype_bytes is not None and kv_dtype_bytes != logged_bytes:
        notes.append(f"KV cache at {kv_dtype_bytes} byte(s) an element, the log's engine at {logged_bytes}")
        calibrated = replace(calibrated, shape=with_kv_dtype_bytes(calibrated.shape, kv_dtype_bytes))
    return replace(
        calibrated,
        weights_gib=weights,
        pre_model_load_gib=pre,
        avail_after_weights_gib=avail,
        post_pool_gib=post_pool,
        notes=tuple(notes),
    )


def calibrate_from_ooms(inputs: PlanInputs, observations: Iterable[SpikeObservation]) -> PlanInputs:
    """Raise the activation model to what each OOM proved.

    An OOM at (fraction f, chunk c) means the chunk's transient needs exceeded the headroom
    at f by at least `tried - free`: spike(c) >= headroom(f) + tried - free, of which `tried`
    (the failed allocation) is the chunk's own buffer and the rest the base. Fragmentation
    seen in the message (reserved but unallocated) is part of that and is taken out when
    known (and becomes the fragmentation allowance). The model is raised, never lowered.
    """
    model = inputs.activation
    fragmentation = inputs.fragmentation_gib
    notes = list(inputs.notes)
    for obs in observations:
        if obs.chunk <= 0 or not 0 < obs.fraction < 1:
            continue
        proven = headroom_bytes(obs.fraction, inputs) + obs.tried_bytes - obs.free_bytes
        if obs.reserved_unallocated_bytes is not None and not obs.expandable_segments:
            proven -= obs.reserved_unallocated_bytes
            fragmentation = max(fragmentation, obs.reserved_unallocated_bytes / GIB)
        implied_ref = int(obs.tried_bytes / (obs.chunk / model.ref_chunk) ** model.exponent)
        implied_base = proven - obs.tried_bytes
        if implied_ref > model.ref_bytes or implied_base > model.base_bytes:
            model = replace(
                model,
                ref_bytes=max(model.ref_bytes, implied_ref),
                base_bytes=max(model.base_bytes, implied_base),
                source=f"OOM at fraction {obs.fraction}, chunk {obs.chunk}{' ' + obs.label if obs.label else ''}",
            )
            notes.append(
                f"spike at chunk {obs.chunk} is at least {proven / GIB:.2f} GiB "
                f"(OOM at fraction {obs.fraction}: {implied_base / GIB:.2f} GiB in use besides the chunk's "
                f"{obs.tried_bytes / GIB:.2f} GiB)"
            )
    return replace(inputs, activation=model, fragmentation_gib=fragmentation, notes=tuple(notes))


def calibrate_from_log(lines: Iterable[str], inputs: PlanInputs, kv_dtype_bytes: int | None = None) -> PlanInputs:
    """Calibrate from a node's log: its last sized engine start (planned for `kv_dtype_bytes`,
    None: the KV dtype that start ran), then the OOMs in it.

    Raises PlanError when the log holds no engine start that logged its pool size.
    """
    from opsctl import oom  # late import: oom uses the planner for its recommendations

    lines = list(lines)
    facts = last_sized_startup(lines)
    if facts is None:
        raise PlanError(
            "no engine start with a logged pool size (max_total_num_tokens= or 'KV Cache is allocated') in the log"
        )
    calibrated = calibrate_from_startup(inputs, facts, kv_dtype_bytes)
    observations = [obs for inc in oom.analyze(lines) if (obs := inc.spike_observation()) is not None]
    return calibrate_from_ooms(calibrated, observations)
