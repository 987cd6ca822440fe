"""GGUF -> checkpoint directory: a GGUF file (llama.cpp's format) turned into the ordinary Hugging Face checkpoint
every part of asyncrl loads (learner, torch engine, vLLM, teacher), then checked against the GGUF itself.

transformers reads a GGUF through the `gguf` package and dequantizes it (Q4_1 and the other block formats) into
float32 tensors, for the architectures it maps from GGUF (llama, mistral, qwen2, qwen3, gemma, phi3, ...). The
model it returns refuses `save_pretrained` as "quantized", so the import builds a plain model from the same
config (its `quantization_config` dropped) and loads the dequantized state dict into it. The check: the saved
checkpoint, loaded as any part would load it, gives the same token log-probs as the GGUF-loaded model on a
chat-rendered probe (`ImportReport.max_logprob_diff`, 0 when exact).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

STAMP = "asyncrl-import.json"
"""Written last into an imported checkpoint: where it came from and what the check measured."""

PROBE_MESSAGES = [{"role": "user", "content": "What is 17 + 25? Answer with the number."},
                  {"role": "assistant", "content": "17 + 25 = 42."}]
"""The text the check scores with both models (rendered with the checkpoint's chat template)."""

EXACT_TOLERANCE = 1e-5
"""Largest log-prob difference the check accepts: both sides hold the same float32 tensors, so any larger gap
means the saved checkpoint is not the GGUF's model (a tensor lost, a tie not restored)."""


@dataclass(frozen=True)
class ImportReport:
    """What an import wrote and measured."""

    gguf: str
    """The GGUF file read."""
    out: str
    """The checkpoint directory written."""
    architecture: str
    """config.json's model_type."""
    parameters: int
    """Distinct parameters of the model (tied ones once)."""
    probe_tokens: int
    """Tokens of the probe the check scored."""
    max_logprob_diff: float
    """Largest |log p(saved) - log p(gguf)| over the probe's tokens."""
    source: str = ""
    """The named source it came from, when one did (`asyncrl.tools.model_sources`)."""
    sha256: str = ""
    """The GGUF file's SHA-256."""


def _token_logprobs(model, ids):
    import torch

    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    return torch.log_softmax(logits[0, :-1], dim=-1).gather(-1, ids[0, 1:, None])[:, 0]


def _plain_copy(loaded):
    """A model of `loaded`'s class and config, without the GGUF quantization record, holding its tensors."""
    import torch
    from transformers import AutoModelForCausalLM

    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    # A tied output head is absent from a GGUF (token_embd serves both): tie_weights restores it.
    missing = [k for k in missing if not (config.tie_word_embeddings and k.endswith("lm_head.weight"))]
    if missing or unexpected:
        raise ValueError(f"the GGUF's tensors do not fit its own config: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    plain.tie_weights()
    return plain.eval()


def import_gguf(gguf_file: str | Path, out: str | Path, source: str = "", sha256: str = "") -> ImportReport:
    """Convert `gguf_file` into the checkpoint directory `out` (written whole, or not at all) and check it.

    ValueError, naming the file, when transformers cannot read it or the check fails."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a bar per tensor and per shard: the caller prints one line instead
    gguf_file, out = Path(gguf_file), Path(out)
    if not gguf_file.is_file():
        raise ValueError(f"{str(gguf_file)!r}: no such GGUF file")
    folder, name = str(gguf_file.parent), gguf_file.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    except (ValueError, KeyError, OSError, RuntimeError) as err:
        raise ValueError(f"{str(gguf_file)!r}: transformers cannot read it as a causal LM: {err}") from None
    plain = _plain_copy(loaded)
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    plain.save_pretrained(staging)
    tokenizer.save_pretrained(staging)

    saved = AutoModelForCausalLM.from_pretrained(str(staging), dtype=torch.float32).eval()
    text = tokenizer.apply_chat_template(PROBE_MESSAGES, tokenize=False) if tokenizer.chat_template else \
        PROBE_MESSAGES[0]["content"]
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
    diff = float((_token_logprobs(saved, ids) - _token_logprobs(loaded, ids)).abs().max())
    if not diff <= EXACT_TOLERANCE:
        shutil.rmtree(staging, ignore_errors=True)
        raise ValueError(f"{str(gguf_file)!r}: the converted checkpoint's log-probs differ from the GGUF model's "
                         f"by up to {diff:.3g} (more than {EXACT_TOLERANCE})")
    report = ImportReport(
        gguf=str(gguf_file), out=str(out), architecture=str(saved.config.model_type),
        parameters=sum(p.numel() for p in saved.parameters()), probe_tokens=int(ids.shape[1]),
        max_logprob_diff=diff, source=source, sha256=sha256,
    )
    (staging / STAMP).write_text(json.dumps(asdict(report), indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return report


def imported_report(out: str | Path) -> ImportReport | None:
    """The report of a finished import at `out`, None when there is none (never imported, or cut short)."""
    stamp = Path(out) / STAMP
    if not stamp.is_file():
        return None
    return ImportReport(**json.loads(stamp.read_text()))
