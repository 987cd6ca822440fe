"""The engine seam: generation (rollout) and scoring (teacher, probe) over one model.

Two implementations, chosen by `EngineConfig.type` through `make_engine`: the project's torch engine and
real vLLM. Both take token ids (no text), sample from `asyncrl.core.model.sampling.processed_logprobs`, tag every
generated token with the weight version that produced it, and load new weights from a broadcast without
restarting through the `WeightSource` they are built with (`asyncrl.core.wire.push_contract`; the weight
push implements it), so no engine imports a transport.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass

from asyncrl.core.model.routing import RoutedExperts
from asyncrl.core.model.sampling import SamplingParams
from asyncrl.core.wire.push_contract import PushOrder, WeightSource, WeightUpdateStats

log = logging.getLogger(__name__)


@dataclass
class Generation:
    """One sampled response."""

    token_ids: list[int]
    logp_behav: list[float]
    weight_version: list[int]
    finished: bool
    """True when the response ended with EOS (the EOS token is included in token_ids)."""
    routed_experts: RoutedExperts | None = None
    """MoE models with routing capture on: the experts of every computed token (prompt, then all response
    tokens but the last)."""

    @property
    def model_tokens(self) -> int:
        """Tokens the model generated (a multi-turn episode's observations not counted)."""
        return len(self.token_ids)

    @property
    def turns(self) -> int:
        """Model turns (0: a single-turn sample)."""
        return 0


def weight_source(weights: WeightSource | None, plan: PushOrder) -> WeightSource:
    """The source an engine was built with, or the error of an engine built to take no pushes."""
    if weights is None:
        raise RuntimeError(f"weight push {plan.push_id}: this engine was built without a weight source "
                           "(make_engine(..., weights=...)) and takes no pushes")
    return weights


def refuse_full_weights(source: WeightSource, plan: PushOrder, rank: int) -> None:
    """Refuse `plan`, a full-weights push to one run of a deployment of several runs (ValueError), after taking
    part in it as `rank` without keeping anything, so that the sender and the other receivers are not left
    waiting for this one."""
    try:
        with source.open(plan, rank) as stream:
            stream.drain()
    except Exception as err:  # noqa: BLE001 - the refusal below matters more
        log.warning("could not drain the refused push %s: %s", plan.push_id, err)
    raise ValueError(f"push {plan.push_id} carries full weights; a run of a deployment of several runs serves its "
                     "adapter on the shared base and takes adapter pushes only")


class Engine(ABC):
    """Generation and scoring over one model; thread-safe for one generate() caller plus weight updates."""

    @property
    @abstractmethod
    def weight_version(self) -> int:
        """Version of the weights generating right now."""

    @property
    def adapter_checksum(self) -> str:
        """The checksum of the weights the last push brought, generating right now: the LoRA adapter's, or the
        full weights' ("" before a push arrived)."""
        return ""

    @abstractmethod
    def generate(self, prompts: list[list[int]], params: SamplingParams, n: int = 1,
                 seeds: list[int] | None = None) -> list[list[Generation]]:
        """For each prompt, `n` samples (a group). Result[i][j] is sample j of prompt i. With `seeds` (one per
        prompt, `asyncrl.core.determinism.seeds`) prompt i's samples draw from that seed alone, whatever they
        are batched with."""

    @abstractmethod
    def score(self, sequences: list[list[int]], response_starts: list[int]) -> list[list[float]]:
        """Per-token log-probs (raw, temperature 1) of sequences[i][t] for t >= response_starts[i]."""

    @abstractmethod
    def update_weights(self, plan: PushOrder, rank: int) -> WeightUpdateStats:
        """Join the push `plan` as `rank` through the engine's `WeightSource`, receive all tensors, make them
        live, set the version.

        May be called from another thread while generate() runs: generation pauses only for the swap,
        and tokens sampled after it carry the new version. The stats name the checksum of what arrived
        (`asyncrl.core.checks.weights_checksum`, in the plan's tensor order): the controller fails a receiver
        whose checksum is not the learner's.
        """

    @abstractmethod
    def close(self) -> None:
        """Release the engine (processes, memory)."""
