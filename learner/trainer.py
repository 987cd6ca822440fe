"""One learner step: logp_prox (no grad), advantages, then per mini-batch logp (with grad), the
objective, backward, clip, optimizer step. The objective itself lives in `learner.algos` (pure); which experts
a MoE policy's forwards use is `learner.routing_replay`."""

from __future__ import annotations

import copy
import itertools
import time
from collections import defaultdict

import torch

from asyncrl.core.modeling import sequence_logprobs
from asyncrl.core.sampling import SamplingParams
from asyncrl.learner.algos import build_advantages, policy_objective
from asyncrl.learner.algos.diagnostics import to_floats
from asyncrl.learner.batch import TrainBatch, staleness_stats
from asyncrl.learner.routing_replay import RoutingReplay


class Trainer:
    def __init__(self, model: torch.nn.Module, learner_cfg, sampling: SamplingParams, pad_id: int):
        self.model = model
        self.cfg = learner_cfg
        self.algo = learner_cfg.algo
        self.sampling = sampling
        self.pad_id = pad_id
        self.optimizer = torch.optim.AdamW(
            model.parameters(), lr=learner_cfg.lr, weight_decay=learner_cfg.weight_decay
        )
        # The KL reference is the policy the run started from, frozen (only kept when a KL term uses it).
        self.ref_model = None
        if self.algo.kl.mode != "none":
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        # A batch whose teacher annotation failed trains without the distillation term.
        no_opd = self.algo.opd.model_copy(update={"enabled": False})
        self.algo_without_teacher = self.algo.model_copy(update={"opd": no_opd})
        # After the reference copy: the router hooks stay on the policy only.
        self.replay = RoutingReplay(model, learner_cfg.routing_replay)

    def _logprobs(self, batch: TrainBatch, model: torch.nn.Module | None = None) -> torch.Tensor:
        logp, _mask = sequence_logprobs(model or self.model, batch.sequences, batch.response_starts,
                                        self.sampling, self.pad_id)
        return logp[:, : batch.response_mask.shape[1]]

    @torch.no_grad()
    def weights_finite(self) -> bool:
        return bool(torch.stack([p.isfinite().all() for p in self.model.parameters()]).all())

    def minibatch_rows(self, batch: TrainBatch, keep: torch.Tensor) -> list[list[int]]:
        """Split the kept rows into `minibatches` chunks along group boundaries."""
        groups: dict[int, list[int]] = defaultdict(list)
        for row, g in enumerate(batch.group_index.tolist()):
            if keep[row]:
                groups[g].append(row)
        ordered = [groups[g] for g in sorted(groups)]
        k = self.cfg.minibatches
        # Round-robin over groups, so mini-batches differ by at most one group.
        parts = [ordered[i::k] for i in range(k)] if len(ordered) >= k else [ordered]
        chunks = [list(itertools.chain.from_iterable(part)) for part in parts]
        return [sorted(c) for c in chunks if c]

    def step(self, batch: TrainBatch, version: int) -> dict:
        """Train on `batch` with the policy at `version`; returns flat metrics."""
        t0 = time.perf_counter()
        self.model.train()
        routing_metrics: dict = {}
        if self.algo.needs_prox_forward:
            with torch.no_grad():
                logp_prox, routing_metrics = self.replay.proximal(batch, lambda: self._logprobs(batch))
        else:
            logp_prox = batch.logp_behav  # bypass mode: one forward less
        t_prox = time.perf_counter() - t0
        logp_ref = None
        if self.ref_model is not None:
            with torch.no_grad():
                logp_ref = self._logprobs(batch, self.ref_model)
        algo = self.algo
        if algo.opd.enabled and batch.logp_teacher is None:
            algo = self.algo_without_teacher
        adv = build_advantages(batch.rewards, batch.group_index, batch.response_mask, algo,
                               logp_prox=logp_prox, logp_teacher=batch.logp_teacher, logp_ref=logp_ref)
        metrics: dict[str, float] = dict(adv.metrics)
        metrics.update(to_floats(routing_metrics))
        sums: dict[str, float] = defaultdict(float)
        chunks = self.minibatch_rows(batch, adv.keep)
        skipped = 0
        for rows in chunks:
            mb = batch.rows(rows)
            width = mb.response_mask.shape[1]
            idx = torch.tensor(rows, dtype=torch.long)
            with self.replay.training(mb, rows, measure=not self.algo.needs_prox_forward) as mb_routing:
                logp = self._logprobs(mb)
                loss, mb_metrics = policy_objective(
                    logp, logp_prox[idx, :width], mb.logp_behav, adv.advantages[idx, :width], mb.response_mask,
                    algo, logp_ref=None if logp_ref is None else logp_ref[idx, :width],
                    logp_teacher=mb.logp_teacher,
                    opd_mask=None if adv.opd_mask is None else adv.opd_mask[idx, :width],
                )
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
            mb_metrics.update(to_floats(mb_routing))
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
            if not (torch.isfinite(loss) and torch.isfinite(grad_norm)):
                # One non-finite value would spread to every weight through the optimizer: skip the update
                # (the optimizer state stays as it was) and count it; the weights never see it.
                self.optimizer.zero_grad(set_to_none=True)
                skipped += 1
                continue
            self.optimizer.step()
            sums["loss/total"] += loss.item()
            sums["opt/grad_norm"] += float(grad_norm)
            for key, value in mb_metrics.items():
                sums[key] += float(value)
        self.replay.end_step()
        for key, value in sums.items():
            metrics[key] = value / max(1, len(chunks) - skipped)
        metrics["opt/skipped_updates"] = skipped
        metrics["teacher/unavailable"] = float(self.algo.opd.enabled and batch.logp_teacher is None)
        lengths = batch.response_mask.sum(dim=1)
        metrics.update(
            {
                "reward/mean": batch.rewards.mean().item(),
                "reward/max": batch.rewards.max().item(),
                "response/length_mean": lengths.mean().item(),
                "batch/sequences": len(batch),
                "batch/response_tokens": int(lengths.sum().item()),
                "batch/trained_sequences": int(adv.keep.sum().item()),
                "time/prox_s": t_prox,
                "time/step_s": time.perf_counter() - t0,
            }
        )
        metrics.update(staleness_stats(batch, version))
        return metrics
