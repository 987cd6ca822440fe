"""The KV cache a vLLM engine on CPU asks for, against hand-computed sizes."""

from __future__ import annotations

import json

import pytest

from asyncrl.core.engines.kv_cache_size import (
    FLOOR_BYTES,
    cpu_kv_cache_bytes,
    host_memory_bytes,
    kv_bytes_per_token,
)

QWEN_LIKE = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}


def test_bytes_per_token_count_keys_and_values_of_every_layer():
    # 2 (K, V) x 30 layers x 3 KV heads x 64 (576 / 9) x 4 bytes
    assert kv_bytes_per_token(QWEN_LIKE, "float32") == 46_080
    assert kv_bytes_per_token({**QWEN_LIKE, "head_dim": 128}, "bfloat16") == 2 * 30 * 3 * 128 * 2
    # No num_key_value_heads: multi-head attention, one KV head per head.
    assert kv_bytes_per_token({**QWEN_LIKE, "num_key_value_heads": None}, "float16") == 2 * 30 * 9 * 64 * 2


def test_the_cache_holds_the_batch_four_times_over_within_its_share_of_the_host(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"text_config": QWEN_LIKE}))  # a multimodal layout
    # 8 sequences of 200 tokens take 2 blocks of 128 each: 4 x 46,080 x 8 x 256
    assert cpu_kv_cache_bytes(str(tmp_path), "float32", 8, 200, 1.0) == 4 * 46_080 * 8 * 256
    assert cpu_kv_cache_bytes(str(tmp_path), "float32", 1, 8, 1.0) == FLOOR_BYTES
    assert cpu_kv_cache_bytes(str(tmp_path), "float32", 4096, 4096, 0.01) == int(0.01 * host_memory_bytes())


@pytest.mark.parametrize("config, dtype", [(None, "float32"), ({"hidden_size": 8}, "float32"),
                                           (QWEN_LIKE, "int8")])
def test_a_checkpoint_it_cannot_read_leaves_the_size_to_vllm(tmp_path, config, dtype):
    if config is not None:
        (tmp_path / "config.json").write_text(json.dumps(config))
    assert cpu_kv_cache_bytes(str(tmp_path), dtype, 8, 64, 0.2) is None
