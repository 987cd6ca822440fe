"""The learner, built from the config in one place: its ranks, the model (sharded or not), the trainer, the
checkpoint it resumes from, and the loop with every collaborator the loop takes (buffer, controller seat,
weight publisher, teacher, evaluations, checkpoints, metrics and their sinks). The learner service only
serves what this builds.

With `learner.world_size` > 1 every rank builds its part: rank 0 the whole loop (`Leader`), the others a
`Follower` that runs the leader's steps and saves until told to stop (`learner.sharding`).
"""

from __future__ import annotations

import functools
import itertools
import logging
import signal
from dataclasses import dataclass
from pathlib import Path

import torch

from asyncrl.core.agents.factory import Episodes
from asyncrl.core.buffer import make_buffer
from asyncrl.core.buffer.trajectory_checks import checkpoint_limits
from asyncrl.core.checks.config_error import ConfigError
from asyncrl.core.config.file import dump_config
from asyncrl.core.config.preflight import check_checkpoint
from asyncrl.core.determinism.invariant_model import use_invariant_kernels
from asyncrl.core.determinism.modes import invariant_learner, seeded_sampling
from asyncrl.core.model.modeling import load_causal_lm, pad_token_id, torch_dtype
from asyncrl.core.model.sampling import SamplingParams
from asyncrl.core.records.learner import MemoryPlanned
from asyncrl.core.runtime.events import EventLog
from asyncrl.core.tasks import task_for_run
from asyncrl.core.tasks.reward_pool import RewardPool
from asyncrl.core.wire.auth import resolve_auth
from asyncrl.core.wire.grpc_util import channel as grpc_channel
from asyncrl.core.wire.grpc_util import wait_for_channel
from asyncrl.core.wire.learner_secret import resolve_learner_secret
from asyncrl.learner.adapters import DEFAULT_RUN, inject_adapters, lora_parameters
from asyncrl.learner.checkpoint import Checkpointer, load_checkpoint
from asyncrl.learner.checkpoint_index import resume_path
from asyncrl.learner.checkpoint_saver import FollowerSaves
from asyncrl.learner.half_precision import HALF_DTYPES
from asyncrl.learner.held_out import evaluate_held_out
from asyncrl.learner.intake import lookahead_groups
from asyncrl.learner.learner_metrics import LearnerMetrics
from asyncrl.learner.loop import LearnerLoop
from asyncrl.learner.memory_plan import GIB, MemoryWatch, available_bytes, fit, plan_memory
from asyncrl.learner.progress import LearnerProgress
from asyncrl.learner.replica_eval import BackgroundEvaluations, ReplicaEvaluator
from asyncrl.learner.seat import SeatedController
from asyncrl.learner.sharding import (
    SINGLE,
    STOP,
    Mirror,
    Ranks,
    follow,
    init_ranks,
    leave,
    rank_device,
    shard,
)
from asyncrl.learner.tracking import MetricSinks
from asyncrl.learner.trainer import Trainer
from asyncrl.push.sender import WeightPublisher
from asyncrl.v1 import controller_pb2_grpc, teacher_pb2_grpc

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Leader:
    """Rank 0 (the only rank of an unsharded learner): the loop and what the service around it needs."""

    loop: LearnerLoop
    controller: SeatedController
    """The controller, through the learner's seat (it answers the controller's liveness challenges)."""
    metrics: LearnerMetrics
    ranks: Ranks
    rewards: RewardPool
    """The held-out evaluation's reward workers."""

    def close(self) -> None:
        """After the loop: the sinks flushed, a push still in flight let end (bounded by its time-outs), the
        reward workers let go (a run removed from a learner of several leaves no threads behind)."""
        self.loop.sinks.close()
        self.loop.publisher.close()
        self.rewards.close()

    def release_followers(self) -> None:
        """Tell the other ranks to stop, after a loop that ended normally. A leader that failed mid-step leaves
        them inside a collective, and its exit (torchrun then stops them) is what ends them."""
        if self.ranks.sharded:
            self.ranks.broadcast((STOP,))
            leave(self.ranks)


