"""A rollout replica's Prometheus metrics, on a per-replica registry (tests run several in one process).

Every series carries a `replica` label, the id the controller knows the replica by, so a dashboard can join
them with the controller's per-replica series (`asyncrl_controller_replica_version_lag{replica}`). Until the
replica registers the label is the id it asks for (or the host name: the pod's name in Kubernetes);
`bind(replica_id)` moves the series to the granted id.
"""

from __future__ import annotations

import socket

from prometheus_client import Counter, Gauge, Histogram

from asyncrl.core.metrics import service_registry

_LABEL = ["replica"]


class RolloutMetrics:
    def __init__(self, replica_id: str = ""):
        self.registry = r = service_registry("rollout")
        self._families = {
            "groups_written": Counter("asyncrl_rollout_groups_written", "Trajectory groups written", _LABEL,
                                      registry=r),
            "pushes_refused": Counter("asyncrl_rollout_pushes_refused",
                                      "UpdateWeights calls refused: not ordered by this replica's controller",
                                      _LABEL, registry=r),
            "groups_rejected": Counter("asyncrl_rollout_groups_rejected",
                                       "Groups that failed validation, dead-lettered instead of written", _LABEL,
                                       registry=r),
            "groups_uniform": Counter("asyncrl_rollout_groups_uniform",
                                      "Groups not written because their rewards were all equal "
                                      "(sampling.drop_uniform_groups): their quota returned", _LABEL, registry=r),
            "process_reward_seconds": Histogram("asyncrl_rollout_process_reward_seconds",
                                                "Scoring one batch's process rewards (rollout.process_rewards)",
                                                _LABEL, registry=r),
            "tokens_generated": Counter("asyncrl_rollout_tokens_generated", "Response tokens generated", _LABEL,
                                        registry=r),
            "generation_seconds": Histogram("asyncrl_rollout_generation_seconds", "Engine generate() time",
                                            _LABEL, registry=r),
            "lease_wait": Histogram("asyncrl_rollout_lease_wait_seconds", "Time waiting for a lease", _LABEL,
                                    registry=r),
            "weight_version": Gauge("asyncrl_rollout_weight_version", "Weight version in the engine", _LABEL,
                                    registry=r),
            "weight_update_seconds": Histogram("asyncrl_rollout_weight_update_seconds", "Weight update time",
                                               _LABEL, registry=r),
            "weight_update_pause": Histogram("asyncrl_rollout_weight_update_pause_seconds",
                                             "Generation pause caused by a weight update", _LABEL, registry=r),
            "reward_mean": Gauge("asyncrl_rollout_reward_mean", "Mean reward of the last group", _LABEL, registry=r),
            "teacher_seconds": Histogram("asyncrl_rollout_teacher_seconds",
                                         "Teacher annotation of one group (Score calls, retries included)", _LABEL,
                                         registry=r),
            "teacher_failures": Counter("asyncrl_rollout_teacher_failures",
                                        "Groups written without the teacher's annotation (the teacher did not "
                                        "answer)", _LABEL, registry=r),
        }
        self._reward_errors = Counter("asyncrl_rollout_reward_errors", "Rewards that raised or timed out (scored 0)",
                                      [*_LABEL, "kind"], registry=r)  # fmt: skip
        self._error_kinds = {"timeout"}  # present from the start (at 0), so dashboards and alerts see the series
        self.replica = ""
        self.bind(replica_id or socket.gethostname())

    def bind(self, replica_id: str) -> None:
        """Label every series with `replica_id` from now on; the series of the previous id go (their counts
        carry over, so a rename does not look like a reset to rate())."""
        if replica_id == self.replica:
            return
        old, self.replica = self.replica, replica_id
        for name, family in self._families.items():
            child = family.labels(replica=replica_id)
            if old:
                _carry_over(family, old, child)
                family.remove(old)
            setattr(self, name, child)
        for kind in self._error_kinds:
            child = self._reward_errors.labels(replica=replica_id, kind=kind)
            if old:
                child.inc(self._reward_errors.labels(replica=old, kind=kind)._value.get())
                self._reward_errors.remove(old, kind)

    def reward_error(self, kind: str) -> None:
        self._error_kinds.add(kind)
        self._reward_errors.labels(replica=self.replica, kind=kind).inc()


def _carry_over(family, old: str, child) -> None:
    """Copy a counter's or gauge's value from the `old` label to `child` (histograms start afresh)."""
    previous = family.labels(replica=old)
    if isinstance(family, Counter):
        child.inc(previous._value.get())
    elif isinstance(family, Gauge):
        child.set(previous._value.get())
