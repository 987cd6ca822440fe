"""A tiny llama GGUF file written with the `gguf` package (random float32 weights, a byte-level BPE tokenizer
with a chat template): what `asyncrl import-model --gguf` reads in the tests, without any download."""

from __future__ import annotations

from pathlib import Path

import numpy as np

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def byte_alphabet() -> list[str]:
    """GPT-2's byte-to-unicode table: one printable character per byte (the byte-level BPE's base tokens)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, extra = [], 0
    for byte in range(256):
        if byte in printable:
            chars.append(chr(byte))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def write_tiny_llama_gguf(path: str | Path, seed: int = 0, layers: int = 2, hidden: int = 64,
                          intermediate: int = 128) -> Path:
    """A llama GGUF at `path`: one 64-wide head (and one KV head), `layers` blocks, tied embeddings."""
    import gguf

    path = Path(path)
    rng = np.random.default_rng(seed)
    tokens = list(SPECIALS) + byte_alphabet() + ["Ġt", "he"]
    merges = ["Ġ t", "h e"]
    vocab = len(tokens)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-test-llama")
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(intermediate)
    writer.add_head_count(hidden // 64)
    writer.add_head_count_kv(1)
    writer.add_rope_dimension_count(64)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL] * len(SPECIALS) + [gguf.TokenType.NORMAL] * (vocab - len(SPECIALS)))
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_chat_template(CHAT_TEMPLATE)

    def weight(*shape):
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    writer.add_tensor("token_embd.weight", weight(vocab, hidden))
    writer.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    for i in range(layers):
        block = f"blk.{i}"
        writer.add_tensor(f"{block}.attn_norm.weight", np.ones(hidden, dtype=np.float32))
        writer.add_tensor(f"{block}.attn_q.weight", weight(hidden, hidden))
        writer.add_tensor(f"{block}.attn_k.weight", weight(64, hidden))
        writer.add_tensor(f"{block}.attn_v.weight", weight(64, hidden))
        writer.add_tensor(f"{block}.attn_output.weight", weight(hidden, hidden))
        writer.add_tensor(f"{block}.ffn_norm.weight", np.ones(hidden, dtype=np.float32))
        writer.add_tensor(f"{block}.ffn_gate.weight", weight(intermediate, hidden))
        writer.add_tensor(f"{block}.ffn_up.weight", weight(intermediate, hidden))
        writer.add_tensor(f"{block}.ffn_down.weight", weight(hidden, intermediate))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
