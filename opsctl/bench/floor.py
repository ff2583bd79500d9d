"""The memory-bandwidth floor of one decode step.

A decode (or verify) step must read the whole KV cache of the sequence at least once:
every layer's cell for every token of context. Nothing else is counted (not the weights,
not the activations), so the floor is a lower bound on step time, not a prediction.

    floor_step_s = context_tokens * kv_cell_bytes / (bandwidth_tbs * 1e12)

MLA keeps one compressed latent per token and layer (kv_lora_rank 512 + qk_rope_head_dim 64
= 576 values) and replicates it on every tensor-parallel rank, so each GPU reads the whole
cache: the per-GPU bandwidth is the right divisor, with no TP factor.
"""

from __future__ import annotations

from dataclasses import dataclass

# Kimi K2 / DeepSeek V3 MLA: (512 + 64) latent values * 2 bytes (bf16) * 61 layers.
KIMI_K2_KV_CELL_BYTES = (512 + 64) * 2 * 61  # 70,272 bytes per token of context


def kimi_kv_cell_bytes(kv_cache_dtype: str | None) -> int:
    """The Kimi K2 cell in the server's KV dtype (`/server_info`'s kv_cache_dtype): an fp8 cache
    reads half the bytes, so a bf16 floor would read it 2x better than it is."""
    return KIMI_K2_KV_CELL_BYTES // 2 if str(kv_cache_dtype or "").startswith("fp8") else KIMI_K2_KV_CELL_BYTES

# Per-GPU memory bandwidth in TB/s (1e12 bytes per second).
GPU_BANDWIDTH_TBS: dict[str, float] = {
    "rtx-pro-6000": 1.79,  # RTX PRO 6000 Blackwell, GDDR7 datasheet
    "h200": 4.8,  # H200 HBM3e datasheet; a device-to-device copy measures about 4.24
}

GPU_LABELS: dict[str, str] = {
    "rtx-pro-6000": "RTX PRO 6000",
    "h200": "H200",
}


@dataclass(frozen=True)
class Floor:
    """A bandwidth floor: `step_ms(context_tokens)` is the least time one step can take."""

    bandwidth_tbs: float  # TB/s = 1e12 bytes/s
    kv_cell_bytes: int  # bytes of KV per token of context, all layers
    label: str  # what the bandwidth belongs to, for legends ("RTX PRO 6000, 1.79 TB/s")

    def bytes_per_step(self, context_tokens: float) -> float:
        """Bytes one step reads: the whole KV cache, every layer once."""
        return context_tokens * self.kv_cell_bytes

    def step_ms(self, context_tokens: float) -> float:
        """Least time of one decode/verify step at `context_tokens`, in milliseconds."""
        return self.bytes_per_step(context_tokens) / (self.bandwidth_tbs * 1e12) * 1e3

    def ms_per_1k(self) -> float:
        """Slope of the floor: milliseconds per 1,000 tokens of context."""
        return self.step_ms(1000)

    def to_dict(self) -> dict:
        return {
            "bandwidth_tbs": self.bandwidth_tbs,
            "kv_cell_bytes": self.kv_cell_bytes,
            "label": self.label,
            "ms_per_1k": self.ms_per_1k(),
        }


def make_floor(
    gpu: str | None = "rtx-pro-6000",
    bandwidth_tbs: float | None = None,
    kv_cell_bytes: int = KIMI_K2_KV_CELL_BYTES,
) -> Floor:
    """Build the floor from a GPU name or an explicit bandwidth (which wins when given)."""
    if bandwidth_tbs is not None:
        if bandwidth_tbs <= 0:
            raise ValueError(f"bandwidth must be positive, got {bandwidth_tbs} TB/s")
        name = GPU_LABELS.get(gpu or "", "custom") if gpu else "custom"
        return Floor(bandwidth_tbs, kv_cell_bytes, f"{name}, {bandwidth_tbs:g} TB/s")
    if gpu not in GPU_BANDWIDTH_TBS:
        known = ", ".join(sorted(GPU_BANDWIDTH_TBS))
        raise ValueError(f"unknown GPU {gpu!r}; known: {known} (or give a bandwidth in TB/s)")
    bw = GPU_BANDWIDTH_TBS[gpu]
    return Floor(bw, kv_cell_bytes, f"{GPU_LABELS[gpu]}, {bw:g} TB/s")
