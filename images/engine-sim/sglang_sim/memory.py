"""GPU memory model of one TP rank, as SGLang 0.5.23 sizes and uses it.

Pure functions and a small state object, no I/O, so tests and other tools can
compute what the simulator will do. All sizes are bytes unless a name ends in
``_gib`` / ``_mib``.

Startup (SGLang's formula, ``mem_cache/kv_cache_configurator.py``)::

    pre   = total - non_torch                    # free after distributed init
    avail = pre - weights                         # free after the weights load
    rest  = avail - pre * (1 - mem_fraction_static)
    rest <= 0  -> "Loaded weights leave no GPU memory for the KV cache ..."
    max_total_num_tokens = rest_bytes // cell     # rounded down to page_size

Then CUDA-graph capture takes ``graph`` bytes (a PyTorch private pool) and the
warm-up forward allocates the serving overhead: non-PyTorch memory that CUDA
libraries create lazily (NCCL channels, cuBLAS/Triton workspaces) and persistent
PyTorch buffers. What is left is the headroom every prefill chunk's activation
buffer must fit in. Without ``expandable_segments:True`` each completed prefill
leaves reserved-but-unallocated blocks behind (fragmentation) that a
differently sized block cannot reuse, up to a cap; that lowers free memory.
"""

from __future__ import annotations

import dataclasses
import math
import os

GIB = 1 << 30
MIB = 1 << 20

# Simulated GPU and its defaults (RTX PRO 6000 Blackwell as on the incident node).
DEFAULT_GPU_MEM_GIB = 94.97
# Non-PyTorch memory in use before the weights load (CUDA context, NCCL init,
# plus the 700 MiB another process holds on the GPU): pre_model_load = 93.80 GiB.
DEFAULT_NON_TORCH_GIB = 1.17
# Memory held on the GPU by another process (the "Process N has ..." part of
# PyTorch's OOM message). It is part of DEFAULT_NON_TORCH_GIB.
DEFAULT_OTHER_PROCESS_MIB = 700.0

# Kimi K2 MLA KV cell in bf16: (kv_lora_rank 512 + qk_rope_head_dim 64) * 61 layers * 2 B.
MLA_KV_LORA_RANK = 512
MLA_QK_ROPE_HEAD_DIM = 64
MLA_NUM_LAYERS = 61

# DFlash draft (defaults: 8 KV heads split over TP, head_dim 128, v_head_dim 128, 5 layers).
DEFAULT_DRAFT_KV_HEADS = 8
DEFAULT_DRAFT_HEAD_DIM = 128
DEFAULT_DRAFT_V_HEAD_DIM = 128
DEFAULT_DRAFT_LAYERS = 5

# The incident node's pool: fraction 0.93, TP8, DFLASH draft, page size 1.
SEED_FRACTION = 0.93
SEED_MAX_TOTAL_NUM_TOKENS = 195011

# CUDA-graph capture: private pool of the captured graphs (0.71 GB in the log).
GRAPH_MEM_GIB = 0.71
# Allocated lazily by the warm-up forward, kept while serving.
SERVING_NON_TORCH_GIB = 1.40  # NCCL channels, cuBLAS/Triton workspaces
SERVING_TORCH_GIB = 1.2456  # persistent PyTorch buffers (logits, sampling, draft state)

# Activation buffer of one prefill chunk: 896 MiB at 8192 tokens (8192 x top-8 experts x hidden
# 7168 x 2 B, the MoE dispatch buffer), linear in the chunk as that buffer is.
ACTIVATION_MIB_AT_8192 = 896.0
# Without expandable segments, each completed prefill request leaves this share of
# its largest activation block as reserved-but-unallocated memory, up to the cap.
FRAGMENTATION_RATIO = 0.8
FRAGMENTATION_CAP_GIB = 1.40


