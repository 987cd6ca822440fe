"""Sequences that share prompts (a group's G samples): each distinct prompt runs through the model once, so a
forward of N x (prompt + response) tokens shrinks to about distinct prompts + N x response. Two layouts:

- *KV copy* (`kv_copy_logprobs`): the distinct prompts run as one batch and their KV cache is copied to the
  rows that continue them, then the responses run as a second batch, padded to the longest response.
- *Packed* (`asyncrl.core.model.packing`): each group's prompt and responses one after another in a row under a
  block mask, no padding between responses and one forward; attention grows with the square of a row.

`shared_prompt_logprobs` forwards whichever costs least (`choose_layout`), or every sequence whole when
neither saves. Three users: the torch engine's generation (one prefill per distinct prompt, `torch_decode`),
the teacher's scoring and the learner's forwards, which train through them (the cache copy is an index, a
packed prompt one row's positions: each response's gradient flows back into its prompt's one forward and
adds up there). The log-probs and gradients equal one forward of every whole sequence
(`modeling.sequence_logprobs`) to float rounding; what differs is that the prompt positions are computed once
per prompt, so a model with dropout draws one mask for a prompt instead of one per row.
"""

from __future__ import annotations

import torch

from asyncrl.core.model import packing
from asyncrl.core.model.modeling import (
    check_response_starts,
    distinct_prompts,
    padded_rows,
    sequence_logprobs,
    token_logprobs,
)
from asyncrl.core.model.sampling import SamplingParams

LAYOUTS = ("whole", "kv_copy", "packed")


def left_pad(prompts: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, position_ids), each [len(prompts), longest prompt]: prompts aligned to the
    right under an attention mask, positions counted from each prompt's first real token."""
    input_ids, attention_mask = padded_rows(prompts, pad_id, left=True)
    # Real tokens get positions 0, 1, ...; padding positions are masked, their value does not matter.
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids.to(device), attention_mask.to(device), position_ids.to(device)


ATTENTION_LAYERS = frozenset({"full_attention", "sliding_attention", "chunked_attention"})
"""Layer types (a Hugging Face config's `layer_types`) whose masked attention ignores left padding."""

HEAD_TOKENS_SAVED = 32
"""A shared head is prefilled once when that saves at least this many prompt tokens: a forward of its own has a
fixed cost (a pass over every layer) that a few tokens do not pay back."""


def shared_head(model, prompts: list[list[int]]) -> int:
    """How many leading tokens all of `prompts` share that a decode can prefill once, as one row, and copy to
    every prompt (0: none worth it, `HEAD_TOKENS_SAVED`). Each prompt keeps at least its last token, which
    predicts its first response token. The rest of each prompt is left-padded after the head, so the model
    must mask padding anywhere (`why_not_shared`) and attend to whole prompts (no sliding window, where
    padding inside the window would hide real tokens)."""
    if (len(prompts) < 2 or why_not_shared(model) is not None
            or packing.why_windowed(getattr(model, "config", None)) is not None):
        return 0
    # Lists compare element by element: the common prefix of the smallest and largest is everyone's.
    low, high = min(prompts), max(prompts)
    head = next((i for i, (a, b) in enumerate(zip(low, high)) if a != b), min(len(low), len(high)))
    head = min(head, min(map(len, prompts)) - 1)
    return head if head * (len(prompts) - 1) >= HEAD_TOKENS_SAVED else 0


def why_not_shared(model) -> str | None:
    """Why `model`'s forwards cannot share prompts (None: they can)."""
    if getattr(model, "run_in_root_forward", None) is not None:
        return "sharded at its root (FSDP2 brackets one forward per call)"
    if getattr(model, "is_gradient_checkpointing", False):
        return "activation checkpointing (Hugging Face models keep no KV cache under it)"
    layer_types = set(getattr(getattr(model, "config", None), "layer_types", None) or ())
    if layer_types - ATTENTION_LAYERS:
        # A recurrent state (Mamba, linear attention) would run through the left padding of a shorter prompt.
        return f"layer types {sorted(layer_types - ATTENTION_LAYERS)} (not attention only)"
    return None


def layout_costs(prompt_lengths: list[int], prompt_of: list[int], response_lengths: list[int], width: int,
                 layouts=LAYOUTS, plan: list[list[packing.Tree]] | None = None) -> dict[str, float]:
    """Each layout's cost in one token's linear layers (tokens, padding included, plus attended pairs at
    `packing.pair_cost`) for sequences whose prompts (`prompt_of[i]` indexes `prompt_lengths`) are followed by
    responses of `response_lengths[i]` tokens; packed rows as `plan`, or as `packing.plan_rows` makes them."""
    pairs = packing.pair_cost(width)
    n, longest_prompt, longest_response = len(prompt_of), max(prompt_lengths), max(response_lengths)
    costs = {}
    if "whole" in layouts:
        longest = max(prompt_lengths[p] + r for p, r in zip(prompt_of, response_lengths))
        costs["whole"] = n * (longest + pairs * longest * longest)
    if "kv_copy" in layouts:
        costs["kv_copy"] = (packing.rows_cost([longest_prompt] * len(prompt_lengths), pairs)
                            + n * (longest_response + pairs * longest_response * (longest_prompt + longest_response)))
    if "packed" in layouts:
        plan = plan or packing.plan_rows(prompt_lengths, prompt_of, response_lengths, width)
        costs["packed"] = packing.plan_cost(plan, prompt_lengths, response_lengths, width)
    return costs


