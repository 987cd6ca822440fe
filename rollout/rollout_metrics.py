"""A rollout replica's Prometheus metrics, on a per-replica registry (tests run several in one process).

Every series carries a `replica` label, the id the controller knows the replica by, so a dashboard can join
them with the controller's per-replica series (`asyncrl_controller_replica_version_lag{replica}`). Until the
replica registers the label is the id it asks for (or the host name: the pod's name in Kubernetes);
`bind(replica_id)` moves the series to the granted id.
"""

from __future__ import annotations

import socket

from prometheus_client import Counter, Gauge, Histogram

from asyncrl.core.agents.episode import END_REASONS
from asyncrl.core.runtime.metrics import service_registry

_LABEL = ["replica"]


class RolloutMetrics:
    def __init__(self, replica_id: str = "", run: str = ""):
        self.registry = r = service_registry("rollout", run)
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
            "groups_unplayable": Counter("asyncrl_rollout_groups_unplayable",
                                         "Groups not written because an episode of theirs ended before the "
                                         "model's first turn (its environment failed at the start): their quota "
                                         "returned", _LABEL, registry=r),
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
            "episode_turns": Histogram("asyncrl_rollout_episode_turns", "Model turns per finished episode", _LABEL,
                                       buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32, 64), registry=r),
            "episode_tokens": Histogram("asyncrl_rollout_episode_tokens",
                                        "Response tokens per finished episode (the model's and the observations')",
                                        _LABEL, buckets=(16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384),
                                        registry=r),
            "environment_seconds": Histogram("asyncrl_rollout_environment_seconds",
                                             "One environment call (reset or step), from submit to answer", _LABEL,
                                             buckets=(0.001, 0.005, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
                                             registry=r),
            "episodes_in_flight": Gauge("asyncrl_rollout_episodes_in_flight",
                                        "Episodes started and not yet ended on this replica", _LABEL, registry=r),
        }
        self._labelled = {
            "kind": Counter("asyncrl_rollout_reward_errors", "Rewards that raised or timed out (scored 0)",
                            [*_LABEL, "kind"], registry=r),
            "reason": Counter("asyncrl_rollout_episodes_ended", "Episodes ended, by why (done, max_turns, "
                              "max_tokens, timeout, environment_error)", [*_LABEL, "reason"], registry=r),
            "tool": Counter("asyncrl_rollout_tool_calls", "Tool calls by tool and outcome (ok, error)",
                            [*_LABEL, "tool", "outcome"], registry=r),
        }
        self._seen: set[tuple[str, tuple[str, ...]]] = {("kind", ("timeout",)), ("tool", ("<invalid>", "error")),
                                                          *(("reason", (reason,)) for reason in END_REASONS)}
        """(family, extra label values) in use: present from the start (at 0) where known, so dashboards and
        alerts see the series, and carried over by `bind`."""
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
        for family_name, values in self._seen:
            family = self._labelled[family_name]
            child = family.labels(replica_id, *values)
            if old:
                child.inc(family.labels(old, *values)._value.get())
                family.remove(old, *values)

    def _count(self, family: str, *values: str) -> None:
        self._seen.add((family, values))
        self._labelled[family].labels(self.replica, *values).inc()

    def reward_error(self, kind: str) -> None:
        self._count("kind", kind)

    def episode_ended(self, result) -> None:
        """A finished episode (`asyncrl.core.agents.episode.EpisodeResult`): its reason, length and tool calls."""
        self._count("reason", result.end_reason)
        self.episode_turns.observe(result.turns)
        self.episode_tokens.observe(len(result.token_ids))
        for outcome in result.tools:
            self._count("tool", outcome.tool, "ok" if outcome.ok else "error")


def _carry_over(family, old: str, child) -> None:
    """Copy a counter's or gauge's value from the `old` label to `child` (histograms start afresh)."""
    previous = family.labels(replica=old)
    if isinstance(family, Counter):
        child.inc(previous._value.get())
    elif isinstance(family, Gauge):
        child.set(previous._value.get())