def env_float(name: str, default: float) -> float:
    """Read a float knob from the environment; an empty or bad value keeps the default."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        return default


def mla_cell_bytes(kv_cache_dtype: str = "auto") -> int:
    """Bytes of MLA KV per token (replicated on every TP rank)."""
    dtype_bytes = 1 if kv_cache_dtype.startswith("fp8") else 2
    return (MLA_KV_LORA_RANK + MLA_QK_ROPE_HEAD_DIM) * MLA_NUM_LAYERS * dtype_bytes


def draft_cell_bytes(
    tp_size: int,
    kv_heads: int = DEFAULT_DRAFT_KV_HEADS,
    head_dim: int = DEFAULT_DRAFT_HEAD_DIM,
    v_head_dim: int = DEFAULT_DRAFT_V_HEAD_DIM,
    layers: int = DEFAULT_DRAFT_LAYERS,
    dtype_bytes: int = 2,
) -> int:
    """Bytes of DFlash draft KV per token on one rank: heads are split over TP (at least 1)."""
    heads_per_rank = max(1, kv_heads // max(1, tp_size))
    return heads_per_rank * (head_dim + v_head_dim) * layers * dtype_bytes


def default_weights_gib(
    gpu_mem_gib: float = DEFAULT_GPU_MEM_GIB,
    non_torch_gib: float = DEFAULT_NON_TORCH_GIB,
    cell: int | None = None,
) -> float:
    """Per-GPU weights that give exactly SEED_MAX_TOTAL_NUM_TOKENS at SEED_FRACTION.

    Places ``rest`` in the middle of the token's byte range so float rounding of
    the GiB figures cannot move the result; about 74.006 GiB with the defaults.
    """
    if cell is None:
        cell = mla_cell_bytes() + draft_cell_bytes(8)
    pre = gpu_mem_gib - non_torch_gib
    rest_gib = (SEED_MAX_TOTAL_NUM_TOKENS + 0.5) * cell / GIB
    return round(pre * SEED_FRACTION - rest_gib, 7)


def default_chunked_prefill_size(gpu_mem_gib: float) -> int:
    """SGLang's default --chunked-prefill-size for a GPU of this size."""
    if gpu_mem_gib < 20:
        return 2048
    if gpu_mem_gib < 60:
        return 4096
    if gpu_mem_gib < 160:
        return 8192
    return 16384


def default_mem_fraction_static(gpu_mem_gib: float, chunked_prefill_size: int, tp_size: int) -> float:
    """SGLang's default fraction when the flag is absent (reserved memory, at least 10 GiB here)."""
    gpu_mib = gpu_mem_gib * 1024
    reserved = 512 + max(chunked_prefill_size, 2048) * 1.5 + tp_size / 8 * 1024 + 1024
    if gpu_mem_gib > 60:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mib - reserved) / gpu_mib, 3)


def activation_bytes(chunk_tokens: int) -> int:
    """Activation buffer one prefill chunk allocates: 896 MiB * c / 8192.

    (The seed's own account said 224 MiB at 4096, a square law; the buffer that failed, the MoE
    dispatch of 8192 tokens, grows linearly, and the planner models it so.)"""
    return int(ACTIVATION_MIB_AT_8192 * MIB * chunk_tokens / 8192)


def expandable_segments_enabled(environ: dict | None = None) -> bool:
    """True when PYTORCH_CUDA_ALLOC_CONF or PYTORCH_ALLOC_CONF sets expandable_segments:True."""
    env = os.environ if environ is None else environ
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        for part in env.get(name, "").split(","):
            key, _, value = part.partition(":")
            if key.strip() == "expandable_segments" and value.strip().lower() == "true":
                return True
    return False


class NoKVMemoryError(ValueError):
    """SGLang's startup error when the weights leave nothing for the KV pool."""


@dataclasses.dataclass(frozen=True)
class GPUConfig:
    """The simulated GPU and the costs the model charges against it."""

    total_gib: float = DEFAULT_GPU_MEM_GIB
    non_torch_gib: float = DEFAULT_NON_TORCH_GIB
    weights_gib: float | None = None  # None: default_weights_gib()
    other_process_mib: float = DEFAULT_OTHER_PROCESS_MIB
    graph_gib: float = GRAPH_MEM_GIB
    serving_non_torch_gib: float = SERVING_NON_TORCH_GIB
    serving_torch_gib: float = SERVING_TORCH_GIB
    draft_kv_heads: int = DEFAULT_DRAFT_KV_HEADS
    draft_head_dim: int = DEFAULT_DRAFT_HEAD_DIM
    draft_v_head_dim: int = DEFAULT_DRAFT_V_HEAD_DIM
    draft_layers: int = DEFAULT_DRAFT_LAYERS

    @classmethod
    def from_env(cls, environ: dict | None = None) -> GPUConfig:
        """Build from the SGLANG_SIM_* knobs (see the README)."""
        env = os.environ if environ is None else environ

        def f(name, default):
            raw = env.get(name, "").strip()
            try:
                return float(raw) if raw else default
            except ValueError:
                return default

        weights = env.get("SGLANG_SIM_WEIGHTS_GIB", "").strip()
        return cls(
            total_gib=f("SGLANG_SIM_GPU_MEM_GIB", DEFAULT_GPU_MEM_GIB),
            non_torch_gib=f("SGLANG_SIM_NON_TORCH_GIB", DEFAULT_NON_TORCH_GIB),
            weights_gib=f("SGLANG_SIM_WEIGHTS_GIB", 0.0) if weights else None,
            other_process_mib=f("SGLANG_SIM_OTHER_PROCESS_MIB", DEFAULT_OTHER_PROCESS_MIB),
            draft_kv_heads=int(f("SGLANG_SIM_DRAFT_KV_HEADS", DEFAULT_DRAFT_KV_HEADS)),
            draft_head_dim=int(f("SGLANG_SIM_DRAFT_HEAD_DIM", DEFAULT_DRAFT_HEAD_DIM)),
            draft_v_head_dim=int(f("SGLANG_SIM_DRAFT_V_HEAD_DIM", DEFAULT_DRAFT_V_HEAD_DIM)),
            draft_layers=int(f("SGLANG_SIM_DRAFT_LAYERS", DEFAULT_DRAFT_LAYERS)),
        )

    def weights(self) -> float:
        if self.weights_gib is not None:
            return self.weights_gib
        return default_weights_gib(self.total_gib, self.non_torch_gib)


