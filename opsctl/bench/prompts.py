"""Prompts of an exact token count, each unique from its first token on.

A radix (prefix) cache serves any prefix it has seen before, which turns a prefill
measurement into a cache lookup. Every prompt here therefore starts with a nonce, so its
longest common prefix with any earlier prompt is zero, or at most a token or two in text mode.

Two modes:
- ``ids``: token ids are sent as `input_ids`; the server counts them as given, so the
  length is exact by construction. The default.
- ``text``: words are sent as `text`; the server's tokenizer decides the count, so the
  runner checks the reported `prompt_tokens` and scales the word count by the ratio the
  warm-up request observed.
"""

from __future__ import annotations

import random
import re
import secrets

# Token ids drawn for prompts: inside the ordinary-text part of large BPE vocabularies
# (Kimi K2: 163,840 ids; special tokens sit at the top), so no id is a control token.
# Four digits keep the JSON body small: 185k ids are ~0.9 MB, under the 1 MiB request
# limit of aiohttp-based servers (a real SGLang has none).
TOKEN_ID_LOW = 1000
TOKEN_ID_HIGH = 10000
NONCE_TOKENS = 4  # 26 bits of randomness per token; four make a collision negligible

# Ordinary prose, so text mode tokenizes at roughly one token per word on real tokenizers.
_FILLER_WORDS = (
    "the quick brown fox jumps over the lazy dog while a patient engineer reads the "
    "server log and counts every token that passes through the cache before it writes "
    "a careful note about memory bandwidth latency and the cost of long context"
).split()

_CTX_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*$")


def parse_context(value: str) -> int:
    """'8k' -> 8000, '1.5k' -> 1500, '128000' -> 128000, '1m' -> 1000000 (SI: k = 1000)."""
    m = _CTX_RE.match(value)
    if not m:
        raise ValueError(f"not a context length: {value!r} (use e.g. 8k, 1.5k or 32000)")
    number, unit = float(m.group(1)), m.group(2).lower()
    tokens = int(round(number * {"": 1, "k": 1000, "m": 1_000_000}[unit]))
    if tokens < 16:
        raise ValueError(f"context {value!r} is too small (at least 16 tokens)")
    return tokens


def parse_contexts(value: str) -> list[int]:
    """'1k,8k,32k' -> [1000, 8000, 32000]; order is kept, duplicates are refused."""
    contexts = [parse_context(part) for part in value.split(",") if part.strip()]
    if not contexts:
        raise ValueError("no context lengths given")
    if len(set(contexts)) != len(contexts):
        raise ValueError(f"duplicate context lengths in {value!r}")
    return contexts


def format_context(tokens: float) -> str:
    """1400 -> '1.4k', 11000 -> '11k', 185000 -> '185k', 512 -> '512'."""
    if tokens < 1000:
        return f"{tokens:.0f}"
    k = tokens / 1000
    if k < 10:
        return f"{k:.1f}".rstrip("0").rstrip(".") + "k"
    return f"{k:.0f}k"


def new_nonce() -> str:
    """A fresh random hex string; one per request."""
    return secrets.token_hex(6)


def make_input_ids(n_tokens: int, nonce: str, seed: int = 0) -> list[int]:
    """Exactly `n_tokens` ids: NONCE_TOKENS ids derived from `nonce`, then a fixed filler.

    The filler is the same for every prompt of a run (deterministic from `seed`), so the
    content does not vary between points; only the nonce at the front differs.
    """
    if n_tokens < NONCE_TOKENS + 1:
        raise ValueError(f"a prompt needs at least {NONCE_TOKENS + 1} tokens")
    nonce_rng = random.Random(nonce)
    head = [nonce_rng.randrange(TOKEN_ID_LOW, TOKEN_ID_HIGH) for _ in range(NONCE_TOKENS)]
    filler_rng = random.Random(seed)
    tail = [filler_rng.randrange(TOKEN_ID_LOW, TOKEN_ID_HIGH) for _ in range(n_tokens - NONCE_TOKENS)]
    return head + tail


def make_text(n_words: int, nonce: str) -> str:
    """`n_words` whitespace-separated words, the first one is the nonce (hex, so its first token varies)."""
    if n_words < 2:
        raise ValueError("a text prompt needs at least 2 words")
    words = [nonce]
    words.extend(_FILLER_WORDS[i % len(_FILLER_WORDS)] for i in range(n_words - 1))
    return " ".join(words)