def why_not_layouts(model) -> dict[str, str]:
    """Each sharing layout `model` cannot run, with why."""
    reasons = {"kv_copy": why_not_shared(model), "packed": packing.why_not_packed(model)}
    return {layout: reason for layout, reason in reasons.items() if reason is not None}


def why_nothing_shared(model) -> str | None:
    """Why `model` can run neither sharing layout (None: it can run one)."""
    unusable = why_not_layouts(model)
    return "; ".join(unusable.values()) if len(unusable) == len(LAYOUTS) - 1 else None


def choose_layout(model, sequences: list[list[int]], response_starts: list[int]) -> str:
    """The cheapest layout (`layout_costs`) among those `model` can run (`why_not_layouts`): "whole" when no
    prompt is shared or a response is empty."""
    return _choose(model, sequences, response_starts)[0]


def usable_layouts(model) -> list[str]:
    """The layouts `model` can run (`why_not_layouts`). A caller that forwards one model many times computes
    this once and hands it over: the check walks every module of the model (activation checkpointing)."""
    return [layout for layout in LAYOUTS if layout not in why_not_layouts(model)]


def _choose(model, sequences, response_starts, layouts=None) -> tuple[str, list[list[packing.Tree]] | None]:
    """`choose_layout` among `layouts` (None: `usable_layouts`), with the plan of packed rows it costed when it
    chose them."""
    distinct, prompt_of = distinct_prompts([seq[:start] for seq, start in zip(sequences, response_starts)])
    response_lengths = [len(seq) - start for seq, start in zip(sequences, response_starts)]
    layouts = usable_layouts(model) if layouts is None else layouts
    if len(distinct) == len(sequences) or not all(response_lengths) or layouts == ["whole"]:
        return "whole", None
    prompt_lengths, width = [len(p) for p in distinct], packing.model_width(model)
    plan = packing.plan_rows(prompt_lengths, prompt_of, response_lengths, width) if "packed" in layouts else None
    costs = layout_costs(prompt_lengths, prompt_of, response_lengths, width, layouts, plan)
    layout = min(costs, key=costs.get)
    return layout, plan if layout == "packed" else None


def shared_prompt_logprobs(model, sequences: list[list[int]], response_starts: list[int],
                           params: SamplingParams | None = None, pad_id: int = 0,
                           layouts: list[str] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`sequence_logprobs(model, sequences, response_starts, params, pad_id)` ([N, T] log-probs and mask;
    differentiable when grad is enabled) with one forward per distinct prompt, in the layout that costs least
    (`choose_layout`) among `layouts` (None: `usable_layouts(model)`)."""
    check_response_starts(sequences, response_starts)
    layout, plan = _choose(model, sequences, response_starts, layouts)
    if layout == "packed":
        return packing.packed_logprobs(model, sequences, response_starts, params, pad_id, plan=plan)
    if layout == "kv_copy":
        return kv_copy_logprobs(model, sequences, response_starts, params, pad_id, checked=True)
    return sequence_logprobs(model, sequences, response_starts, params, pad_id=pad_id)


def kv_copy_logprobs(model, sequences: list[list[int]], response_starts: list[int],
                     params: SamplingParams | None = None, pad_id: int = 0,
                     checked: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """`sequence_logprobs` from a prefill of the distinct prompts whose KV cache is copied to the rows that
    continue them, then one forward of the responses. Falls back to one forward of every whole sequence when
    no prompt is shared, a response is empty, the model cannot share (`why_not_shared`) or returns no KV
    cache it can copy. `checked`: the caller knows the model can share."""
    check_response_starts(sequences, response_starts)
    prompts = [seq[:start] for seq, start in zip(sequences, response_starts)]
    distinct, rows = distinct_prompts(prompts)
    responses = [seq[start:] for seq, start in zip(sequences, response_starts)]
    if len(distinct) == len(sequences) or not all(responses) or (not checked and why_not_shared(model) is not None):
        return sequence_logprobs(model, sequences, response_starts, params, pad_id=pad_id)
    device = next(model.parameters()).device
    base = model.base_model
    prompt_ids, prompt_mask, prompt_pos = left_pad(distinct, pad_id, device)
    prefill = base(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=prompt_pos, use_cache=True)
    cache = getattr(prefill, "past_key_values", None)
    if cache is None or not hasattr(cache, "reorder_cache"):  # no KV cache to copy: one forward of everything
        return sequence_logprobs(model, sequences, response_starts, params, pad_id=pad_id)
    expand = torch.tensor(rows, dtype=torch.long, device=device)
    cache.reorder_cache(expand)
    # The last prompt position predicts each row's first response token.
    first = prefill.last_hidden_state[:, -1][expand]

    n, width = len(sequences), max(len(r) for r in responses)
    response_ids, mask = padded_rows(responses, pad_id)
    response_ids, mask = response_ids.to(device), mask.bool().to(device)
    # Responses right-padded after the (left-padded) prompts: a real token never attends to the padding
    # after it, and the padding before it is masked.
    hidden = base(
        input_ids=response_ids,
        attention_mask=torch.cat([prompt_mask[expand], mask.long()], dim=1),
        position_ids=prompt_pos[expand][:, -1:] + 1 + torch.arange(width, device=device)[None, :],
        past_key_values=cache,
        use_cache=True,
    ).last_hidden_state
    # Response token t is predicted by the hidden state one position earlier: the prompt's last for t = 0.
    predictors = torch.cat([first[:, None], hidden[:, :-1]], dim=1)
    flat = token_logprobs(model.get_output_embeddings(), predictors[mask], response_ids[mask], params)
    logp = torch.zeros(n, width, dtype=torch.float32, device=device).masked_scatter(mask, flat)
    return logp, mask
