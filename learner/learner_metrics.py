"""The learner's Prometheus metrics, on its own registry."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from asyncrl.core.metrics import service_registry


class LearnerMetrics:
    def __init__(self):
        self.registry = r = service_registry("learner")
        self.step = Gauge("asyncrl_learner_step", "Learner steps done", registry=r)
        self.version = Gauge("asyncrl_learner_version", "Policy version published", registry=r)
        self.consumed = Counter("asyncrl_learner_trajectories_consumed", "Trajectories trained on", registry=r)
        self.reward = Gauge("asyncrl_learner_reward_mean", "Mean reward of the last batch", registry=r)
        self.eval_accuracy = Gauge("asyncrl_learner_eval_accuracy", "Greedy held-out accuracy", registry=r)
        self.staleness = Gauge("asyncrl_learner_staleness_mean", "Mean staleness of the last batch", registry=r)
        self.step_seconds = Histogram("asyncrl_learner_step_seconds", "Learner step time", registry=r)
        self.push_seconds = Histogram("asyncrl_learner_push_seconds", "Weight push time (begin..commit)", registry=r)
        self.dead_letters = Counter("asyncrl_learner_dead_letters", "Buffer entries refused and dead-lettered",
                                    registry=r)
        self.skipped_updates = Counter("asyncrl_learner_skipped_updates",
                                       "Mini-batch updates skipped for a non-finite loss or gradient", registry=r)
        self.teacher_failures = Counter("asyncrl_learner_teacher_failures",
                                        "Batches trained without the teacher (Score failed every attempt)", registry=r)
        self.kl = Gauge("asyncrl_learner_kl_behav_prox", "KL(behav||prox), k3 estimator, last step", registry=r)

    def observe_step(self, metrics: dict, push) -> None:
        self.step.inc()
        self.version.set(push.version)
        self.consumed.inc(metrics["batch/sequences"])
        self.reward.set(metrics["reward/mean"])
        self.staleness.set(metrics["staleness/mean"])
        self.step_seconds.observe(metrics["time/step_s"])
        self.push_seconds.observe(push.total_s)
        self.skipped_updates.inc(metrics.get("opt/skipped_updates", 0))
        kl = metrics.get("rc/kl_k3")
        if kl is not None:
            self.kl.set(kl)
