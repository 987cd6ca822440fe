"""A checkpoint's tokenizer loads as it was written: `ModelTokenizer.load` holds what transformers picks against
the checkpoint's own tokenizer.json, falls back to that file when they differ, and refuses a tokenizer with
more tokens than the model's embedding has rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from asyncrl.core.model.tokenizer import ROUND_TRIP_SAMPLES, ModelTokenizer

TEXTS = ["Tom has 3 apples and buys 4 more. How many apples?", "A train leaves at 5 and arrives at 9.",
         "Hello, World! naive cafe"] * 40


def custom_bpe_checkpoint(directory: Path, vocab_size: int | None = None) -> tuple[Path, Tokenizer]:
    """A checkpoint directory (config.json with `model_type: qwen2`, no weights needed) whose tokenizer is a BPE
    with a whitespace pre-tokenizer, saved as tokenizer.json with a PreTrainedTokenizerFast config."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.BPEDecoder()
    tok.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<bos>", "<eos>",
                                                                                         "<unk>"]))
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
        "pad_token": "<pad>", "unk_token": "<unk>"}))
    size = tok.get_vocab_size() if vocab_size is None else vocab_size
    (directory / "config.json").write_text(json.dumps({"model_type": "qwen2", "vocab_size": size}))
    return directory, tok


def test_a_custom_tokenizer_loads_as_its_tokenizer_json_encodes(tmp_path):
    """transformers 5 loads this checkpoint as Qwen2Tokenizer (by model type), which encodes the samples
    otherwise; the loaded ModelTokenizer encodes every sample exactly as the tokenizer.json does."""
    from transformers import AutoTokenizer

    path, raw = custom_bpe_checkpoint(tmp_path / "ck")
    picked = AutoTokenizer.from_pretrained(str(path))
    assert any(picked(t, add_special_tokens=False)["input_ids"] != raw.encode(t, add_special_tokens=False).ids
               for t in ROUND_TRIP_SAMPLES), "transformers encodes it faithfully now: this test shows nothing"
    loaded = ModelTokenizer.load(path)
    for text in [*ROUND_TRIP_SAMPLES, *TEXTS[:3]]:
        assert loaded.encode_text(text) == raw.encode(text, add_special_tokens=False).ids, text
    assert loaded.eos_id == raw.token_to_id("<eos>") and loaded.pad_id == raw.token_to_id("<pad>")


def test_a_tokenizer_larger_than_the_embedding_is_refused(tmp_path):
    path, raw = custom_bpe_checkpoint(tmp_path / "ck", vocab_size=None)
    config = json.loads((path / "config.json").read_text())
    config["vocab_size"] = raw.get_vocab_size() - 1
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=rf"holds {raw.get_vocab_size()} tokens, more than the model's "
                                         rf"{raw.get_vocab_size() - 1} embedding rows"):
        ModelTokenizer.load(path)


def test_the_demo_tokenizer_loads_unchanged(tiny_model_dir):
    tokenizer = ModelTokenizer.load(tiny_model_dir.policy)
    assert tokenizer.encode_prompt("12+34=") == [1, 5, 6, 14, 7, 8, 15]


def test_encoding_skips_the_wrapper_only_where_the_backend_encodes_alike(tmp_path):
    """Prompts and targets are encoded by the fast tokenizer's backend directly, and equal what transformers'
    wrapper gives; a backend set to truncate (which the wrapper turns off per call) keeps the wrapper."""
    from transformers import PreTrainedTokenizerFast

    path, _ = custom_bpe_checkpoint(tmp_path / "ck")
    loaded = ModelTokenizer.load(path)
    for text in [*ROUND_TRIP_SAMPLES, *TEXTS[:3]]:
        assert loaded.encode_prompt(text) == list(loaded.hf(text, add_special_tokens=True)["input_ids"]), text
        assert loaded.encode_text(text) == list(loaded.hf(text, add_special_tokens=False)["input_ids"]), text
    truncating = PreTrainedTokenizerFast.from_pretrained(str(path))
    truncating.backend_tokenizer.enable_truncation(max_length=3)
    long = TEXTS[0]
    assert len(truncating.backend_tokenizer.encode(long).ids) == 3
    assert ModelTokenizer(truncating).encode_text(long) == list(truncating(long, add_special_tokens=False)["input_ids"])
    assert len(ModelTokenizer(truncating).encode_text(long)) > 3
