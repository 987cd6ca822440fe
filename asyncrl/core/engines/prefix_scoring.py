"""Scoring sequences that share prompts (a group's G samples): each distinct prompt runs through the model
once, its KV cache is copied to the rows that continue it, and only the responses run per row.

The teacher scores whole groups, so its forward shrinks from N x (prompt + response) tokens to
distinct prompts + N x response; the values equal `modeling.sequence_logprobs` to float rounding (tested).
No gradient: the learner, which trains through its forward (and replays MoE routing per sequence
position), keeps the one-forward path of `sequence_logprobs`.
"""

from __future__ import annotations

import torch

from asyncrl.core.engines.prompt_batch import distinct_prompts, left_pad
from asyncrl.core.modeling import check_response_starts, sequence_logprobs, token_logprobs


@torch.no_grad()
def shared_prompt_logprobs(model, sequences: list[list[int]], response_starts: list[int],
                           pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """`sequence_logprobs(model, sequences, response_starts, None, pad_id)` (raw log-softmax, [N, T] log-probs
    and mask), with one forward per distinct prompt. Falls back to that function when no prompt is shared or
    a response is empty."""
    check_response_starts(sequences, response_starts)
    prompts = [seq[:start] for seq, start in zip(sequences, response_starts)]
    distinct, rows = distinct_prompts(prompts)
    responses = [seq[start:] for seq, start in zip(sequences, response_starts)]
    if len(distinct) == len(sequences) or not all(responses):
        return sequence_logprobs(model, sequences, response_starts, None, pad_id=pad_id)
    device = next(model.parameters()).device
    base = model.base_model
    prompt_ids, prompt_mask, prompt_pos = left_pad(distinct, pad_id, device)
    prefill = base(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=prompt_pos, use_cache=True)
    cache = prefill.past_key_values
    if cache is None:  # a model without a KV cache: one forward of everything, as before
        return sequence_logprobs(model, sequences, response_starts, None, pad_id=pad_id)
    expand = torch.tensor(rows, dtype=torch.long, device=device)
    cache.reorder_cache(expand)
    # The last prompt position predicts each row's first response token.
    first = prefill.last_hidden_state[:, -1][expand]

    n, width = len(sequences), max(len(r) for r in responses)
    response_ids = torch.full((n, width), pad_id, dtype=torch.long)
    for i, response in enumerate(responses):
        response_ids[i, : len(response)] = torch.tensor(response, dtype=torch.long)
    lengths = torch.tensor([len(r) for r in responses])
    mask = torch.arange(width)[None, :] < lengths[:, None]
    response_ids, mask = response_ids.to(device), mask.to(device)
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
    flat = token_logprobs(model.get_output_embeddings(), predictors[mask], response_ids[mask], None)
    logp = torch.zeros(n, width, dtype=torch.float32, device=device).masked_scatter(mask, flat)
    return logp, mask