@dataclass(frozen=True, kw_only=True)
class Follower:
    """A rank other than 0: it follows the leader's steps and saves."""

    trainer: Trainer
    ranks: Ranks
    mirror: Mirror | None

    def run(self) -> LearnerProgress:
        """Until the leader says stop. Signals are the leader's to act on (it finishes its step, then stops
        every rank); a follower leaving mid-collective would hang it."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        follow(self.trainer, self.ranks, self.mirror, FollowerSaves(self.trainer.model, self.trainer.optimizer,
                                                                    self.ranks))
        leave(self.ranks)
        return LearnerProgress()


def build_learner(config) -> Leader | Follower:
    """This rank's part of the learner, its checkpoint (if any) resumed."""
    resolve_learner_secret(config.security)  # refused before anything loads when missing
    ranks = init_ranks(config.learner.world_size, config.learner.device)
    if config.learner.threads:
        torch.set_num_threads(config.learner.threads)
    torch.manual_seed(config.seed)
    check_checkpoint(config.model.path, "model.path")
    half = master_weights_for(config)
    model = load_causal_lm(config.model.path, "float32" if half else config.model.dtype,
                           rank_device(config.learner.device))
    if invariant_learner(config.model.determinism):
        use_invariant_kernels(model)  # the engines' computations: logp_prox == logp_behav bit for bit
    # LoRA: adapters injected in place, the base frozen (before the memory plan counts what trains).
    adapter = inject_adapters(model, config.learner.lora) if config.learner.lora.enabled else None
    config, memory = fit_in_memory(config, model)  # before the reference copy and the optimizer exist
    if ranks.leader:
        # What this learner runs with, every default filled in (`up` writes the run's config too; in a
        # container this is the run directory's record of the config).
        Path(config.run_dir).mkdir(parents=True, exist_ok=True)
        dump_config(config, Path(config.run_dir) / "config.learner.resolved.yaml")
    mirror = None
    if ranks.sharded:
        mirror = Mirror.before_sharding(model, ranks)
        shard(model, config.learner.mixed_precision, config.learner.activation_checkpointing)
    elif config.learner.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    sampling = SamplingParams.from_config(config.sampling)
    trainer = Trainer(model, config.learner, sampling, pad_token_id(model), ranks, half=half)
    # The leader's view of the run directory.
    path = ranks.broadcast(resume_path(config.learner.checkpoint, config.run_dir))
    meta = load_checkpoint(path, model, trainer.optimizer) if path else None
    if mirror is not None:
        mirror.refresh(model)
    if not ranks.leader:
        return Follower(trainer=trainer, ranks=ranks, mirror=mirror)
    return leader_for(config, trainer, adapter, ranks=ranks, mirror=mirror, memory=memory, resumed=(meta, path))


def leader_for(config, trainer: Trainer, adapter, *, ranks: Ranks = SINGLE, mirror=None, memory=None,
               resumed=(None, None), run: str = DEFAULT_RUN, on_base=None) -> Leader:
    """The loop of one run and its collaborators around `trainer` (its model built and resumed): its controller,
    buffer, push, evaluations, checkpoints, metrics. `adapter`: the run's `AdapterSpec` (None: full weights);
    `resumed`: (the checkpoint's meta, its path) or Nones; `run`/`on_base`: the run's adapter and how its
    model work is run on a base that several runs share (`learner.runs`)."""
    model = trainer.model
    meta, path = resumed
    full_model = model if mirror is None else mirror.module
    auth = resolve_auth(config.security)
    controller = SeatedController(controller_pb2_grpc.ControllerStub(
        wait_for_channel(config.controller.address, 120, auth, patient=True)),
        resolve_learner_secret(config.security))
    sampling = SamplingParams.from_config(config.sampling)
    teacher = None
    if config.teacher.enabled and config.teacher.annotate:
        teacher = teacher_pb2_grpc.TeacherStub(wait_for_channel(config.teacher.address, 300, auth))
    task = task_for_run(config)
    limits = checkpoint_limits(config.model.path, config.sampling, config.reward, config.environment,
                               config.controller.difficulty)
    episodes = Episodes.for_run(config, task, limits.max_sequence_tokens)
    held_out = task.eval_prompts()[: config.learner.eval_prompts or None]
    # The held-out responses are scored as a replica scores its samples: each reward bounded by reward.timeout_s.
    rewards = RewardPool(task.reward_fn, config.reward.workers, config.reward.timeout_s)
    metrics = LearnerMetrics(config.run_name)
    groups_per_step = config.learner.batch_size // config.sampling.group_size
    loop = LearnerLoop(
        learner=config.learner,
        groups_per_step=groups_per_step,
        lookahead=lookahead_groups(config.learner.oldest_first, config.controller.eta, groups_per_step),
        model_path=config.model.path,
        trainer=trainer,
        buffer=make_buffer(config.buffer, consumer="learner-0"),
        controller_stub=controller,
        publisher=WeightPublisher(controller, full_model, config.learner.weight_transport,
                                  config.controller.push_timeout_s, adapter=adapter,
                                  named=None if adapter is None else lora_parameters(full_model, run),
                                  wire_dtype=master_weights_for(config)),
        evaluate=_as_engines_run(trainer, functools.partial(
            evaluate_held_out, full_model, task, sampling, config.learner.eval_pass_k, config.learner.eval_samples,
            config.learner.eval_samples_max, config.learner.eval_pass_k_large, episodes, on_model=on_base,
            prompts=held_out, score=rewards.score)),
        events=EventLog(config.run_dir, "learner"),
        metrics=metrics,
        limits=limits,
        teacher_stub=teacher,
        teacher=config.teacher,
        checkpointer=Checkpointer(config, task.tokenizer.hf, ranks, export_model=full_model, adapter=adapter,
                                  run=run),
        sinks=MetricSinks(config),
        ranks=ranks,
        mirror=mirror,
        replica_evals=_replica_evals(config, controller, task, held_out, sampling, auth, episodes, rewards),
        memory_watch=None if memory is None else MemoryWatch(memory.plan),
        eta=config.controller.eta,
        canonical_order=seeded_sampling(config.model.determinism),
        on_base=on_base,
    )
    if memory is not None:
        loop.events.write(MemoryPlanned(parts=memory.plan.parts(), needed=memory.plan.needed,
                                        available=memory.available, given_up=list(memory.given_up)))
    if meta is not None:
        loop.resume(meta, path)
    return Leader(loop=loop, controller=controller, metrics=metrics, ranks=ranks, rewards=rewards)


