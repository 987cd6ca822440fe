"""The KV-cache memory a vLLM engine on CPU asks for: what its batch needs, not a share of the host.

Left to itself, vLLM on CPU profiles the model and reserves `gpu_memory_utilization` of the host's memory
(4 GiB of 24 for a 0.5M-parameter model), which also costs ~15 s of start-up on 2 cores. Given an explicit size
and eager mode, it skips the profile: the engine starts in half the time and holds what it can use.
"""

from __future__ import annotations

import os

from asyncrl.core.model.modeling import checkpoint_config

BLOCK_TOKENS = 128
"""Tokens per KV block rounded up to (vLLM's CPU block size is at most this): a sequence takes whole blocks."""
HEADROOM = 4
"""vLLM on CPU counts twice the K/V bytes per token that the shapes give (its cache layout), and a cache that
holds the batch twice keeps the prompts of the groups still in flight for prefix reuse."""
FLOOR_BYTES = 64 << 20
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def kv_bytes_per_token(text_config: dict, dtype: str) -> int:
    """Bytes of keys and values one token takes over all layers, from a language model's config
    (`checkpoint_config`)."""
    heads = text_config["num_attention_heads"]
    kv_heads = text_config.get("num_key_value_heads") or heads
    head_dim = text_config.get("head_dim") or text_config["hidden_size"] // heads
    return 2 * text_config["num_hidden_layers"] * kv_heads * head_dim * DTYPE_BYTES[dtype]


def cpu_kv_cache_bytes(model_path: str, dtype: str, max_batch_size: int, max_model_len: int,
                       memory_fraction: float) -> int | None:
    """KV-cache bytes for `max_batch_size` sequences of `max_model_len` tokens (HEADROOM times over, at least
    FLOOR_BYTES), capped at `memory_fraction` of the host's memory. None when the checkpoint has no readable
    `config.json` or an unknown dtype: vLLM then sizes the cache itself."""
    if dtype not in DTYPE_BYTES:
        return None
    try:
        per_token = kv_bytes_per_token(checkpoint_config(model_path), dtype)
    except (KeyError, TypeError, ValueError):
        return None
    blocks = -(-max_model_len // BLOCK_TOKENS)
    wanted = max(FLOOR_BYTES, HEADROOM * per_token * max_batch_size * blocks * BLOCK_TOKENS)
    return min(wanted, int(memory_fraction * host_memory_bytes()))


def host_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
