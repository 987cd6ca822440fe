"""Batched incremental decoding with a KV cache over any Hugging Face causal LM (no engine state).

Used by `TorchEngine` and directly by the learner to evaluate its own in-process model. Prompts are
left-padded under an attention mask with position ids counted from each prompt's first real token, so a
prompt decodes the same whatever it is batched with. A prompt sampled several times in one batch (a group's
G samples) is prefilled once and its KV cache copied to each of its rows, as vLLM's prefix cache does (where
`prompt_sharing.why_not_shared` allows); a head all the batch's prompts start with (a chat template's system
turn) is prefilled once for all (`prompt_sharing.shared_head`). Every
token is sampled with `asyncrl.core.model.sampling.sample_tokens`, so `logp_behav` is the processed log-prob the
learner recomputes.
With an adapter bank (`asyncrl.core.lora.row_adapters`) each prompt runs through the adapter of its slot, rows of
different adapters in one batch (a prompt is prefilled once per adapter that samples it).
With `router_hooks` (a MoE model) every forward also records the experts each input token was routed to, and
each generation carries them for its prompt and all its response tokens but the last (never fed back).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from functools import partial

import torch

from asyncrl.core.determinism.invariant_model import is_invariant
from asyncrl.core.determinism.seeds import sample_seed
from asyncrl.core.engines.base import Generation
from asyncrl.core.lora.row_adapters import AdapterBank
from asyncrl.core.model.modeling import distinct_prompts
from asyncrl.core.model.prompt_sharing import left_pad, shared_head, shared_prompt_logprobs, why_not_shared
from asyncrl.core.model.routing import RoutedExperts, RouterHooks, id_dtype
from asyncrl.core.model.sampling import SamplingParams, sample_tokens

DROP_FINISHED_AT = 0.25
"""A batch leaves its finished rows once this share of them is finished (one copy of the KV cache; up to then
they decode padding). Greedy evaluations end most rows early: 0.83x the evaluation's time on the real-model
example (`bench/torch_decode.py`)."""

StepGuard = Callable[[], AbstractContextManager[int]]
"""Called around every forward; the context value is the weight version that forward runs with. The torch
engine's guard holds its weight lock, so an in-flight update swaps weights only between decode steps."""


class _RoutingTrace:
    """Experts of every forward of one decode batch: the prefill's [distinct prompts, width, layers, k], then
    one [batch, layers, k] per decode step (the routing of the token sampled the step before)."""

    def __init__(self, hooks: RouterHooks):
        self.hooks = hooks
        self.steps: list[torch.Tensor] = []

    def forward(self, model, **inputs):
        with self.hooks.capture() as layers:
            out = model(**inputs)
        self.steps.append(torch.stack(layers, dim=-2))  # [batch * seq, layers, k]
        return out

    def per_row(self, prompts: list[list[int]], response_lengths: list[int],
                prefill_rows: list[int]) -> list[RoutedExperts]:
        """`prefill_rows[i]`: the prefill row that holds row i's prompt (prompts are prefilled once)."""
        prefill = self.steps[0].view(max(prefill_rows) + 1, -1, *self.steps[0].shape[1:]).cpu()
        width = prefill.shape[1]
        decoded = torch.stack(self.steps[1:], dim=1).cpu() if len(self.steps) > 1 else None
        out = []
        for i, (prompt, n) in enumerate(zip(prompts, response_lengths)):
            parts = [prefill[prefill_rows[i], width - len(prompt) :]]
            if n > 1:
                parts.append(decoded[i, : n - 1])
            num_experts = self.hooks.shape.num_experts
            out.append(RoutedExperts(ids=torch.cat(parts).numpy().astype(id_dtype(num_experts)), num_experts=num_experts))
        return out


