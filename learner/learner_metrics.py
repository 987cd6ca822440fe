"""The learner's Prometheus metrics, on its own registry."""

from __future__ import annotations

import time

from prometheus_client import Counter, Gauge, Histogram

from asyncrl.core.records.learner_figures import STEP_METRICS
from asyncrl.core.runtime.metrics import service_registry
from asyncrl.learner.busy import WINDOW_STEPS

# Staleness is counted in versions: 0..eta under the bound, more only when eta is unbounded.
_STALENESS_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64)
# From a group trained right after it was written (sub-second) to one that waited out a long learner stall.
_AGE_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
# Step metrics exported as `asyncrl_learner_diagnostic{name}`: the rollout-correction (IS) and mismatch
# diagnostics, the PPO clipping figures, the optimiser's gradient norm, distillation, routing replay and the
# length dynamics; and every step metric a figure of the status page is read from (`learner_figures`) but those
# with gauges of their own.
_DIAGNOSTIC_PREFIXES = ("rc/", "loss/", "opd/", "routing/", "opt/grad_norm", "response/", "length/", "process/")
_DIAGNOSTIC_FIGURES = STEP_METRICS - {"reward/mean", "staleness/mean"}


class LearnerMetrics:
    def __init__(self, run: str = ""):
        self.registry = r = service_registry("learner", run)
        self.step = Gauge("asyncrl_learner_step", "Learner steps done", registry=r)
        self.version = Gauge("asyncrl_learner_version", "Policy version published", registry=r)
        self.consumed = Counter("asyncrl_learner_trajectories_consumed", "Trajectories trained on", registry=r)
        self.tokens = Counter("asyncrl_learner_tokens_trained", "Response tokens trained on", registry=r)
        self.reward = Gauge("asyncrl_learner_reward_mean", "Mean reward of the last batch", registry=r)
        self.eval_accuracy = Gauge("asyncrl_learner_eval_accuracy", "Greedy held-out accuracy", registry=r)
        self.staleness = Gauge("asyncrl_learner_staleness_mean", "Mean staleness of the last batch", registry=r)
        self.staleness_versions = Histogram(
            "asyncrl_learner_staleness_versions",
            "Staleness of each trained sequence: learner version minus its oldest token's weight version.",
            buckets=_STALENESS_BUCKETS, registry=r)
        self.group_age = Histogram("asyncrl_learner_group_age_seconds",
                                   "Time from a group's write into the buffer to the step that trained it.",
                                   buckets=_AGE_BUCKETS, registry=r)
        self.buffer_backlog = Gauge("asyncrl_buffer_backlog_groups",
                                    "Groups in the buffer not yet delivered to the learner (after the last step).",
                                    registry=r)
        self.buffer_pending = Gauge("asyncrl_buffer_pending_groups",
                                    "Groups delivered to the learner and not yet acknowledged (after the last step).",
                                    registry=r)
        self.step_seconds = Histogram("asyncrl_learner_step_seconds", "Learner step time", registry=r)
        self.busy = Gauge("asyncrl_learner_busy_ratio",
                          f"Fraction of the wall time of the last {WINDOW_STEPS} steps spent in train steps (1: never waits)",
                          registry=r)
        self.push_seconds = Histogram("asyncrl_learner_push_seconds", "Weight push time (start..commit)", registry=r)
        self.checkpoint_stall_seconds = Histogram(
            "asyncrl_learner_checkpoint_stall_seconds",
            "Time a checkpoint stopped training: the copy to host memory (and any wait for the previous write) "
            "in the background, the whole save in line", registry=r)
        self.push_wait_seconds = Histogram("asyncrl_learner_push_wait_seconds",
                                           "Time a step spent on its weight push on the learner's critical path "
                                           "(snapshot and waiting for the previous push, or the whole push when "
                                           "not in the background)", registry=r)
        self.groups_formed = Counter("asyncrl_learner_broadcast_groups_formed",
                                     "Pushes that formed a broadcast group (the others reused one)", registry=r)
        self.push_bytes = Counter("asyncrl_learner_push_bytes", "Bytes of weights pushed to the replicas",
                                  registry=r)
        self.dead_letters = Counter("asyncrl_learner_dead_letters", "Buffer entries refused and dead-lettered",
                                    registry=r)
        self.stale_groups = Counter("asyncrl_learner_stale_groups",
                                    "Groups read older than controller.eta at the version that would train them "
                                    "(learner.stale_groups: dropped, their quota returned and prompt generated "
                                    "again; or trained)", registry=r)
        self.stale_hold_seconds = Counter("asyncrl_learner_stale_hold_seconds",
                                          "Time the learner waited before its steps for leases about to fall "
                                          "behind controller.eta (learner.stale_groups: hold)", registry=r)
        self.skipped_updates = Counter("asyncrl_learner_skipped_updates",
                                       "Mini-batch updates skipped for a non-finite loss or gradient", registry=r)
        self.teacher_failures = Counter("asyncrl_learner_teacher_failures",
                                        "Batches trained without the teacher (Score failed every attempt)", registry=r)
        self.kl = Gauge("asyncrl_learner_kl_behav_prox", "KL(behav||prox), k3 estimator, last step", registry=r)
        self.diagnostic = Gauge("asyncrl_learner_diagnostic",
                                "The last step's diagnostics by name: rollout-correction IS weights and "
                                "training-inference mismatch (rc/*), PPO clipping (loss/*), grad norm, distillation "
                                "(opd/*), routing replay (routing/*), length dynamics (length/*).", ["name"],
                                registry=r)

    def observe_push(self, push) -> None:
        self.push_seconds.observe(push.total_s)
        self.push_bytes.inc(push.bytes_sent)
        self.groups_formed.inc(int(push.new_group))

    def observe_step(self, metrics: dict, version: int, push_wait_s: float,
                     created_unix_s: list[float] | None = None) -> None:
        self.step.inc()
        self.version.set(version)
        self.push_wait_seconds.observe(push_wait_s)
        self.consumed.inc(metrics["batch/sequences"])
        self.tokens.inc(metrics.get("batch/response_tokens", 0))
        self.reward.set(metrics["reward/mean"])
        self.staleness.set(metrics["staleness/mean"])
        for staleness, count in metrics.get("staleness/hist", {}).items():
            for _ in range(count):
                self.staleness_versions.observe(int(staleness))
        now = time.time()
        for created in created_unix_s or ():
            if created > 0:
                self.group_age.observe(max(0.0, now - created))
        self.step_seconds.observe(metrics["time/step_s"])
        if metrics.get("time/busy") is not None:
            self.busy.set(metrics["time/busy"])
        self.skipped_updates.inc(metrics.get("opt/skipped_updates", 0))
        kl = metrics.get("rc/kl_k3")
        if kl is not None:
            self.kl.set(kl)
        for name, value in metrics.items():
            if name.startswith(_DIAGNOSTIC_PREFIXES) or name in _DIAGNOSTIC_FIGURES:
                try:
                    scalar = float(value)  # numbers and 0-d tensors
                except (TypeError, ValueError, RuntimeError):
                    continue  # histograms and per-layer vectors stay in the event log and TensorBoard
                self.diagnostic.labels(name=name).set(scalar)

    def observe_buffer(self, backlog: int, pending: int) -> None:
        self.buffer_backlog.set(backlog)
        self.buffer_pending.set(pending)
