"""The character-level tokenizer of the synthetic tasks.

One token per character (digits, '+', '=') plus the specials <pad>, <bos>, <eos>, <unk>. It is built with the
`tokenizers` library and saved as a regular Hugging Face tokenizer directory (tokenizer.json +
tokenizer_config.json with bos/eos/pad set), so `transformers.AutoTokenizer` and vLLM load it like any other
checkpoint's tokenizer. `TextCodec` wraps a loaded `tokenizers.Tokenizer` with the few calls the project needs
(encode a prompt, decode a response) without importing transformers.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
ARITH_ALPHABET = "0123456789+="


def build_char_tokenizer(alphabet: str = ARITH_ALPHABET) -> Tokenizer:
    """A WordLevel tokenizer with one token per character of `alphabet`; encode() prepends <bos>."""
    if len(set(alphabet)) != len(alphabet) or not alphabet:
        raise ValueError(f"alphabet must be non-empty with distinct characters, got {alphabet!r}")
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in alphabet:
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # Every character is its own pre-token, so WordLevel sees exactly one vocabulary entry per character.
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    # Fuse joins the pieces without the spaces WordLevel's default decoding would insert.
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok


def save_tokenizer(tok: Tokenizer, directory: str | Path, model_max_length: int = 128) -> Path:
    """Write `tok` as a Hugging Face tokenizer directory (loadable by AutoTokenizer and vLLM)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": UNK,
        "add_bos_token": True,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "padding_side": "left",
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    special_map = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "unk_token": UNK}
    (directory / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n")
    return directory


class TextCodec:
    """Encode prompts / decode responses with a `tokenizers.Tokenizer` and its special-token ids."""

    def __init__(self, tok: Tokenizer):
        self.tokenizer = tok
        ids = {name: tok.token_to_id(name) for name in SPECIAL_TOKENS}
        missing = [name for name, i in ids.items() if i is None and name != UNK]
        if missing:
            raise ValueError(f"tokenizer lacks the special tokens {missing}")
        self.pad_id, self.bos_id, self.eos_id = ids[PAD], ids[BOS], ids[EOS]
        self.special_ids = frozenset(i for i in ids.values() if i is not None)

    @classmethod
    def load(cls, directory: str | Path) -> TextCodec:
        """Load from a tokenizer directory (the tokenizer.json `save_tokenizer` wrote)."""
        path = Path(directory) / "tokenizer.json"
        if not path.is_file():
            raise ValueError(f"no tokenizer.json in {directory}")
        return cls(Tokenizer.from_file(str(path)))

    @classmethod
    def arith(cls) -> TextCodec:
        """The built-in arithmetic tokenizer (identical to the one `make-tiny-model` saves)."""
        return cls(build_char_tokenizer(ARITH_ALPHABET))

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        """Token ids of `text` (with a leading <bos> unless add_bos=False)."""
        return self.tokenizer.encode(text, add_special_tokens=add_bos).ids

    def decode(self, token_ids: list[int]) -> str:
        """Text of `token_ids` with special tokens dropped (the response before EOS, usually)."""
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)
