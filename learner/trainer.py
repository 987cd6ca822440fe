"""One learner step: logp_prox (no grad), advantages, then per mini-batch logp (with grad), the
objective, backward, clip, optimizer step. With one mini-batch trained whole the training forward doubles as
the proximal one (`Trainer.fuses_proximal`). The objective itself lives in `learner.algos` (pure); which
experts a MoE policy's forwards use is `learner.routing_replay`. A dense policy's forwards run each group's
prompt once (`asyncrl.core.model.prompt_sharing`, `learner.share_prompts`), in the layout that costs least.

Sharded over ranks (`learner.sharding`) or cut into micro-batches (`learner.microbatch_tokens`), a mini-batch
is trained in parts: every rank holds the whole batch, forwards the rows of its groups (round-robin), and
every part's loss divides by the whole mini-batch's denominator (`objective_units`), so the parts' gradients,
accumulated over micro-batches and summed over ranks, are the whole mini-batch's gradient. Every rank runs
the same number of forwards and backwards (a rank short of rows runs one at zero weight): FSDP's collectives
must pair up.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import itertools
import logging
import math
import time
from collections import defaultdict

import torch

from asyncrl.core.model.modeling import sequence_logprobs
from asyncrl.core.model.prompt_sharing import shared_prompt_logprobs, usable_layouts, why_nothing_shared
from asyncrl.core.model.sampling import SamplingParams
from asyncrl.learner.adapters import adapters_disabled
from asyncrl.learner.algos import build_advantages, objective_units, policy_objective
from asyncrl.learner.algos.diagnostics import to_floats
from asyncrl.learner.batch import TrainBatch, staleness_stats, trained_width
from asyncrl.learner.gradient_rows import (
    advantages_before_forward,
    gradient_rows,
    skips_rows,
    split_logprobs,
    splits_rows,
)
from asyncrl.learner.half_precision import HalfForwards, LossScale
from asyncrl.learner.routing_replay import RoutingReplay
from asyncrl.learner.sharding import SINGLE, Ranks

log = logging.getLogger("asyncrl.learner")


def adamw(params: list[torch.nn.Parameter], learner_cfg, sharded: bool) -> torch.optim.AdamW:
    """AdamW over `params`, fused into one kernel per step where torch has one (plain tensors on a CPU or a
    CUDA device): at Qwen2.5-0.5B's shape on two cores an update takes 1.3 s with the for-loop kernel, 0.2 s
    fused (bench/learner_flops.py). Sharded weights (DTensors) keep the for-loop version."""
    fused = not sharded and all(p.device.type in ("cpu", "cuda") and p.dtype.is_floating_point for p in params)
    return torch.optim.AdamW(params, lr=learner_cfg.lr, weight_decay=learner_cfg.weight_decay, fused=fused or None)


class Trainer:
    def __init__(self, model: torch.nn.Module, learner_cfg, sampling: SamplingParams, pad_id: int,
                 ranks: Ranks = SINGLE, half: torch.dtype | None = None):
        """`half`: the engines' half-precision dtype when this learner keeps float32 master weights and runs
        its forwards on their rounding (`asyncrl.learner.half_precision`); None: forwards in the weights' own dtype."""
        self.model = model
        self.half = None if half is None else HalfForwards(half)
        self.loss_scale = LossScale(enabled=half == torch.float16)
        self.cfg = learner_cfg
        self.algo = learner_cfg.algo
        self.sampling = sampling
        self.pad_id = pad_id
        self.ranks = ranks
        # Only what trains has optimizer state (with LoRA: the adapters; `learner.adapters`).
        self.trained = [p for p in model.parameters() if p.requires_grad]
        """What this trainer trains: every weight, or its run's adapter. Its gradients alone are clipped and
        unscaled; another run's on the same base (`learner.runs`) keep theirs from their last step."""
        self.optimizer = adamw(self.trained, learner_cfg, ranks.sharded)
        self.lora = learner_cfg.lora.enabled
        self.lora_dropout = self.lora and learner_cfg.lora.dropout > 0
        """Adapter dropout: the proximal and reference forwards then run in eval mode (no dropout), unfused."""
        # The KL reference is the policy the run started from, frozen (only kept when a KL term uses it). With
        # LoRA it is the base: the policy itself with its adapters off, no copy.
        self.ref_model = None
        if self.algo.kl.mode != "none" and not self.lora:
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        # A batch whose teacher annotation failed trains without the distillation term.
        no_opd = self.algo.opd.model_copy(update={"enabled": False})
        self.algo_without_teacher = self.algo.model_copy(update={"opd": no_opd})
        # After the reference copy: the router hooks stay on the policy only.
        self.replay = RoutingReplay(model, learner_cfg.routing_replay)
        self.shares_prompts = learner_cfg.share_prompts and self._why_not_shared(model, ranks) is None
        """A group's prompt runs once per forward (`learner.share_prompts`, where it applies)."""
        self.forward_logprobs = (functools.partial(shared_prompt_logprobs, layouts=usable_layouts(model))
                                 if self.shares_prompts else sequence_logprobs)
        """(model, sequences, response_starts, params, pad_id) -> ([N, T] log-probs, mask): every forward."""
        self.in_parts = ranks.sharded or learner_cfg.microbatch_tokens > 0
        """Mini-batches trained in parts (ranks, micro-batches): denominators come from the whole mini-batch."""
        self.fuses_proximal = (self.algo.needs_prox_forward and learner_cfg.minibatches == 1 and not self.in_parts
                               and self.replay.mode == "none" and self.algo.advantage.dash_threshold is None
                               and not self.lora_dropout)
        """One mini-batch trained whole, no routing replay, no DASH filter: the proximal policy is the policy
        before this step's only update, so the training forward's detached log-probs *are* logp_prox and the
        separate no-grad forward of the batch is skipped."""
        self.splits_rows = self.fuses_proximal and splits_rows(self.algo)
        """The fused forward runs the rows that carry no gradient without one (`learner.gradient_rows`)."""
        self.skips_rows = self.splits_rows and skips_rows(self.algo)
        """... or not at all: their log-probs would change neither the loss nor its denominator."""

    def _why_not_shared(self, model: torch.nn.Module, ranks: Ranks) -> str | None:
        """Why the policy's forwards cannot share prompts (None: they can); logged when asked for."""
        reason = why_nothing_shared(model)
        if ranks.sharded:
            reason = "sharded over ranks (FSDP2 brackets one forward per call)"
        elif self.replay.hooks is not None:
            # Even without replay: the routing is captured for its mismatch metrics.
            reason = "an MoE policy (its routing is captured and replayed per sequence position)"
        if reason and self.cfg.share_prompts:
            log.info("learner.share_prompts: every sequence runs whole: %s", reason)
        return reason

    def _logprobs(self, batch: TrainBatch, model: torch.nn.Module | None = None) -> torch.Tensor:
        model = model or self.model
        with contextlib.nullcontext() if self.half is None else self.half.running(model):
            logp, _mask = self.forward_logprobs(model, batch.sequences, batch.response_starts, self.sampling, self.pad_id)
        return logp[:, : batch.response_mask.shape[1]]

    @contextlib.contextmanager
    def _without_dropout(self):
        """Adapter dropout off for a no-grad forward (the proximal policy is the policy, not a dropout sample)."""
        if not self.lora_dropout:
            yield
            return
        self.model.eval()
        try:
            yield
        finally:
            self.model.train()

    @torch.no_grad()
    def weights_finite(self) -> bool:
        """Every weight it trains (this rank's shard of it) finite, on every rank (a frozen base cannot become
        non-finite). Runs after every step, so it is one
        fused norm over all tensors (a couple of kernels where checking tensor by tensor launches two per
        tensor: a small model's GPU step is bound by its launches), and the exact check tensor by tensor only
        when that norm is not finite (a norm also overflows from finite weights beyond about 1e19)."""
        local = [p.to_local() if hasattr(p, "to_local") else p for p in self.trained]
        finite = not local or bool(torch.isfinite(torch.nn.utils.get_total_norm(local)))
        if not finite:
            finite = bool(torch.stack([t.isfinite().all() for t in local]).all())
        return self.ranks.all(finite)

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

    def my_rows(self, batch: TrainBatch, rows: list[int]) -> list[int]:
        """This rank's rows of `rows`: whole groups, dealt round-robin in group order."""
        if not self.ranks.sharded:
            return rows
        groups = sorted({int(batch.group_index[r]) for r in rows})
        mine = set(self.ranks.share(groups))
        return [r for r in rows if int(batch.group_index[r]) in mine]

    def micro_batches(self, batch: TrainBatch, rows: list[int]) -> list[list[int]]:
        """`rows` in runs of at most `microbatch_tokens` tokens (at least one row each); one run when 0."""
        budget = self.cfg.microbatch_tokens
        if not budget or not rows:
            return [rows]
        out, current, tokens = [], [], 0
        for row in rows:
            length = len(batch.sequences[row])
            if current and tokens + length > budget:
                out.append(current)
                current, tokens = [], 0
            current.append(row)
            tokens += length
        return out + [current]

    def _full_logprobs(self, batch: TrainBatch, model: torch.nn.Module | None = None) -> torch.Tensor:
        """Log-probs of every row of `batch` [B, T]: each rank forwards its rows (micro-batched), the ranks'
        parts are summed into the whole."""
        device = next((model or self.model).parameters()).device
        full = torch.zeros(batch.logp_behav.shape, dtype=torch.float32, device=device)
        for rows, spare in self._lockstep(batch, list(range(len(batch)))):
            logp = self._logprobs(batch.rows(rows), model).float()
            if not spare:
                full[torch.tensor(rows, device=device), : logp.shape[1]] = logp.to(device)
        return self.ranks.sum(full)

    def _lockstep(self, batch: TrainBatch, rows: list[int]):
        """(rows, spare) for each forward of this rank's share of `rows`, micro-batched, as many on every rank:
        a rank out of rows runs a spare forward of `rows[:1]` (the caller gives it zero weight), so FSDP's
        all-gathers and reduce-scatters pair up across the ranks."""
        parts = [part for part in self.micro_batches(batch, self.my_rows(batch, rows)) if part]
        for k in range(self.ranks.max(len(parts))):
            yield (parts[k], False) if k < len(parts) else (rows[:1], True)

    def step(self, batch: TrainBatch, version: int) -> dict:
        """Train on `batch` with the policy at `version`; returns flat metrics."""
        t0 = time.perf_counter()
        self.model.train()
        device = next(self.model.parameters()).device
        if batch.logp_behav.device != device:
            batch = batch.to(device)
        routing_metrics: dict = {}
        logp_fused = None
        gradient_free = 0
        measured_rows = None  # the rows the diagnostics are over (None: all)
        adv = advantages_before_forward(batch, self.algo) if self.splits_rows else None
        if self.fuses_proximal:
            rows = [] if adv is None else gradient_rows(adv.advantages, batch.response_mask)
            gradient_free = len(batch) - len(rows) if 0 < len(rows) < len(batch) else 0
            # With grad (where a row carries one); trained on below as the one mini-batch.
            logp_fused = (split_logprobs(batch, rows, self._logprobs, forward_rest=not self.skips_rows)
                          if gradient_free else self._logprobs(batch))
            logp_prox = logp_fused.detach()
            if gradient_free and self.skips_rows:
                measured_rows = rows
        elif self.algo.needs_prox_forward:
            with torch.no_grad(), self._without_dropout():
                if self.in_parts:
                    logp_prox = self._full_logprobs(batch)
                else:
                    logp_prox, routing_metrics = self.replay.proximal(batch, lambda: self._logprobs(batch))
        else:
            logp_prox = batch.logp_behav  # bypass mode: one forward less
        t_prox = time.perf_counter() - t0
        logp_ref = None
        if self.ref_model is not None:
            with torch.no_grad():
                logp_ref = (self._full_logprobs(batch, self.ref_model) if self.in_parts
                            else self._logprobs(batch, self.ref_model))
        elif self.lora and self.algo.kl.mode != "none":
            with torch.no_grad(), adapters_disabled(self.model):
                logp_ref = self._full_logprobs(batch) if self.in_parts else self._logprobs(batch)
        algo = self.algo
        if algo.opd.enabled and batch.logp_teacher is None:
            algo = self.algo_without_teacher
        if adv is None:  # else computed before the forward, needing no log-probs
            adv = build_advantages(batch.rewards, batch.group_index, batch.response_mask, algo,
                                   logp_prox=logp_prox, logp_teacher=batch.logp_teacher, logp_ref=logp_ref,
                                   finished=batch.finished, process_rewards=batch.process_rewards,
                                   process_mask=batch.process_mask)
        metrics: dict[str, float] = dict(adv.metrics)
        metrics.update(to_floats(routing_metrics))
        sums: dict[str, float] = defaultdict(float)
        diagnostics: dict[str, float] = defaultdict(float)
        chunks = self.minibatch_rows(batch, adv.keep)
        skipped = measured = 0
        if logp_fused is not None and chunks != [list(range(len(batch)))]:
            raise AssertionError("a fused proximal forward needs the whole batch as its one mini-batch")
        for chunk in chunks:
            loss, grad_norm, mb_metrics = self._train_chunk(batch, chunk, algo, adv, logp_prox, logp_ref, logp_fused,
                                                            measured_rows)
            finite = bool(torch.isfinite(loss) and torch.isfinite(grad_norm))
            self.loss_scale.update(finite)
            if all(math.isfinite(float(v)) for v in mb_metrics.values()):
                # Its diagnostics hold even when its gradients overflowed (a float16 loss scale too high).
                measured += 1
                for key, value in mb_metrics.items():
                    diagnostics[key] += float(value)
            if not finite:
                # One non-finite value would spread to every weight through the optimizer: skip the update
                # (the optimizer state stays as it was) and count it; the weights never see it.
                self.optimizer.zero_grad(set_to_none=True)
                skipped += 1
                continue
            self.optimizer.step()
            sums["loss/total"] += loss.item()
            sums["opt/grad_norm"] += float(grad_norm)
        self.replay.end_step()
        for key, value in sums.items():
            metrics[key] = value / max(1, len(chunks) - skipped)
        for key, value in diagnostics.items():
            metrics[key] = value / measured
        metrics["opt/skipped_updates"] = skipped
        if self.loss_scale.enabled:
            metrics["opt/loss_scale"] = self.loss_scale.scale
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
                "batch/gradient_free_sequences": gradient_free,
                "time/prox_s": t_prox,
                "time/step_s": time.perf_counter() - t0,
            }
        )
        if batch.turns is not None:
            metrics["episode/turns_mean"] = batch.turns.float().mean().item()
            metrics["episode/turns_max"] = int(batch.turns.max().item())
            metrics["episode/observation_tokens_mean"] = batch.observation_tokens.float().mean().item()
        metrics.update(batch.episode_figures)
        metrics.update(staleness_stats(batch, version))
        return metrics

    def _objective(self, batch: TrainBatch, rows: list[int], algo, adv, logp_prox, logp_ref, units=None,
                   weight: float = 1.0, logp: torch.Tensor | None = None, measured: list[int] | None = None):
        """Forward `rows` (unless their `logp` is given: the fused proximal forward), their loss, backward of
        `weight` x loss (inside the routing-replay context). With `measured` (the fused forward's rows that
        carry a gradient, the others not forwarded) only those rows enter the objective and its diagnostics;
        the loss still divides by every row's tokens."""
        mb = batch.rows(rows)
        width = mb.response_mask.shape[1]
        idx = torch.tensor(rows, dtype=torch.long)
        response_mask = mb.response_mask
        if measured is not None:
            units = objective_units(logp_prox[idx, :width], mb.logp_behav, response_mask, algo)
            forwarded = torch.isin(idx, torch.tensor(measured, dtype=torch.long)).unsqueeze(1)
            response_mask = response_mask * forwarded.to(response_mask.device, response_mask.dtype)
        with self.replay.training(mb, rows, measure=not self.algo.needs_prox_forward) as mb_routing:
            if logp is None:
                logp = self._logprobs(mb)
            else:  # the fused proximal forward's, over the whole batch's width: trimmed as `mb` is
                logp = logp[:, :width]
            loss, mb_metrics = policy_objective(
                logp, logp_prox[idx, :width], mb.logp_behav, adv.advantages[idx, :width], response_mask,
                algo, logp_ref=None if logp_ref is None else logp_ref[idx, :width],
                logp_teacher=mb.logp_teacher,
                opd_mask=None if adv.opd_mask is None else adv.opd_mask[idx, :width], units=units,
            )
            self.loss_scale.scaled(loss if weight == 1.0 else loss * weight).backward()
        return loss, {**mb_metrics, **to_floats(mb_routing)}

    def _train_chunk(self, batch: TrainBatch, chunk: list[int], algo, adv, logp_prox, logp_ref,
                     logp: torch.Tensor | None = None, measured: list[int] | None = None):
        """Gradients of one mini-batch, clipped: (its loss, the gradient norm, its metrics). Whole on one
        rank; else in parts, each rank its groups, each in micro-batches."""
        self.optimizer.zero_grad(set_to_none=True)
        if not self.in_parts:
            loss, mb_metrics = self._objective(batch, chunk, algo, adv, logp_prox, logp_ref, logp=logp,
                                               measured=measured)
        else:
            idx = torch.tensor(chunk, dtype=torch.long)
            width = trained_width(batch.response_mask[idx])
            units = objective_units(logp_prox[idx, :width], batch.logp_behav[idx, :width],
                                    batch.response_mask[idx, :width], algo)
            local_loss = torch.zeros(())
            weighted: dict[str, float] = defaultdict(float)
            real = 0
            for rows, spare in self._lockstep(batch, chunk):
                # Real parts weigh world_size: FSDP averages the ranks' gradients, and the whole is their sum.
                part_loss, part_metrics = self._objective(batch, rows, algo, adv, logp_prox, logp_ref, units,
                                                          weight=0.0 if spare else float(self.ranks.world_size))
                if not spare:
                    local_loss = local_loss + part_loss.detach().cpu()
                    real += 1
                for key, value in part_metrics.items():  # every key, so every rank sums the same ones
                    weighted[key] += 0.0 if spare else float(value)
            loss = self.ranks.sum(local_loss)
            mb_metrics = self._mean_over_parts(weighted, real)
        self.loss_scale.unscale_(self.trained)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.trained, self.cfg.max_grad_norm)
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        # The skip decision must be the same on every rank.
        finite = self.ranks.all(bool(torch.isfinite(loss)) and bool(torch.isfinite(grad_norm)))
        if not finite:
            loss = torch.tensor(float("nan"))
        return loss, grad_norm, mb_metrics

    def _mean_over_parts(self, sums: dict[str, float], parts: int) -> dict[str, float]:
        """Diagnostics of a mini-batch trained in parts: the mean over its parts on every rank (every part's
        diagnostics are over its own rows, so this approximates the whole mini-batch's)."""
        keys = self.ranks.broadcast(sorted(sums))  # the leader's key order; every rank computed the same keys
        values = torch.tensor([sums.get(k, 0.0) for k in keys] + [float(parts)], dtype=torch.float64)
        total = self.ranks.sum(values)
        count = max(1.0, float(total[-1]))
        return {k: float(v) / count for k, v in zip(keys, total[:-1].tolist())}
