"""A rollout replica's Prometheus metrics, on a per-replica registry (tests run several in one process)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from asyncrl.core.metrics import service_registry


class RolloutMetrics:
    def __init__(self):
        self.registry = r = service_registry("rollout")
        self.groups_written = Counter("asyncrl_rollout_groups_written", "Trajectory groups written", registry=r)
        self.pushes_refused = Counter("asyncrl_rollout_pushes_refused",
                                      "UpdateWeights calls refused: not ordered by this replica's controller", registry=r)
        self.groups_rejected = Counter("asyncrl_rollout_groups_rejected",
                                       "Groups that failed validation, dead-lettered instead of written", registry=r)
        self.tokens_generated = Counter("asyncrl_rollout_tokens_generated", "Response tokens generated", registry=r)
        self.generation_seconds = Histogram("asyncrl_rollout_generation_seconds", "Engine generate() time", registry=r)
        self.lease_wait = Histogram("asyncrl_rollout_lease_wait_seconds", "Time waiting for a lease", registry=r)
        self.weight_version = Gauge("asyncrl_rollout_weight_version", "Weight version in the engine", registry=r)
        self.weight_update_seconds = Histogram("asyncrl_rollout_weight_update_seconds", "Weight update time", registry=r)
        self.weight_update_pause = Histogram("asyncrl_rollout_weight_update_pause_seconds",
                                             "Generation pause caused by a weight update", registry=r)  # fmt: skip
        self.reward_mean = Gauge("asyncrl_rollout_reward_mean", "Mean reward of the last group", registry=r)
        self.reward_errors = Counter("asyncrl_rollout_reward_errors", "Rewards that raised or timed out (scored 0)",
                                     ["kind"], registry=r)  # fmt: skip
