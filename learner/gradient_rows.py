"""Rows that carry no gradient: forwarded once without one.

Under group-normalised advantages a group whose rewards are all equal has advantage 0 on every token, and
with no KL-in-loss or distillation term its loss terms are 0 whatever the policy: the backward through them
computes zeros. The fused proximal forward (`Trainer.fuses_proximal`) then runs with gradient on the rows
that carry one and without it on the rest, and puts the two back in batch order, so the objective, its
denominator and every metric see the whole batch as before; only the backward's work shrinks. On the
real-model example 38-45% of the sequences are such (the prompts the policy always or never solves).

Where the rollout correction rejects nothing and normalises nothing over the batch (`skips_rows`), those rows'
log-probs change neither the loss nor its denominator: they are not forwarded at all, and the step's
diagnostics (mismatch, IS weights, clipping) are over the rows that carry a gradient.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from asyncrl.learner.algos import AdvantageResult, build_advantages
from asyncrl.learner.batch import TrainBatch


def splits_rows(algo) -> bool:
    """Whether a row's gradient is known from its advantages before the forward: the advantages need no
    log-probs (no OPD, no KL in the reward) and the loss has no term beside the advantage-weighted one (no KL
    in the loss, no distillation loss)."""
    return not algo.opd.enabled and algo.kl.mode == "none"


def skips_rows(algo) -> bool:
    """Whether rows without gradient need no forward at all: `splits_rows(algo)`, and the rollout correction
    neither rejects (a rejected token leaves the loss denominator) nor rescales its weights over the batch."""
    rc = algo.rollout_correction
    return (splits_rows(algo) and rc.rejection == "none" and not rc.more_rejections and rc.veto_threshold is None
            and not (rc.batch_normalize and rc.weights != "none"))


def advantages_before_forward(batch: TrainBatch, algo) -> AdvantageResult:
    """The step's advantages, computed before its forward: where `splits_rows(algo)`, they need no log-probs."""
    return build_advantages(batch.rewards, batch.group_index, batch.response_mask, algo, finished=batch.finished,
                            process_rewards=batch.process_rewards, process_mask=batch.process_mask)


def gradient_rows(advantages: torch.Tensor, response_mask: torch.Tensor) -> list[int]:
    """The rows whose advantage is non-zero on some response token."""
    return ((advantages != 0) & response_mask.bool()).any(dim=1).nonzero().flatten().tolist()


def split_logprobs(batch: TrainBatch, rows: list[int], logprobs: Callable[[TrainBatch], torch.Tensor],
                   forward_rest: bool = True) -> torch.Tensor:
    """[N, T] log-probs of `batch` (T its response width): `rows` forwarded with gradient, the others without
    (`forward_rest`), else standing in as their logp_behav, in batch order. Positions past a row's own response
    are 0."""
    n, width = batch.response_mask.shape
    rest = sorted(set(range(n)) - set(rows))
    parts = [logprobs(batch.rows(rows))]
    if forward_rest:
        with torch.no_grad():
            parts.append(logprobs(batch.rows(rest)))
    else:  # finite, and their ratios 1: never rejected, never clipped
        parts.append(batch.logp_behav[rest].detach())
    padded = torch.cat([F.pad(p.float(), (0, width - p.shape[1])) for p in parts])
    order = torch.tensor(rows + rest, device=padded.device)
    return padded[torch.argsort(order)]