@dataclasses.dataclass(frozen=True)
class KVPlan:
    """What SGLang logs at startup, per rank (GiB figures as SGLang's "GB")."""

    pre_model_load_gib: float
    weights_gib: float
    avail_after_weights_gib: float
    rest_bytes: int
    target_cell_bytes: int
    draft_cell_bytes: int
    max_total_num_tokens: int
    target_kv_bytes: int
    draft_kv_bytes: int
    avail_after_pool_gib: float
    graph_gib: float
    avail_after_graph_gib: float
    headroom_bytes: int  # free while serving, before fragmentation

    @property
    def cell_bytes(self) -> int:
        return self.target_cell_bytes + self.draft_cell_bytes


def plan_kv(
    gpu: GPUConfig,
    mem_fraction_static: float,
    *,
    tp_size: int = 8,
    page_size: int = 1,
    speculative_algorithm: str | None = "DFLASH",
    kv_cache_dtype: str = "auto",
    cuda_graph: bool = True,
) -> KVPlan:
    """Size the KV pool as SGLang does; raise NoKVMemoryError when nothing is left."""
    pre = gpu.total_gib - gpu.non_torch_gib
    weights = gpu.weights()
    avail = pre - weights
    rest = avail - pre * (1 - mem_fraction_static)
    if rest <= 0:
        minimum = 1 - avail / pre
        suggested = math.ceil(minimum * 1000) / 1000
        raise NoKVMemoryError(
            "Loaded weights leave no GPU memory for the KV cache under "
            f"--mem-fraction-static={mem_fraction_static}. "
            f"Raise --mem-fraction-static above {suggested:.3f} "
            f"(minimum viable = 1 - available/pre = {minimum:.4f}). If using speculative "
            "decoding, draft weights are now counted."
        )
    rest_bytes = int(rest * GIB)
    target_cell = mla_cell_bytes(kv_cache_dtype)
    draft_cell = 0
    if speculative_algorithm and speculative_algorithm.upper() == "DFLASH":
        draft_cell = draft_cell_bytes(
            tp_size, gpu.draft_kv_heads, gpu.draft_head_dim, gpu.draft_v_head_dim, gpu.draft_layers
        )
    tokens = rest_bytes // (target_cell + draft_cell)
    page = max(1, page_size)
    tokens = tokens // page * page
    target_kv = tokens * target_cell
    draft_kv = tokens * draft_cell
    after_pool = avail - (target_kv + draft_kv) / GIB
    graph = gpu.graph_gib if cuda_graph else 0.0
    after_graph = after_pool - graph
    headroom = after_graph - gpu.serving_non_torch_gib - gpu.serving_torch_gib
    return KVPlan(
        pre_model_load_gib=pre,
        weights_gib=weights,
        avail_after_weights_gib=avail,
        rest_bytes=rest_bytes,
        target_cell_bytes=target_cell,
        draft_cell_bytes=draft_cell,
        max_total_num_tokens=tokens,
        target_kv_bytes=target_kv,
        draft_kv_bytes=draft_kv,
        avail_after_pool_gib=after_pool,
        graph_gib=graph,
        avail_after_graph_gib=after_graph,
        headroom_bytes=int(headroom * GIB),
    )


@dataclasses.dataclass
class OOMInfo:
    """The figures PyTorch's OOM message reports."""

    tried_bytes: int
    total_bytes: int
    free_bytes: int
    other_process_bytes: int
    process_in_use_bytes: int
    allocated_bytes: int
    private_pool_bytes: int
    reserved_unallocated_bytes: int


