"""Timing model fitted to the incident's benchmark (TP8, triton MLA, DFlash, C=1).

All durations are real-time seconds; the simulator multiplies them by
SGLANG_SIM_TIME_FACTOR before sleeping.

Seed table (actual context, TTFT, decode ms/step)::

    1.4k  0.46 s   8.4      11k  4.3 s   50      32k  17.6 s  159
    64k   51 s     357      128k 3.1 min 714     185k 6.4 min 1430
"""

from __future__ import annotations

# Prefill: per-token cost plus an attention term that grows with the position; within 12% of
# every TTFT of the table (+11% at 11k, +10% at 64k, -7% at 185k: two constants, six points).
PREFILL_BASE_S_PER_TOKEN = 3.2e-4
PREFILL_ATTN_S_PER_TOKEN2 = 1.75e-8
# Decode: one verify step, interpolated linearly between the seed's measured points
# (context tokens, ms per step); flat below the first point and the last slope
# (~12.5 ms per 1k tokens) beyond 185k. A single "8.4 ms + 7.7 ms per 1k" line
# misses the middle of the table by up to 60 %, so the table itself is the model.
DECODE_POINTS_MS = (
    (1427, 8.4),
    (11402, 50.0),
    (31952, 159.0),
    (63903, 357.0),
    (127802, 714.0),
    (185000, 1430.0),
)
# Startup (the seed's node): weight load is SGLANG_SIM_LOAD_SECONDS, then graphs.
DEFAULT_LOAD_SECONDS = 210.0
CUDA_GRAPH_CAPTURE_SECONDS = 31.0
# The KV pool allocation and the warm-up request.
MEMORY_POOL_SECONDS = 2.0
WARMUP_SECONDS = 1.0


def prefill_chunk_seconds(chunk_tokens: int, prefix_tokens: int) -> float:
    """Time of one prefill chunk of ``chunk_tokens`` after ``prefix_tokens`` already in the KV cache."""
    c, p = chunk_tokens, prefix_tokens
    return c * (PREFILL_BASE_S_PER_TOKEN + PREFILL_ATTN_S_PER_TOKEN2 * (p + c / 2))


def chunks(new_tokens: int, chunk_size: int) -> list[int]:
    """Split a prefill of ``new_tokens`` into SGLang's chunks (chunk_size <= 0: no chunking)."""
    if new_tokens <= 0:
        return []
    if chunk_size is None or chunk_size <= 0:
        return [new_tokens]
    full, tail = divmod(new_tokens, chunk_size)
    return [chunk_size] * full + ([tail] if tail else [])


def prefill_seconds(prompt_tokens: int, cached_tokens: int = 0, chunk_size: int = 8192) -> float:
    """Total prefill time of a prompt whose first ``cached_tokens`` hit the radix cache."""
    total = 0.0
    prefix = cached_tokens
    for c in chunks(prompt_tokens - cached_tokens, chunk_size):
        total += prefill_chunk_seconds(c, prefix)
        prefix += c
    return total


def decode_step_seconds(context_tokens: int) -> float:
    """One decode (verify) step at this context length (the seed's ms/step column)."""
    pts = DECODE_POINTS_MS
    if context_tokens <= pts[0][0]:
        return pts[0][1] / 1000.0
    for (x0, y0), (x1, y1) in zip(pts, pts[1:], strict=False):
        if context_tokens <= x1:
            return (y0 + (y1 - y0) * (context_tokens - x0) / (x1 - x0)) / 1000.0
    (x0, y0), (x1, y1) = pts[-2], pts[-1]
    return (y1 + (y1 - y0) * (context_tokens - x1) / (x1 - x0)) / 1000.0


def decode_steps(max_new_tokens: int, accept_length: float) -> int:
    """Verify steps needed to commit ``max_new_tokens`` tokens at ``accept_length`` per step.

    The first token comes from the prefill, so it costs no step. Each step commits
    ``accept_length`` tokens on average; fractions accumulate (floor of the running sum).
    """
    remaining = max(0, max_new_tokens - 1)
    steps = 0
    committed = 0.0
    acc = max(1.0, accept_length)
    while remaining > 0:
        steps += 1
        committed += acc
        take = min(remaining, int(committed))
        committed -= take
        remaining -= take
    return steps


def generate_seconds(
    prompt_tokens: int,
    max_new_tokens: int,
    *,
    cached_tokens: int = 0,
    chunk_size: int = 8192,
    accept_length: float = 1.0,
) -> tuple[float, float]:
    """(TTFT, total latency) of one request running alone, before the time factor."""
    ttft = prefill_seconds(prompt_tokens, cached_tokens, chunk_size)
    total = ttft
    context = prompt_tokens + 1
    remaining = max(0, max_new_tokens - 1)
    committed = 0.0
    acc = max(1.0, accept_length)
    while remaining > 0:
        total += decode_step_seconds(context)
        committed += acc
        take = min(remaining, int(committed))
        committed -= take
        remaining -= take
        context += take
    return ttft, total
