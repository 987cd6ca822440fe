"""Routing replay in the learner (`learner.routing_replay`): which experts the learner's forwards use.

A MoE policy routes each token to its top-k experts; a small change of weights or numerics flips near-tied
choices, so the learner's pi_prox and pi_theta can route a token differently from the engine that sampled it
(the off-policy blog's fourth mismatch source). Two remedies, plus measuring the problem:

- r3 forces the rollout engine's experts (carried with each trajectory) in every learner forward.
- r2 records the learner's own routing in the step's proximal forward (the weights before this step's first
  update) and forces it on every training mini-batch, so later mini-batches route as the first one did.
- Always (MoE data present): `routing/mismatch_frac` (and per layer) = tokens whose learner routing differs
  from the rollout's before any replay, measured in the proximal forward (in the training forwards in bypass
  mode, which has none); `routing/bytes_per_token` on the wire; with `measure_unreplayed` (r3) also
  `routing/delta_abs_unreplayed` = mean |logp_prox - logp_behav| of a forward without replay (with replay it
  is `rc/delta_abs_mean`).

The forcing itself lives in the model's routers (`asyncrl.core.model.routing.RouterHooks`); this module only
chooses the ids. The KL reference model routes on its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

from asyncrl.core.config.learner import RoutingReplayConfig
from asyncrl.core.model.routing import RoutingShape, install_hooks, routing_mismatch
from asyncrl.learner.algos.masked import masked_mean
from asyncrl.learner.batch import TrainBatch


class RoutingReplay:
    def __init__(self, model: torch.nn.Module, cfg: RoutingReplayConfig):
        self.mode = cfg.mode
        self.measure_unreplayed = cfg.measure_unreplayed
        self.hooks = install_hooks(model)
        if self.mode != "none" and self.hooks is None:
            raise ValueError(f"learner.routing_replay.mode {self.mode}: the policy is a dense model (no MoE routers)")
        self._recorded: torch.Tensor | None = None

    @property
    def shape(self) -> RoutingShape | None:
        """The policy's routing shape (None: dense); trajectories' routed experts are checked against it."""
        return None if self.hooks is None else self.hooks.shape

    def proximal(self, batch: TrainBatch, forward: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, dict]:
        """Run the proximal forward (no grad) under the replay mode: (logp_prox, routing metrics)."""
        self._recorded = None
        if self.hooks is None:
            return forward(), {}
        replay_rollout = self.mode == "r3" and batch.routing is not None
        forcing = self.hooks.force(batch.routing, batch.routing_mask) if replay_rollout else contextlib.nullcontext()
        with self.hooks.capture() as natural, forcing:
            logp = forward()
        own = self._stack(natural, len(batch))
        if self.mode == "r2":
            self._recorded = own
        metrics = self._mismatch(own, batch)
        if replay_rollout and self.measure_unreplayed:
            unreplayed = forward()
            mask = batch.response_mask.to(logp.device) > 0
            metrics["routing/delta_abs_unreplayed"] = masked_mean(
                (unreplayed - batch.logp_behav.to(logp.device)).abs(), mask
            )
        return logp, metrics

    @contextlib.contextmanager
    def training(self, mb: TrainBatch, rows: list[int], measure: bool = False) -> Iterator[dict]:
        """Around one mini-batch's forward and backward (a recomputing backward sees the same experts). The
        yielded dict receives the mismatch metrics when `measure` (bypass mode: no proximal forward)."""
        metrics: dict = {}
        if self.hooks is None:
            yield metrics
            return
        if self.mode == "r3" and mb.routing is not None:
            forcing = self.hooks.force(mb.routing, mb.routing_mask)
        elif self.mode == "r2" and self._recorded is not None:
            width = max(len(s) for s in mb.sequences)
            forcing = self.hooks.force(self._recorded[torch.tensor(rows, device=self._recorded.device), :width])
        else:
            forcing = contextlib.nullcontext()
        with self.hooks.capture() as natural, forcing:
            yield metrics
        if measure and natural[0] is not None:
            metrics.update(self._mismatch(self._stack(natural, len(mb)), mb))

    def end_step(self) -> None:
        self._recorded = None

    def _stack(self, layers: list[torch.Tensor | None], rows: int) -> torch.Tensor:
        """Captured per-layer ids [rows * seq, k] -> [rows, seq, layers, k]."""
        stacked = torch.stack(layers, dim=-2)
        return stacked.view(rows, -1, *stacked.shape[1:])

    def _mismatch(self, own: torch.Tensor, batch: TrainBatch) -> dict:
        if batch.routing is None:
            return {}
        mask = batch.routing_mask.to(own.device)
        per_layer = routing_mismatch(own, batch.routing.to(own.device), mask)
        metrics = {f"routing/mismatch_frac/layer{i}": v for i, v in enumerate(per_layer)}
        metrics["routing/mismatch_frac"] = per_layer.mean()
        # On the learner's device with the rest: the metrics are stacked into one tensor for one host copy.
        metrics["routing/bytes_per_token"] = torch.tensor(batch.routing_bytes / max(1, int(mask.sum())),
                                                          device=own.device)
        return metrics