class MemoryState:
    """The rank's memory while serving: headroom, fragmentation, the OOM check."""

    def __init__(self, gpu: GPUConfig, plan: KVPlan, expandable_segments: bool):
        self.gpu = gpu
        self.plan = plan
        self.expandable_segments = expandable_segments
        self.fragmentation_bytes = 0
        self.cap_bytes = int(FRAGMENTATION_CAP_GIB * GIB)

    def free_bytes(self) -> int:
        return self.plan.headroom_bytes - self.fragmentation_bytes

    def check_chunk(self, chunk_tokens: int) -> OOMInfo | None:
        """Return the OOM figures if this chunk's activation buffer does not fit, else None."""
        need = activation_bytes(chunk_tokens)
        free = self.free_bytes()
        if need <= free:
            return None
        return self.oom_info(need)

    def oom_info(self, need: int, free: int | None = None) -> OOMInfo:
        gpu, plan = self.gpu, self.plan
        total = int(gpu.total_gib * GIB)
        free = self.free_bytes() if free is None else free
        other = int(gpu.other_process_mib * MIB)
        allocated = int(
            (plan.weights_gib + plan.graph_gib + gpu.serving_torch_gib) * GIB
            + plan.target_kv_bytes
            + plan.draft_kv_bytes
        )
        return OOMInfo(
            tried_bytes=need,
            total_bytes=total,
            free_bytes=max(0, free),
            other_process_bytes=other,
            process_in_use_bytes=total - max(0, free) - other,
            allocated_bytes=allocated,
            private_pool_bytes=int(plan.graph_gib * GIB),
            reserved_unallocated_bytes=self.fragmentation_bytes,
        )

    def finish_request(self, largest_chunk_tokens: int) -> None:
        """Account the fragmentation a completed prefill leaves behind."""
        if self.expandable_segments or largest_chunk_tokens <= 0:
            return
        added = int(FRAGMENTATION_RATIO * activation_bytes(largest_chunk_tokens))
        self.fragmentation_bytes = min(self.cap_bytes, self.fragmentation_bytes + added)


def startup_oom(gpu: GPUConfig, plan: KVPlan, stage: str) -> OOMInfo | None:
    """OOM at startup: CUDA-graph capture ("graph") or the warm-up forward ("warmup")."""
    total = int(gpu.total_gib * GIB)
    other = int(gpu.other_process_mib * MIB)
    base_alloc = int(plan.weights_gib * GIB) + plan.target_kv_bytes + plan.draft_kv_bytes
    if stage == "graph":
        need = int(plan.graph_gib * GIB)
        free = int(plan.avail_after_pool_gib * GIB)
        allocated = base_alloc
        private = 0
    else:
        need = int((gpu.serving_non_torch_gib + gpu.serving_torch_gib) * GIB)
        free = int(plan.avail_after_graph_gib * GIB)
        allocated = base_alloc + int(plan.graph_gib * GIB)
        private = int(plan.graph_gib * GIB)
    if need <= free:
        return None
    free = max(0, free)
    return OOMInfo(
        tried_bytes=need if stage == "graph" else int(gpu.serving_torch_gib * GIB),
        total_bytes=total,
        free_bytes=free,
        other_process_bytes=other,
        process_in_use_bytes=total - free - other,
        allocated_bytes=allocated,
        private_pool_bytes=private,
        reserved_unallocated_bytes=0,
    )


def format_size(size: int) -> str:
    """PyTorch's format_size (c10/cuda/CUDACachingAllocator.cpp)."""
    if size <= 1024:
        return f"{size} bytes"
    if size <= 1048576:
        return f"{size / 1024.0:.2f} KiB"
    if size <= 1073741824:
        return f"{size / 1048576.0:.2f} MiB"
    return f"{size / 1073741824.0:.2f} GiB"


def oom_message(info: OOMInfo, *, device: int = 0, other_pid: int | None = None) -> str:
    """PyTorch's ``torch.OutOfMemoryError`` line for these figures."""
    proc = ""
    if info.other_process_bytes > 0 and other_pid is not None:
        proc = f"Process {other_pid} has {format_size(info.other_process_bytes)} memory in use. "
    pools = ""
    if info.private_pool_bytes > 0:
        pools = (
            f"with {format_size(info.private_pool_bytes)} allocated in private pools (e.g., CUDA Graphs), "
        )
    return (
        "torch.OutOfMemoryError: CUDA out of memory. "
        f"Tried to allocate {format_size(info.tried_bytes)}. "
        f"GPU {device} has a total capacity of {format_size(info.total_bytes)} "
        f"of which {format_size(info.free_bytes)} is free. "
        f"{proc}"
        "Including non-PyTorch memory, "
        f"this process has {format_size(info.process_in_use_bytes)} memory in use. "
        f"Of the allocated memory {format_size(info.allocated_bytes)} is allocated by PyTorch, "
        f"{pools}"
        f"and {format_size(info.reserved_unallocated_bytes)} is reserved by PyTorch but unallocated. "
        "If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  "
        "See documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )
