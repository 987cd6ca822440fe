"""Shared model helpers: loading a causal LM, per-token log-probs, and the weights a push carries.

`sequence_logprobs` is THE per-token log-prob of the project: the learner's `logp_prox` (no grad) and `logp`
(with grad), the teacher's `logp_teacher` and the mismatch probe all call it, so they cannot drift apart. With
`params` it applies `asyncrl.core.model.sampling.processed_logprobs` (the distribution the engines sample from); without,
it is the raw log-softmax (what vLLM's prompt_logprobs return).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import torch
from torch.utils.checkpoint import checkpoint

from asyncrl.core.model.attention import use_cpu_gqa
from asyncrl.core.model.sampling import SamplingParams, processed_logprobs
from asyncrl.core.wire.push_contract import TensorMeta, match_model

# Above this many logit elements per call the vocabulary projection runs in row chunks (and, with grad,
# recomputes each chunk in backward), so the [tokens, vocab] logits never exist all at once. 2^26 (256 MB of
# float32 logits, 441 rows of a 152k vocabulary): at Qwen2.5-0.5B's shape the learner's step is 8-11% faster than
# with 2^24 (110-row products run the LM head at 118-179 GFLOP/s instead of 179-212, and each chunk adds its
# share of the tied embedding's gradient), at the same peak memory (bench/learner_flops.py).
_MAX_LOGIT_ELEMENTS = 1 << 26

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str | torch.dtype) -> torch.dtype:
    """Dtype name ("float32", "bfloat16", "float16") or a torch.dtype -> torch.dtype."""
    if isinstance(name, torch.dtype):
        return name
    if name not in _DTYPES:
        raise ValueError(f"unsupported dtype {name!r} (expected one of {sorted(_DTYPES)})")
    return _DTYPES[name]


def checkpoint_config(path: str | Path) -> dict:
    """A checkpoint's config.json as a dict (for a multimodal model its `text_config`: the language model's),
    read without loading the model; {} when there is none."""
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        return {}
    raw = json.loads(config_file.read_text())
    return raw.get("text_config", raw)


def load_causal_lm(path: str | Path, dtype: str | torch.dtype = "float32", device: str = "cpu"):
    """Load a Hugging Face causal LM checkpoint in eval mode (dropout off) on `device`, attending with grouped
    heads in place on CPU (`attention.use_cpu_gqa`)."""
    from transformers import AutoModelForCausalLM

    use_cpu_gqa()
    if not (Path(path) / "config.json").is_file():
        raise ValueError(f"{path} is not a model checkpoint directory (no config.json)")
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype(dtype))
    head = model.get_output_embeddings()
    if head is not None:
        head.register_forward_pre_hook(_contiguous_input)
    return model.to(device).eval()


def _contiguous_input(module, args):
    """A prefill keeps only its last position's logits: the head's input is then a strided slice, which
    torch's CPU linear takes, for weights that need no gradient (an engine's), as one matrix-vector product
    per row: 0.6 s instead of 0.06 s for 64 rows of SmolLM2's 49k-token head."""
    hidden = args[0]
    return None if hidden.is_contiguous() else (hidden.contiguous(), *args[1:])


def eos_token_ids(model) -> list[int]:
    """Every token id that ends a response: config.eos_token_id plus generation_config's (may be lists)."""
    ids: list[int] = []
    for source in (model.config, getattr(model, "generation_config", None)):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        for i in value if isinstance(value, (list, tuple)) else [value]:
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    if not ids:
        raise ValueError("the model config names no eos_token_id; generation could never stop")
    return ids


def pad_token_id(model) -> int:
    """The model's pad id (falls back to the first EOS id; padded positions are masked anyway)."""
    pad = getattr(model.config, "pad_token_id", None)
    return int(pad) if pad is not None else eos_token_ids(model)[0]


def check_response_starts(sequences: list[list[int]], response_starts: list[int]) -> None:
    """ValueError unless every sequence has a response start in [1, len(sequence)]."""
    if len(sequences) != len(response_starts):
        raise ValueError(f"{len(sequences)} sequences but {len(response_starts)} response_starts")
    for i, (seq, start) in enumerate(zip(sequences, response_starts)):
        if not 1 <= start <= len(seq):
            raise ValueError(
                f"sequence {i}: response_start={start} must be in [1, len(sequence)={len(seq)}] "
                "(the first token has no prediction)"
            )


def distinct_prompts(prompts: list[list[int]], tags: list[int] | None = None) -> tuple[list[list[int]], list[int]]:
    """The distinct prompts in first-seen order, and for each row the index of its prompt among them. With
    `tags` (one per row, e.g. the adapter a row runs through) two rows share a prompt only if their tags match."""
    index: dict[tuple[int, ...], int] = {}
    keys = [tuple(p) if tags is None else (tags[i], *p) for i, p in enumerate(prompts)]
    rows = [index.setdefault(key, len(index)) for key in keys]
    skip = 0 if tags is None else 1
    return [list(key[skip:]) for key in index], rows


def padded_rows(rows: list[list[int]], pad_id: int, left: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask), each a [len(rows), longest row] long tensor: the rows padded with `pad_id` after their
    tokens (before them with `left`), mask 1 on the real tokens. One tensor built from one padded list: a
    copy per row costs ten times as much on the small batches every forward here sees."""
    width = max((len(r) for r in rows), default=0)
    if left:
        ids = [[pad_id] * (width - len(r)) + list(r) for r in rows]
        mask = [[0] * (width - len(r)) + [1] * len(r) for r in rows]
    else:
        ids = [list(r) + [pad_id] * (width - len(r)) for r in rows]
        mask = [[1] * len(r) + [0] * (width - len(r)) for r in rows]
    return (torch.tensor(ids, dtype=torch.long).reshape(len(rows), width),
            torch.tensor(mask, dtype=torch.long).reshape(len(rows), width))


def token_logprobs(lm_head, hidden: torch.Tensor, targets: torch.Tensor, params) -> torch.Tensor:
    """log p(targets[j] | hidden[j]) for hidden states [M, H] through the vocabulary projection `lm_head`, in
    chunks of at most _MAX_LOGIT_ELEMENTS logits (a 150k vocabulary makes the full [M, V] too big; with grad
    each chunk is recomputed in backward instead of kept). `params`: as in `sequence_logprobs`."""
    chunk = max(1, _MAX_LOGIT_ELEMENTS // lm_head.weight.shape[0])
    pieces = []
    for lo in range(0, hidden.shape[0], chunk):
        h, tgt = hidden[lo : lo + chunk], targets[lo : lo + chunk]
        if torch.is_grad_enabled() and hidden.shape[0] > chunk:
            pieces.append(checkpoint(_chunk_logprobs, lm_head, h, tgt, params, use_reentrant=False))
        else:
            pieces.append(_chunk_logprobs(lm_head, h, tgt, params))
    return torch.cat(pieces)


def _chunk_logprobs(lm_head, hidden: torch.Tensor, targets: torch.Tensor, params) -> torch.Tensor:
    logits = lm_head(hidden)
    logp_all = (
        torch.log_softmax(logits.float(), dim=-1) if params is None else processed_logprobs(logits, params)
    )
    return logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def sequence_logprobs(
    model,
    sequences: list[list[int]],
    response_starts: list[int],
    params: SamplingParams | None = None,
    pad_id: int = 0,
    **forward_kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs of each sequence's response tokens, one batched forward.

    Returns `(logp, mask)`, both [N, T] with T the longest response: `logp[i, t]` is the log-prob of
    `sequences[i][response_starts[i] + t]` (float32, 0 where masked), `mask[i, t]` (bool) says whether that
    response token exists. `params=None`: raw log-softmax; otherwise the processed (tempered/truncated)
    distribution of `asyncrl.core.model.sampling`. Differentiable when grad is enabled. Sequences are right-padded with
    `pad_id` under an attention mask, so padding does not change the values. `forward_kwargs` go to the
    base model's forward (e.g. routing replay inputs).

    A model sharded at its root (the learner's FSDP2 policy, which sets `run_in_root_forward`) runs all of
    this inside its root's forward hooks, which gather and release the root's weights (embeddings, LM head).
    """
    run = getattr(model, "run_in_root_forward", None)
    if run is not None:
        return run(_sequence_logprobs, sequences, response_starts, params, pad_id, **forward_kwargs)
    return _sequence_logprobs(model, sequences, response_starts, params, pad_id, **forward_kwargs)


