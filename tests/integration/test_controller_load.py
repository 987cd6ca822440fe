"""Five hundred simulated replicas against one controller, most of them held by the staleness bound: held calls
take no thread (the controller is an asyncio server), so heartbeats stay fast, and N_r stays exact.

Five hundred, not the benchmark's thousand (bench/controller_leases.py): the load runs in one Python process,
and on CI's 2-core AVX2 machine a thousand saturate its own loop (fewer heartbeats in all than five hundred
send, p99 5.2 s), which then measures the load, not the controller."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.core.runtime.events import read_records
from asyncrl.tools.audit import AuditReport, check_eta
from asyncrl.tools.lease_load import controller_process, run_load
from tests.conftest import TEST_AUTH, TEST_LEARNER_SECRET

REPLICAS, SECONDS = 500, 15.0


@pytest.mark.alone  # it asserts a latency: a whole-system test beside it (four runs' processes) moved it past
def test_hundreds_of_held_replicas_leave_heartbeats_responsive_and_admission_exact(tmp_path):
    raw = {"run_dir": str(tmp_path), "learner": {"batch_size": 64}, "sampling": {"group_size": 8},
           "controller": {"port": 0, "status_port": 0, "eta": 2, "state_store": "none", "max_replicas": 2048,
                          "max_replicas_per_host": 0}}  # every simulated replica calls from this host
    with controller_process(raw) as port:
        result = asyncio.run(run_load(f"127.0.0.1:{port}", TEST_AUTH, replicas=REPLICAS, seconds=SECONDS,
                                      group_size=8, push_every_s=1.0, learner_secret=TEST_LEARNER_SECRET))
    summary = result.summary()
    print(summary)
    assert result.heartbeat_errors == 0 and result.acquire_errors == 0, summary
    # Every replica kept beating, none far behind the others. The schedule is one a second each, but the load's
    # own loop sets the pace: 11 a replica in 15 s at 500 replicas on CI's AVX2 machine, 3.5 at 1000. So the
    # bar is a share of the mean, not of the schedule: a starved replica falls far behind its peers anywhere.
    assert len(result.heartbeats_by_replica) == REPLICAS, summary
    mean = summary["heartbeats"] / REPLICAS
    assert summary["fewest_heartbeats_of_a_replica"] >= max(2, 0.5 * mean), summary
    assert result.max_held >= 0.9 * REPLICAS, summary  # most requests were held
    # Responsive, not fast: a heartbeat starved behind the held requests would wait out their hold
    # (controller.max_hold_s, 5 s). The 100 ms target is the benchmark's (bench/controller_leases.py, 39 ms
    # measured); a timed test on a shared CI machine only guards against starvation. The p99 here includes the
    # load's own loop: at a thousand replicas, 620-1230 ms in six runs on a 2-core Zen 4 machine; at five
    # hundred, 823 ms on the AVX2 one.
    assert summary["heartbeat_p99_ms"] < 2500, summary
    # Exact admission: N_r equals what the replicas were granted (all completed in full), and every grant in
    # the controller's log obeyed floor((N_r - 1) / B) <= i + η.
    assert result.final_admitted == result.granted_trajectories, summary
    # Versions keep being committed under the load (each one re-opens admission): progress, not a rate. The
    # simulated learner pushes every second from the same event loop as the thousand replicas, which falls
    # behind on a slow sitting: 4-6 commits in 15 s in six runs alone on the 2-core Zen 4 machine one evening,
    # with and without the status fields of that day's change (and 4 once in a full suite).
    assert result.versions_committed >= 3 and result.grants > 0, summary
    report = AuditReport()
    check_eta(report, read_records(tmp_path, "controller"))
    assert report.leases_granted == result.grants and not report.eta_violations


def test_replicas_asking_for_several_leases_per_call_keep_admission_exact(tmp_path):
    """As the real replicas ask: up to 4 leases per AcquireLeases, completed in one CompleteLeases; under η = 1
    with a version a second, every lease the log shows obeyed the rule and N_r equals what was granted."""
    raw = {"run_dir": str(tmp_path), "learner": {"batch_size": 64}, "sampling": {"group_size": 8},
           "controller": {"port": 0, "status_port": 0, "eta": 1, "state_store": "none"}}
    with controller_process(raw) as port:
        result = asyncio.run(run_load(f"127.0.0.1:{port}", TEST_AUTH, replicas=16, seconds=4.0, group_size=8,
                                      push_every_s=0.5, wait_s=1.0, leases_per_call=4,
                                      learner_secret=TEST_LEARNER_SECRET))
    summary = result.summary()
    print(summary)
    assert result.heartbeat_errors == 0 and result.acquire_errors == 0, summary
    assert result.grants > len(result.grant_latencies_s), summary  # several leases per granted call
    assert result.final_admitted == result.granted_trajectories, summary
    report = AuditReport()
    check_eta(report, read_records(tmp_path, "controller"))
    assert report.leases_granted == result.grants and not report.eta_violations
