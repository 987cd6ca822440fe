"""Tokenizers: `ModelTokenizer`, the policy checkpoint's own (used by every process), and the character-level
tokenizer of the synthetic tasks.

The character tokenizer has one token per character (digits, '+', '=') plus the specials <pad>, <bos>, <eos>, <unk>. It is built with the
`tokenizers` library and saved as a regular Hugging Face tokenizer directory (tokenizer.json +
tokenizer_config.json with bos/eos/pad set), so `transformers.AutoTokenizer` and vLLM load it like any other
checkpoint's tokenizer. `ModelTokenizer` wraps any checkpoint's tokenizer (this one included, `arith()`) with the
few calls the project needs.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
ARITH_ALPHABET = "0123456789+="
CHAT_ALPHABET = ARITH_ALPHABET + 'abcdefghijklmnopqrstuvwxyz{}[]":,_- '
"""The tool task's characters: sums, and the JSON of a tool call."""
CHAT_SPECIALS = ("<user>", "<assistant>", "<tool>", "<tool_call>", "</tool_call>")
"""The tool task's role markers and tool-call tags, one token each."""
CHAT_TEMPLATE = (
    "{{ bos_token }}{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}<user>{{ message['content'] }}"
    "{%- elif message['role'] == 'assistant' -%}<assistant>{{ message['content'] }}{{ eos_token }}"
    "{%- elif message['role'] == 'tool' -%}<tool>{{ message['content'] }}"
    "{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}<assistant>{%- endif -%}"
)
"""The tool task's chat template: a marker per role, the assistant's turn ended by EOS (the tools' schemas are
not rendered: the tiny model learns its one tool from the warm start)."""
log = logging.getLogger(__name__)


def build_char_tokenizer(alphabet: str = ARITH_ALPHABET, extra_specials: tuple[str, ...] = ()) -> Tokenizer:
    """A WordLevel tokenizer with one token per character of `alphabet` (and one per `extra_specials` string);
    encode() prepends <bos>."""
    if len(set(alphabet)) != len(alphabet) or not alphabet:
        raise ValueError(f"alphabet must be non-empty with distinct characters, got {alphabet!r}")
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + tuple(extra_specials))}
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
    tok.add_special_tokens(list(SPECIAL_TOKENS + tuple(extra_specials)))
    return tok


def save_tokenizer(tok: Tokenizer, directory: str | Path, model_max_length: int = 128,
                   chat_template: str | None = None) -> Path:
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
    if chat_template:
        tokenizer_config["chat_template"] = chat_template
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    special_map = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "unk_token": UNK}
    (directory / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n")
    return directory


ROUND_TRIP_SAMPLES = (
    "12+34=46", "Tom has 3 apples and buys 12 more. How many apples?", "  two leading spaces, a tab\tand a line\n",
    "Hello, World! (parentheses), [brackets]; semi-colons: quotes \"like this\" and 'that'.",
    "naïve café, Größe, 東京, 😀", "x = f(y) * 2 ** 10 // 3 - 0.5e-3",
)
"""Texts a checkpoint's tokenizer must encode exactly as its own tokenizer.json does."""


def _mismatch(tokenizer, raw, add_special_tokens: bool = False) -> str:
    """The first sample `tokenizer` (transformers) encodes otherwise than `raw` (a `tokenizers.Tokenizer`: its
    tokenizer.json, or its own backend), as a message; "" when none."""
    for text in ROUND_TRIP_SAMPLES:
        got = list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])
        want = raw.encode(text, add_special_tokens=add_special_tokens).ids
        if got != want:
            return f"{text!r} -> {got[:12]} instead of {want[:12]}"
    return ""


def faithful_tokenizer(tokenizer, path: Path):
    """`tokenizer` when it encodes as the checkpoint's own tokenizer.json does, else that file loaded as it was
    written. transformers 5 picks a tokenizer class by model type (Qwen2Tokenizer for `model_type: qwen2`),
    whose pre-tokenizer can differ from a custom tokenizer.json's: every prompt then gets other ids than the
    tokenizer was trained on, and nothing fails. ValueError when even the file itself does not round-trip."""
    from tokenizers import Tokenizer as RawTokenizer
    from transformers import PreTrainedTokenizerFast

    file = path / "tokenizer.json"
    if not file.is_file():
        return tokenizer  # a slow tokenizer's files only: nothing to hold it against
    raw = RawTokenizer.from_file(str(file))
    problem = _mismatch(tokenizer, raw)
    if not problem:
        return tokenizer
    log.warning("model.path: %s loads as %s, which encodes otherwise than its tokenizer.json (%s): using the "
                "tokenizer.json as written (PreTrainedTokenizerFast)", path, type(tokenizer).__name__, problem)
    exact = PreTrainedTokenizerFast.from_pretrained(str(path))
    problem = _mismatch(exact, raw)
    if problem:
        raise ValueError(f"model.path: the tokenizer of {str(path)!r} does not encode as its own tokenizer.json "
                         f"({problem})")
    return exact


def check_fits_embedding(tokenizer, path: Path) -> None:
    """ValueError when the tokenizer has more tokens than the model's embedding has rows (config.json's
    `vocab_size`): an id past the last row would index outside it."""
    from asyncrl.core.model.modeling import checkpoint_config

    vocab_size = checkpoint_config(path).get("vocab_size")
    if vocab_size and len(tokenizer) > int(vocab_size):
        raise ValueError(f"model.path: the tokenizer of {str(path)!r} holds {len(tokenizer)} tokens, more than the "
                         f"model's {vocab_size} embedding rows (config.json vocab_size): ids from {vocab_size} up "
                         "would index past the embedding")