def _sequence_logprobs(model, sequences, response_starts, params, pad_id, **forward_kwargs):
    check_response_starts(sequences, response_starts)
    device = next(model.parameters()).device
    n = len(sequences)
    lengths = torch.tensor([len(s) for s in sequences], dtype=torch.long)
    starts = torch.tensor(list(response_starts), dtype=torch.long)
    resp_lens = lengths - starts
    width = int(resp_lens.max()) if n else 0
    mask = torch.arange(width)[None, :] < resp_lens[:, None]
    if n == 0 or width == 0:
        return torch.zeros(n, width, device=device), mask.to(device)

    input_ids, attention_mask = padded_rows(sequences, pad_id)
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    hidden = model.base_model(
        input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **forward_kwargs
    ).last_hidden_state

    # Only the response positions go through the vocabulary projection: response token t of row i sits
    # at position start_i + t and is predicted by the hidden state one position earlier.
    rows, cols = mask.nonzero(as_tuple=True)
    pred_pos = starts[rows] - 1 + cols
    rows, pred_pos = rows.to(device), pred_pos.to(device)
    picked = hidden[rows, pred_pos]
    targets = input_ids[rows, pred_pos + 1]
    flat = token_logprobs(model.get_output_embeddings(), picked, targets, params)
    mask = mask.to(device)
    logp = torch.zeros(n, width, dtype=torch.float32, device=device)
    logp = logp.masked_scatter(mask, flat)
    return logp, mask


def named_weights(model) -> list[tuple[str, torch.Tensor]]:
    """The tensors a weight push carries, in a stable order, under `state_dict` names.

    Parameters (tied ones once) followed by persistent buffers; detached, on their current device.
    """
    state_names = set(model.state_dict().keys())
    out = [(name, p.detach()) for name, p in model.named_parameters()]
    out += [(name, b.detach()) for name, b in model.named_buffers() if name in state_names]
    return out


def check_weight_metas(model, metas: Iterable[TensorMeta]) -> dict[str, torch.Tensor]:
    """Hold pushed tensor metadata against `model` (`asyncrl.push.manifest.match_model`); returns
    name -> the model tensor to copy into. Raises ValueError naming the offending tensor."""
    targets = dict(named_weights(model))
    match_model(
        metas,
        {name: tuple(t.shape) for name, t in targets.items()},
        non_float=[name for name, t in targets.items() if not t.dtype.is_floating_point],
    )
    return targets


@torch.no_grad()
def copy_weights_(targets: dict[str, torch.Tensor], named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Copy received tensors into the model tensors `targets` (by name: `check_weight_metas`,
    `weight_slots`); returns bytes."""
    copied = 0
    for name, tensor in named_tensors:
        targets[name].copy_(tensor)
        copied += tensor.numel() * tensor.element_size()
    return copied


def weight_slots(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The Parameter and buffer objects of `model` by state_dict name (tied weights under each of their names),
    in one pass over the modules. The objects stay the same when weights are rebound (only their `.data`
    changes), so a receiver resolves them once."""
    slots: dict[str, torch.Tensor] = dict(model.named_parameters(remove_duplicate=False))
    slots.update(model.named_buffers(remove_duplicate=False))
    return slots


@torch.no_grad()
def rebind_parameters(model: torch.nn.Module, views: dict[str, torch.Tensor],
                      slots: dict[str, torch.Tensor] | None = None) -> None:
    """Point every weight of `model` named in `views` at its view (no copy; tied weights are one Parameter, so
    they follow together). Optimizers keep working: the Parameter objects stay the same.
    `slots`: `weight_slots(model)`, when the caller keeps it (resolving them is most of a rebind's cost)."""
    slots = weight_slots(model) if slots is None else slots
    for name, view in views.items():
        slot = slots.get(name)
        if slot is None:
            raise ValueError(f"cannot rebind {name!r}: the model has no weight of that name")
        if slot.shape != view.shape or slot.dtype != view.dtype or slot.device != view.device:
            raise ValueError(f"cannot rebind {name!r}: model has {tuple(slot.shape)} {slot.dtype} on {slot.device}, "
                             f"received storage has {tuple(view.shape)} {view.dtype} on {view.device}")
        slot.data = view
