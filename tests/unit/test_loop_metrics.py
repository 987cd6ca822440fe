"""The RL loop's own Prometheus series: per-replica version lag at the controller, the replica label on a
replica's series, the learner's staleness histogram, push bytes, group age, buffer depth and diagnostics."""

from __future__ import annotations

import time
from types import SimpleNamespace

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from asyncrl.controller.controller_metrics import ControllerMetrics
from asyncrl.core.runtime.metrics import service_registry
from asyncrl.learner.learner_metrics import LearnerMetrics
from asyncrl.rollout.rollout_metrics import RolloutMetrics


def samples(registry) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_controller_fleet_series_come_from_the_snapshot_at_scrape_time():
    snap = {"current_version": 7, "active_leases": 3, "max_admissible": 640,
            "replicas": [{"replica_id": "a", "weight_version": 7, "alive": True, "active_leases": 2},
                         {"replica_id": "b", "weight_version": 5, "alive": True, "active_leases": 1},
                         {"replica_id": "dead", "weight_version": 1, "alive": False, "active_leases": 0}]}
    metrics = ControllerMetrics()
    metrics.follow(lambda: snap)
    got = samples(metrics.registry)
    assert got[("asyncrl_controller_replica_version_lag", (("replica", "a"),))] == 0
    assert got[("asyncrl_controller_replica_version_lag", (("replica", "b"),))] == 2
    assert ("asyncrl_controller_replica_version_lag", (("replica", "dead"),)) not in got
    assert got[("asyncrl_controller_replica_active_leases", (("replica", "a"),))] == 2
    assert got[("asyncrl_controller_active_leases", ())] == 3
    assert got[("asyncrl_controller_max_admissible_trajectories", ())] == 640
    # Read afresh at every scrape; eta unbounded has no ceiling series.
    snap.update(current_version=9, max_admissible=None)
    got = samples(metrics.registry)
    assert got[("asyncrl_controller_replica_version_lag", (("replica", "b"),))] == 4
    assert not any(name == "asyncrl_controller_max_admissible_trajectories" for name, _ in got)


def test_rollout_series_are_labelled_with_the_granted_replica_id():
    metrics = RolloutMetrics("replica-0")
    metrics.groups_written.inc(3)
    metrics.weight_version.set(4)
    metrics.reward_error("timeout")
    got = samples(metrics.registry)
    assert got[("asyncrl_rollout_groups_written_total", (("replica", "replica-0"),))] == 3
    assert got[("asyncrl_rollout_reward_errors_total", (("kind", "timeout"), ("replica", "replica-0")))] == 1
    metrics.bind("replica-7")  # the controller gave another id: the series move, counts carry over
    metrics.groups_written.inc()
    got = samples(metrics.registry)
    assert got[("asyncrl_rollout_groups_written_total", (("replica", "replica-7"),))] == 4
    assert got[("asyncrl_rollout_weight_version", (("replica", "replica-7"),))] == 4
    assert not any(dict(labels).get("replica") == "replica-0" and name.startswith("asyncrl_rollout_groups")
                   for name, labels in got)


def test_learner_step_series():
    metrics = LearnerMetrics()
    step = {"batch/sequences": 4, "batch/response_tokens": 37, "reward/mean": 0.5, "staleness/mean": 0.75,
            "staleness/hist": {"0": 2, "1": 1, "2": 1}, "time/step_s": 0.1, "time/busy": 0.8, "rc/kl_k3": 0.01,
            "rc/ratio_max": 1.5, "loss/clip_frac": 0.25, "opt/grad_norm": 2.0, "reward/max": 1.0,
            "routing/per_layer": [0.1, 0.2]}
    push = SimpleNamespace(version=3, total_s=0.05, bytes_sent=2_000_000, new_group=True)
    now = time.time()
    metrics.observe_push(push)
    metrics.observe_step(step, 3, 0.002, [now - 2.0, now - 0.3])
    metrics.observe_buffer(backlog=5, pending=4)
    got = samples(metrics.registry)
    assert got[("asyncrl_learner_tokens_trained_total", ())] == 37
    assert got[("asyncrl_learner_push_bytes_total", ())] == 2_000_000
    assert got[("asyncrl_learner_broadcast_groups_formed_total", ())] == 1
    assert got[("asyncrl_learner_push_wait_seconds_count", ())] == 1
    # Staleness 0, 0, 1, 2: cumulative buckets le=0 -> 2, le=1 -> 3, le=2 -> 4; sum 3.
    assert got[("asyncrl_learner_staleness_versions_bucket", (("le", "0.0"),))] == 2
    assert got[("asyncrl_learner_staleness_versions_bucket", (("le", "1.0"),))] == 3
    assert got[("asyncrl_learner_staleness_versions_bucket", (("le", "2.0"),))] == 4
    assert got[("asyncrl_learner_staleness_versions_sum", ())] == 3
    assert got[("asyncrl_learner_group_age_seconds_count", ())] == 2
    assert got[("asyncrl_learner_group_age_seconds_bucket", (("le", "0.5"),))] == 1
    assert got[("asyncrl_buffer_backlog_groups", ())] == 5
    assert got[("asyncrl_buffer_pending_groups", ())] == 4
    assert got[("asyncrl_learner_busy_ratio", ())] == 0.8
    for name, value in {"rc/kl_k3": 0.01, "rc/ratio_max": 1.5, "loss/clip_frac": 0.25, "opt/grad_norm": 2.0}.items():
        assert got[("asyncrl_learner_diagnostic", (("name", name),))] == value
    # Only the diagnostic families; a per-layer list is not a scalar.
    names = {dict(labels)["name"] for n, labels in got if n == "asyncrl_learner_diagnostic"}
    assert names == {"rc/kl_k3", "rc/ratio_max", "loss/clip_frac", "opt/grad_norm"}


def test_every_series_of_a_named_run_carries_its_run_label():
    """`run_name` (each run of `runs:`): the label on every series, the filtered /metrics?name[]= included."""
    metrics = LearnerMetrics("lr-2e-4")
    metrics.step.set(3)
    labelled = samples(metrics.registry)
    assert labelled[("asyncrl_learner_step", (("run", "lr-2e-4"),))] == 3
    assert all(dict(labels).get("run") == "lr-2e-4" for _, labels in labelled)
    wanted = generate_latest(metrics.registry.restricted_registry(["asyncrl_learner_step"])).decode()
    assert [line for line in wanted.splitlines() if not line.startswith("#")] == [
        'asyncrl_learner_step{run="lr-2e-4"} 3.0']
    assert all("run" not in dict(labels) for _, labels in samples(service_registry("learner")))
