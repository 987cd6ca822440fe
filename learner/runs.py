"""Several LoRA runs trained by one learner on one copy of the base (`runs:`, docs/lora.md).

The base model is loaded once; each run's adapter is injected into it under the run's name, with its own rank
and targets, and each run has its own `Trainer` (its AdamW over its adapter only), controller, buffer stream,
push of its adapter alone, checkpoints, events and metrics: the loop of a single run (`LearnerLoop`), one per
run, each on a thread of its own. What they share is the model, so everything that runs it (a step, an
evaluation, a checkpoint's copy) takes the base's turn: one run at a time, that run's adapter active. A run
waiting for data holds nothing, so the learner trains whichever run has a full batch; the turn is handed out
first come, first served, so a run with a batch waits at most for the steps of the runs ahead of it.
"""

from __future__ import annotations

import contextlib
import threading

import torch

from asyncrl.core.config.file import dump_config
from asyncrl.core.config.preflight import check_checkpoint
from asyncrl.core.config.runs import run_configs
from asyncrl.core.model.modeling import load_causal_lm, pad_token_id
from asyncrl.core.model.sampling import SamplingParams
from asyncrl.core.wire.learner_secret import resolve_learner_secret
from asyncrl.learner.adapters import inject_adapters, run_active
from asyncrl.learner.builder import Leader, leader_for
from asyncrl.learner.checkpoint import load_checkpoint
from asyncrl.learner.checkpoint_index import resume_path
from asyncrl.learner.sharding import SINGLE, rank_device
from asyncrl.learner.trainer import Trainer


class SharedBase:
    """One base model holding every run's adapter; `turn(run)` is one run's exclusive use of it."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self._queue = threading.Condition()
        self._next_ticket = 0
        self._serving = 0

    @contextlib.contextmanager
    def exclusive(self):
        """Inside, nothing else uses the model. Granted in the order asked for (a ticket lock): no run can be
        passed over while it waits."""
        with self._queue:
            ticket = self._next_ticket
            self._next_ticket += 1
            self._queue.wait_for(lambda: self._serving == ticket)
        try:
            yield
        finally:
            with self._queue:
                self._serving += 1
                self._queue.notify_all()

    @contextlib.contextmanager
    def turn(self, run: str):
        """Inside, the model is `run`'s alone: its adapter active, the only one with gradients."""
        with self.exclusive(), run_active(self.model, run):
            yield


class RunLearners:
    """The learner of a deployment of several runs: one base, a `Leader` per run, runs added while it trains."""

    def __init__(self, config):
        resolve_learner_secret(config.security)  # refused before anything loads when missing
        if config.learner.threads:
            torch.set_num_threads(config.learner.threads)
        torch.manual_seed(config.seed)
        check_checkpoint(config.model.path, "model.path")
        self.base = SharedBase(load_causal_lm(config.model.path, config.model.dtype,
                                              rank_device(config.learner.device)))
        self.leaders: dict[str, Leader] = {}
        self.configs: dict = {}
        """Run name -> its config (`asyncrl.core.config.runs.run_config`)."""

    def add(self, run: str, cfg) -> Leader:
        """Run `run`'s adapter injected into the base (while no other run uses it), its trainer resumed from its
        own latest checkpoint (`learner.checkpoint.resume_from` of the run), and its loop."""
        model = self.base.model
        with self.base.exclusive():  # peft adds the adapter's modules to every targeted layer
            spec = inject_adapters(model, cfg.learner.lora, run=run)
        dump_config(cfg, f"{cfg.run_dir}/config.learner.resolved.yaml")
        with self.base.turn(run):  # the trainer's optimizer takes the parameters that train now: this run's adapter
            trainer = Trainer(model, cfg.learner, SamplingParams.from_config(cfg.sampling), pad_token_id(model),
                              SINGLE)
            path = resume_path(cfg.learner.checkpoint, cfg.run_dir)
            meta = load_checkpoint(path, model, trainer.optimizer) if path else None
        self.leaders[run] = leader_for(cfg, trainer, spec, resumed=(meta, path), run=run,
                                       turn=lambda: self.base.turn(run))
        self.configs[run] = cfg
        return self.leaders[run]


def build_run_learners(config) -> RunLearners:
    """The base loaded once, then every run of `config` added (`RunLearners.add`)."""
    learners = RunLearners(config)
    for run, cfg in run_configs(config).items():
        learners.add(run, cfg)
    return learners
