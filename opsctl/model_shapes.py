"""Model shapes that decide the KV cache's bytes per token, with presets.

Only the attention geometry matters to the planner: how many bytes one token of
context costs in the KV pool of one GPU. Weights are a separate input (GiB per GPU).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path


class ShapeError(ValueError):
    """A model shape could not be built (bad preset name, unreadable or incomplete config)."""


@dataclass(frozen=True)
class DraftShape:
    """A DFlash draft model's KV geometry (per-head K/V, not MLA)."""

    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    num_layers: int
    dtype_bytes: int = 2


@dataclass(frozen=True)
class ModelShape:
    """KV geometry of the target model.

    MLA models (DeepSeek V3, Kimi K2) set `kv_lora_rank` and `qk_rope_head_dim`; one
    latent vector per token and layer, the same on every TP rank. Other models set
    `num_kv_heads`/`head_dim`/`v_head_dim`; their heads are split across TP ranks.
    """

    name: str
    num_layers: int
    kv_dtype_bytes: int = 2
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    v_head_dim: int | None = None
    draft: DraftShape | None = None

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None


# ASSUMPTION, not read from a checkpoint: the DFlash drafter for Kimi K2.6 is taken to
# have 8 KV heads of dim 128 (K and V) over 5 layers in bf16. Override with --draft-*
# flags or a config.json once the drafter's real config is at hand.
ASSUMED_KIMI_DFLASH_DRAFT = DraftShape(num_kv_heads=8, head_dim=128, v_head_dim=128, num_layers=5)

PRESETS: dict[str, ModelShape] = {
    # Kimi K2.6 uses the DeepSeek V3 architecture: kv_lora_rank 512, rope dim 64, 61 layers.
    "kimi-k2.6": ModelShape(
        name="kimi-k2.6", num_layers=61, kv_lora_rank=512, qk_rope_head_dim=64, draft=ASSUMED_KIMI_DFLASH_DRAFT
    ),
    "deepseek-v3": ModelShape(name="deepseek-v3", num_layers=61, kv_lora_rank=512, qk_rope_head_dim=64),
}

_DTYPE_BYTES = {
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "float32": 4,
    "float": 4,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}


def preset(name: str) -> ModelShape:
    """A preset by name; raises ShapeError listing the known names."""
    try:
        return PRESETS[name.lower()]
    except KeyError:
        raise ShapeError(f"unknown model preset {name!r}; known: {', '.join(sorted(PRESETS))}") from None


def with_kv_dtype_bytes(shape: ModelShape, nbytes: int) -> ModelShape:
    """`shape` with a KV cache of `nbytes`-byte elements, its DFlash draft's too (SGLang 0.5.23
    gives the draft pool the target's KV dtype: `resolve_dflash_draft_cell_size`)."""
    draft = None if shape.draft is None else replace(shape.draft, dtype_bytes=nbytes)
    return replace(shape, kv_dtype_bytes=nbytes, draft=draft)


def dtype_bytes(name: str | None, default: int = 2) -> int:
    """Bytes per element of a dtype name (`bfloat16`, `fp8_e4m3`, `torch.bfloat16`, `auto`)."""
    if not name or name == "auto":
        return default
    key = name.removeprefix("torch.").lower()
    if key.startswith("float8"):
        return 1
    if key not in _DTYPE_BYTES:
        raise ShapeError(f"unknown KV dtype {name!r}; use bfloat16, float16, float32 or fp8_e4m3")
    return _DTYPE_BYTES[key]


def _text_config(config: dict) -> dict:
    # Multimodal wrappers (Kimi K2.5+ VL checkpoints) keep the language model under text_config.
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) and "num_hidden_layers" in inner else config


def _require_int(config: dict, key: str, path: Path) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ShapeError(f"{path}: '{key}' is missing or not a positive integer")
    return value


def shape_from_hf_config(
    path: str | Path, *, kv_dtype: str | None = None, draft: DraftShape | None = None
) -> ModelShape:
    """Build a ModelShape from a Hugging Face `config.json` (or the directory holding it).

    MLA is detected by `kv_lora_rank`; otherwise `num_key_value_heads` (default
    `num_attention_heads`) and `head_dim` (default `hidden_size // num_attention_heads`).
    """
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise ShapeError(f"{path}: no such file; pass the model's config.json or its directory") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ShapeError(f"{path}: not a readable JSON config ({exc})") from None
    if not isinstance(config, dict):
        raise ShapeError(f"{path}: expected a JSON object")
    config = _text_config(config)
    layers = _require_int(config, "num_hidden_layers", path)
    # The KV cache follows the model's dtype under SGLang's --kv-cache-dtype auto, except that a
    # float32 checkpoint is served in float16 (`_get_and_verify_dtype`): 2 bytes, not 4.
    model_dtype = config.get("torch_dtype") or config.get("dtype")
    nbytes = dtype_bytes(kv_dtype) if kv_dtype else min(2, dtype_bytes(model_dtype if isinstance(model_dtype, str) else None))
    name = str(config.get("model_type") or path.parent.name or "custom")
    if config.get("kv_lora_rank") is not None:
        return ModelShape(
            name=name,
            num_layers=layers,
            kv_dtype_bytes=nbytes,
            kv_lora_rank=_require_int(config, "kv_lora_rank", path),
            qk_rope_head_dim=_require_int(config, "qk_rope_head_dim", path),
            draft=draft,
        )
    heads = _require_int(config, "num_attention_heads", path)
    kv_heads = config.get("num_key_value_heads", heads)
    if not isinstance(kv_heads, int) or kv_heads <= 0:
        raise ShapeError(f"{path}: 'num_key_value_heads' is not a positive integer")
    head_dim = config.get("head_dim") or _require_int(config, "hidden_size", path) // heads
    v_head_dim = config.get("v_head_dim") or head_dim
    return ModelShape(
        name=name,
        num_layers=layers,
        kv_dtype_bytes=nbytes,
        num_kv_heads=kv_heads,
        head_dim=int(head_dim),
        v_head_dim=int(v_head_dim),
        draft=draft,
    )