@torch.no_grad()
def _decode_batch(model, prompts, params, eos, pad_id, generator, step_guard, hooks,
                  row_seeds=None, bank: AdapterBank | None = None, row_slots=None) -> list[Generation]:
    device = eos.device
    # Seeded rows draw from generators of their own: a row's tokens then do not depend on its batch.
    row_generators = (None if row_seeds is None
                      else [torch.Generator(device=device).manual_seed(seed) for seed in row_seeds])
    # The same rule as the scoring's (`prompt_sharing.why_not_shared`): a model whose cache cannot be shared
    # that way prefills every row.
    if why_not_shared(model) is None:
        distinct, prefill_rows = distinct_prompts(prompts, row_slots)
    else:
        distinct, prefill_rows = prompts, list(range(len(prompts)))
    # A head every distinct prompt starts with (a chat template's system turn) is prefilled once, as one row.
    # (Not under the batch-invariant kernels: they promise the bits of a whole prompt's forward.)
    head = 0 if bank is not None or hooks is not None or is_invariant(model) else shared_head(model, distinct)
    input_ids, attention_mask, position_ids = left_pad([p[head:] for p in distinct], pad_id, device)
    if head:  # the padding sits between the head and each prompt's rest, masked
        position_ids = position_ids + head
        attention_mask = torch.cat([attention_mask.new_ones(len(distinct), head), attention_mask], dim=-1)
    batch = len(prompts)
    # The prefill runs once per distinct prompt; its cache, logits and masks then go to every row of it.
    expand = None if len(distinct) == batch else torch.tensor(prefill_rows, dtype=torch.long, device=device)
    next_position = position_ids[:, -1] + 1
    rows = torch.arange(batch, device=device)  # the batch row each decoded row is
    slots = row_slots
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    cache = None
    trace = _RoutingTrace(hooks) if hooks is not None else None
    steps: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]] = []

    def adapter_rows(prefill: bool):
        if bank is None:
            return contextlib.nullcontext()
        if prefill and expand is not None:  # one row per distinct (adapter, prompt)
            return bank.rows([row_slots[prefill_rows.index(d)] for d in range(len(distinct))])
        return bank.rows(slots)

    for step in range(params.max_new_tokens):
        with step_guard() as version, adapter_rows(step == 0):
            if step == 0 and head:  # under the same guard: the head's cache has the prompts' weights
                cache = model(input_ids=torch.tensor([distinct[0][:head]], device=device), use_cache=True,
                              logits_to_keep=1).past_key_values
                cache.reorder_cache(torch.zeros(len(distinct), dtype=torch.long, device=device))
            out = (model if trace is None else partial(trace.forward, model))(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
        cache, logits = out.past_key_values, out.logits[:, -1]
        if expand is not None:
            cache.reorder_cache(expand)
            logits, attention_mask, next_position = logits[expand], attention_mask[expand], next_position[expand]
            expand = None
        tokens, logp = sample_tokens(logits, params, generator, row_generators)
        active = ~finished
        steps.append((rows, tokens, logp, active, int(version)))
        finished = finished | (active & torch.isin(tokens, eos))
        done = int(finished.sum())
        if done == len(rows):
            break
        # Finished rows decode padding (their tokens are dropped) until DROP_FINISHED_AT of the rows are done;
        # then the batch leaves them (the routing trace needs the batch whole).
        if trace is None and done >= DROP_FINISHED_AT * len(rows):
            keep = (~finished).nonzero().squeeze(1)
            cache.reorder_cache(keep)
            rows, tokens, finished = rows[keep], tokens[keep], finished[keep]
            attention_mask, next_position = attention_mask[keep], next_position[keep]
            keep_list = keep.tolist()
            row_generators = None if row_generators is None else [row_generators[i] for i in keep_list]
            slots = None if slots is None else [slots[i] for i in keep_list]
        input_ids = torch.where(finished, pad_id, tokens).unsqueeze(-1)
        attention_mask = torch.cat([attention_mask, torch.ones_like(attention_mask[:, :1])], dim=-1)
        position_ids = next_position.unsqueeze(-1)
        next_position = next_position + 1

    out_gens = [Generation(token_ids=[], logp_behav=[], weight_version=[], finished=True) for _ in range(batch)]
    for step_rows, tokens, logp, active, version in steps:
        for row, token, value, live in zip(step_rows.tolist(), tokens.tolist(), logp.tolist(), active.tolist()):
            if live:
                out_gens[row].token_ids.append(token)
                out_gens[row].logp_behav.append(value)
                out_gens[row].weight_version.append(version)
    for row, done in zip(rows.tolist(), finished.tolist()):  # the rows decoded to the end; the others finished
        out_gens[row].finished = done
    if trace is not None:
        routed = trace.per_row(prompts, [len(g.token_ids) for g in out_gens], prefill_rows)
        for gen, experts in zip(out_gens, routed):
            gen.routed_experts = experts
    return out_gens


def generate_with_model(
    model,
    prompts: list[list[int]],
    params: SamplingParams,
    n: int = 1,
    *,
    eos_ids: list[int],
    pad_id: int,
    max_batch_size: int = 64,
    generator: torch.Generator | None = None,
    step_guard: StepGuard | None = None,
    weight_version: int = 0,
    router_hooks: RouterHooks | None = None,
    seeds: list[int] | None = None,
    bank: AdapterBank | None = None,
    adapter_slots: list[int] | None = None,
) -> list[list[Generation]]:
    """`n` samples for each prompt (result[i][j] = sample j of prompt i), decoded in batches of at most
    `max_batch_size` sequences. Responses stop at any of `eos_ids` (included, finished=True) or after
    `params.max_new_tokens`. Tokens are tagged with the version `step_guard` yields (default:
    `weight_version`). With `router_hooks` (installed on `model`) each generation carries its routed experts.
    With `seeds` (one per prompt) sample j of prompt i draws from its own generator, seeded
    `sample_seed(seeds[i], j)`, instead of `generator`. With `bank` (installed on `model`) and `adapter_slots`
    (one per prompt), prompt i's samples run through the adapter in slot `adapter_slots[i]`. The model runs
    in eval mode and is put back in its previous mode afterwards.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if params.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {params.max_new_tokens}")
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty (it needs at least a <bos> token)")
    if not eos_ids:
        raise ValueError("eos_ids is empty: generation could never stop early")
    if seeds is not None and len(seeds) != len(prompts):
        raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts")
    if (bank is None) != (adapter_slots is None):
        raise ValueError("adapter_slots and bank come together")
    if adapter_slots is not None and len(adapter_slots) != len(prompts):
        raise ValueError(f"{len(adapter_slots)} adapter slots for {len(prompts)} prompts")
    guard = step_guard or (lambda: contextlib.nullcontext(weight_version))
    device = next(model.parameters()).device
    eos = torch.tensor(list(eos_ids), dtype=torch.long, device=device)
    flat = [(i, p, None if seeds is None else sample_seed(seeds[i], j))
            for i, p in enumerate(prompts) for j in range(n)]
    if adapter_slots is not None:  # rows of one adapter together: the bank adds their update to a view
        flat.sort(key=lambda row: adapter_slots[row[0]])
    results: list[list[Generation]] = [[] for _ in prompts]
    was_training = model.training
    if was_training:  # a full pass over the modules each way: an engine's model is in eval mode already
        model.eval()
    try:
        for lo in range(0, len(flat), max_batch_size):
            chunk = flat[lo : lo + max_batch_size]
            row_seeds = None if seeds is None else [seed for _, _, seed in chunk]
            row_slots = None if adapter_slots is None else [adapter_slots[i] for i, _, _ in chunk]
            gens = _decode_batch(
                model, [p for _, p, _ in chunk], params, eos, pad_id, generator, guard, router_hooks, row_seeds,
                bank, row_slots,
            )
            for (i, _, _), gen in zip(chunk, gens):
                results[i].append(gen)
    finally:
        if was_training:
            model.train()
    return results


def score_in_batches(model, sequences: list[list[int]], response_starts: list[int], max_batch_size: int,
                     pad_id: int, guard: Callable[[int], AbstractContextManager]) -> list[list[float]]:
    """Per-token log-probs of each sequence's response (`Engine.score`), `max_batch_size` sequences per forward,
    each forward inside `guard(rows)` (the engine's lock; an adapter bank's rows). A group's samples share their
    prompt: it runs once (the teacher scores whole groups)."""
    out: list[list[float]] = []
    for lo in range(0, len(sequences), max_batch_size):
        seqs, starts = sequences[lo : lo + max_batch_size], response_starts[lo : lo + max_batch_size]
        with guard(len(seqs)), torch.no_grad():
            logp, _ = shared_prompt_logprobs(model, seqs, starts, pad_id=pad_id)
        rows = logp.cpu().tolist()
        out.extend(row[: len(seq) - start] for row, seq, start in zip(rows, seqs, starts))
    return out
