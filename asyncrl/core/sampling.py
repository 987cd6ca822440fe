"""The one definition of the sampling distribution.

Rollout engines sample from `processed_logprobs(logits, params)` and record the sampled token's value as
`logp_behav`; the learner computes `logp_prox` and `logp` with the same function, so all three describe the
same (tempered, truncated, renormalised) distribution. vLLM's `logprobs_mode="processed_logprobs"` is the
matching mode there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 8
    greedy: bool = False

    @classmethod
    def from_config(cls, cfg, greedy: bool = False) -> SamplingParams:
        return cls(cfg.temperature, cfg.top_k, cfg.top_p, cfg.max_new_tokens, greedy)


def processed_logprobs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Log-probs over the vocabulary (last dim) after temperature, top-k and top-p, renormalised.

    Tokens removed by top-k/top-p get -inf. Greedy decoding uses temperature 1 for the reported log-prob.
    """
    temperature = 1.0 if params.greedy else params.temperature
    scores = logits.float() / temperature
    if params.top_k > 0 and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        probs = torch.softmax(sorted_scores, dim=-1)
        # Drop a token when the mass before it already reaches top_p (the top token always stays).
        drop_sorted = (torch.cumsum(probs, dim=-1) - probs) >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return torch.log_softmax(scores, dim=-1)


def sample_tokens(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row of `logits` [N, V]; returns (token ids [N], their processed log-probs [N])."""
    logp = processed_logprobs(logits, params)
    if params.greedy:
        tokens = torch.argmax(logp, dim=-1)
    else:
        tokens = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