def _as_engines_run(trainer: Trainer, evaluate):
    """`evaluate` on the policy as the engines run it: with float32 master weights, their half rounding."""
    if trainer.half is None:
        return evaluate

    def run(*args, **kwargs):
        with torch.no_grad(), trainer.half.running(trainer.model):
            return evaluate(*args, **kwargs)

    return run


def master_weights_for(config) -> torch.dtype | None:
    """The half dtype whose forwards run over float32 master weights (`asyncrl.learner.half_precision`): a half
    `model.dtype` trained on full weights on one rank. None: the weights stay in model.dtype (a LoRA run's
    frozen base; a sharded learner, which has FSDP2's own mixed precision)."""
    dtype = torch_dtype(config.model.dtype)
    if dtype not in HALF_DTYPES or config.learner.lora.enabled or config.learner.world_size > 1:
        return None
    return dtype


def fit_in_memory(config, model) -> tuple:
    """The config the learner can run in this machine's memory, and the verdict (`learner.memory_plan`); None
    when not checked (`learner.memory_check: false`, a GPU or sharded learner: its host memory holds other
    parts). Raises ConfigError when even without the background checkpoint and push it does not fit."""
    learner = config.learner
    if not learner.memory_check or learner.world_size > 1 or not learner.device.startswith("cpu"):
        return config, None
    weight_bytes = sum(t.numel() * t.element_size() for t in itertools.chain(model.parameters(), model.buffers()))
    plan = plan_memory(
        weight_bytes=weight_bytes,
        trainable_bytes=sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad),
        # LoRA's KL reference is the base with its adapters off: no copy.
        kl_reference=learner.algo.kl.mode != "none" and not learner.lora.enabled,
        push_in_background=learner.push_in_background,
        checkpoint_background=learner.checkpoint.background, trained_only=learner.lora.enabled,
        sparse_deltas=learner.weight_transport.sparse_deltas,
    )  # fmt: skip
    verdict = fit(plan, available_bytes(held=weight_bytes))
    if not verdict.fits:
        raise ConfigError(verdict.refusal())
    if verdict.given_up:
        log.warning("the learner's memory plan (%s) does not fit in the %.2f GiB available: turning %s off",
                    verdict.plan.describe(), verdict.available / GIB, " and ".join(verdict.given_up))
        config = config.model_copy(deep=True)
        if "learner.checkpoint.background" in verdict.given_up:
            config.learner.checkpoint.background = False
        if "learner.push_in_background" in verdict.given_up:
            config.learner.push_in_background = False
    return config, verdict


def _replica_evals(config, controller, task, held_out, sampling, auth, episodes,
                   rewards: RewardPool) -> BackgroundEvaluations | None:
    """Evaluations of `held_out` on a rollout replica (`learner.eval_by: replica`), else None (the learner
    evaluates)."""
    if config.learner.eval_by != "replica":
        return None
    evaluator = ReplicaEvaluator(controller, functools.partial(grpc_channel, auth=auth), task, sampling.max_new_tokens,
                                 config.rollout.engine.max_batch_size, config.learner.eval_timeout_s, episodes,
                                 prompts=held_out, score=rewards.score)
    return BackgroundEvaluations(evaluator)