def _direct_backend(tokenizer):
    """The fast tokenizer's own `tokenizers.Tokenizer` when it encodes every sample exactly as the transformers
    wrapper does, with and without special tokens; else None. The wrapper costs about four times the encoding
    itself per call, which the supervised warm start and every rollout pay once per prompt."""
    backend = getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
    if backend is None or backend.truncation is not None or backend.padding is not None:
        return None
    if _mismatch(tokenizer, backend, add_special_tokens=True) or _mismatch(tokenizer, backend):
        return None
    return backend


class ModelTokenizer:
    """The policy checkpoint's own tokenizer: its vocabulary, special tokens and chat template, used the same
    way by every process (rollout prompts and rewards, the learner's evaluation, the probe).

    - `encode_prompt(prompt)`: a plain string is tokenized with the tokenizer's own special-token rules (a BOS
      where the tokenizer adds one); a list of chat messages (`{"role": ..., "content": ...}`) is rendered with
      the checkpoint's chat template and a generation prompt.
    - `decode_response(ids)`: the text up to the first end-of-sequence id. Other special tokens stay in the
      text on purpose, so a response with junk specials in it cannot pass an exact-match reward.
    """

    def __init__(self, tokenizer, eos_ids: list[int] | None = None, source: str = "<in memory>"):
        self.hf = tokenizer
        self.source = source
        self._backend = _direct_backend(tokenizer)
        ids = list(eos_ids or [])
        if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
            ids.append(int(tokenizer.eos_token_id))
        if not ids:
            raise ValueError(f"tokenizer of {source} names no eos token; generation could never stop")
        self.eos_ids = ids
        self.pad_id = int(tokenizer.pad_token_id) if tokenizer.pad_token_id is not None else ids[0]

    @classmethod
    def load(cls, model_path: str | Path) -> ModelTokenizer:
        """The tokenizer saved with the checkpoint at `model_path` (plus generation_config's EOS ids)."""
        from transformers import AutoTokenizer, GenerationConfig

        if not str(model_path):
            raise ValueError("model.path: required: the directory of a Hugging Face checkpoint (config.json, "
                             "weights, tokenizer)")
        path = Path(model_path)
        if not path.is_dir():
            raise ValueError(f"model.path: {str(model_path)!r} is not a directory")
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path))
        except (OSError, ValueError, KeyError) as err:
            raise ValueError(f"model.path: cannot load the tokenizer of {str(model_path)!r}: {err}") from None
        tokenizer = faithful_tokenizer(tokenizer, path)
        check_fits_embedding(tokenizer, path)
        eos: list[int] = []
        try:
            value = GenerationConfig.from_pretrained(str(path)).eos_token_id
            eos = [int(i) for i in (value if isinstance(value, (list, tuple)) else [value]) if i is not None]
        except OSError:
            pass  # no generation_config.json: the tokenizer's eos token alone
        return cls(tokenizer, eos, source=str(model_path))

    @classmethod
    def arith(cls) -> ModelTokenizer:
        """The arith task's character tokenizer (identical to the one `make-tiny-model` saves)."""
        return cls.from_tokenizers(build_char_tokenizer(ARITH_ALPHABET))

    @classmethod
    def chat_chars(cls) -> ModelTokenizer:
        """The tool task's character tokenizer with its chat template (identical to the one `make-tiny-model`
        saves for it)."""
        return cls.from_tokenizers(build_char_tokenizer(CHAT_ALPHABET, CHAT_SPECIALS), CHAT_TEMPLATE)

    @classmethod
    def from_tokenizers(cls, tok: Tokenizer, chat_template: str | None = None) -> ModelTokenizer:
        """Wrap a `tokenizers.Tokenizer` that uses this module's special tokens (the synthetic tasks')."""
        from transformers import PreTrainedTokenizerFast

        hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK)
        if chat_template:
            hf.chat_template = chat_template
        return cls(hf, source="<character tokenizer>")

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    @property
    def eos_id(self) -> int:
        return self.eos_ids[0]

    @property
    def bos_id(self) -> int | None:
        return self.hf.bos_token_id

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    def encode_prompt(self, prompt: str | list[dict]) -> list[int]:
        if isinstance(prompt, str):
            return self._encode(prompt, add_special_tokens=True)
        return self.render_chat(prompt)

    def render_chat(self, messages: list[dict], tools: list[dict] | None = None,
                    add_generation_prompt: bool = True) -> list[int]:
        """Token ids of chat `messages` (and the `tools` schemas) rendered with the checkpoint's chat template."""
        if not self.has_chat_template:
            raise ValueError(f"the tokenizer of {self.source} has no chat template, so chat messages cannot be rendered")
        rendered = self.hf.apply_chat_template(messages, tools=tools or None,
                                               add_generation_prompt=add_generation_prompt, tokenize=True)
        if isinstance(rendered, dict) or hasattr(rendered, "keys"):  # newer transformers return a BatchEncoding
            rendered = rendered["input_ids"]
        return [int(i) for i in rendered]

    def encode_text(self, text: str) -> list[int]:
        """Token ids of `text` without any special tokens (targets of supervised warm starts)."""
        return self._encode(text, add_special_tokens=False)

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=add_special_tokens).ids
        return list(self.hf(text, add_special_tokens=add_special_tokens)["input_ids"])

    def decode_response(self, token_ids: list[int]) -> str:
        ids = list(token_ids)
        stop = next((i for i, t in enumerate(ids) if t in self.eos_ids), len(ids))
        return self.hf.decode(ids[:stop], skip_special_tokens=False)
